// Typed reads from a config.json object, for the generic parser (config.cc) and the
// architectures' recipes (common/model/arch): every problem is an INVALID_ARGUMENT naming the
// field ("config.json: field 'x' ..."); a key that is null reads as absent, as Hugging Face's
// configs treat it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::model {

// The installed Abseil's string_view is its own type, not std::string_view; absl::StrCat and
// friends need it.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Bounds far above any real model; they keep shape products inside int64 and the expected
// tensor list finite for hostile configs.
inline constexpr int64_t kMaxDim = int64_t{1} << 31;
inline constexpr int64_t kMaxLayers = 1024;
inline constexpr int64_t kMaxExperts = 4096;

// "config.json: field '<field>' <problem>".
absl::Status FieldError(std::string_view field, std::string_view problem);

class ConfigReader {
 public:
  explicit ConfigReader(const nlohmann::json& root) : root_(root) {}

  // The value, or null when the key is absent or null.
  const nlohmann::json* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }
  // Whether the key is there at all, null or not (where Hugging Face's default differs from
  // null's meaning).
  bool Contains(std::string_view key) const { return root_.contains(key); }

  absl::StatusOr<int64_t> RequiredInt(std::string_view key) const;
  absl::StatusOr<int64_t> OptionalInt(std::string_view key, int64_t fallback) const;
  absl::StatusOr<double> OptionalDouble(std::string_view key, double fallback) const;
  absl::StatusOr<bool> OptionalBool(std::string_view key, bool fallback) const;
  // A string value, or `fallback` when absent.
  absl::StatusOr<std::string> OptionalString(std::string_view key, std::string fallback) const;
  // A size field: present, positive and at most `max`.
  absl::StatusOr<int64_t> RequiredSize(std::string_view key, int64_t max = kMaxDim) const;
  // An array of layer indices in [0, layers); empty when absent.
  absl::StatusOr<std::vector<int64_t>> LayerList(std::string_view key, int64_t layers) const;

  // `value` converted, or an error naming `key`.
  static absl::StatusOr<int64_t> ToInt(const nlohmann::json& value, std::string_view key);
  // `value` when positive and at most `max`, or an error naming `key`.
  static absl::StatusOr<int64_t> CheckSize(std::string_view key, int64_t value,
                                           int64_t max = kMaxDim);

 private:
  const nlohmann::json& root_;
};

}  // namespace tandem::model
