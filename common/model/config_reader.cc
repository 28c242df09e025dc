#include "common/model/config_reader.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status.h"

namespace tandem::model {

using Json = nlohmann::json;

absl::Status FieldError(std::string_view field, std::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: field '", Sv(field), "' ", Sv(problem)));
}

const Json* ConfigReader::Find(std::string_view key) const {
  auto it = root_.find(key);
  if (it == root_.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<int64_t> ConfigReader::ToInt(const Json& v, std::string_view key) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FieldError(key, "is out of range");
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return FieldError(key, absl::StrCat("must be an integer, got ", v.type_name()));
}

absl::StatusOr<int64_t> ConfigReader::CheckSize(std::string_view key, int64_t value, int64_t max) {
  if (value <= 0) return FieldError(key, absl::StrCat("must be positive, got ", value));
  if (value > max) return FieldError(key, absl::StrCat("is too large: ", value, " > ", max));
  return value;
}

absl::StatusOr<int64_t> ConfigReader::RequiredInt(std::string_view key) const {
  const Json* v = Find(key);
  if (v == nullptr) return FieldError(key, "is required but missing");
  return ToInt(*v, key);
}

absl::StatusOr<int64_t> ConfigReader::OptionalInt(std::string_view key, int64_t fallback) const {
  const Json* v = Find(key);
  if (v == nullptr) return fallback;
  return ToInt(*v, key);
}

absl::StatusOr<double> ConfigReader::OptionalDouble(std::string_view key, double fallback) const {
  const Json* v = Find(key);
  if (v == nullptr) return fallback;
  if (!v->is_number()) {
    return FieldError(key, absl::StrCat("must be a number, got ", v->type_name()));
  }
  return v->get<double>();
}

absl::StatusOr<bool> ConfigReader::OptionalBool(std::string_view key, bool fallback) const {
  const Json* v = Find(key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) {
    return FieldError(key, absl::StrCat("must be a boolean, got ", v->type_name()));
  }
  return v->get<bool>();
}

absl::StatusOr<std::string> ConfigReader::OptionalString(std::string_view key,
                                                         std::string fallback) const {
  const Json* v = Find(key);
  if (v == nullptr) return fallback;
  if (!v->is_string()) {
    return FieldError(key, absl::StrCat("must be a string, got ", v->type_name()));
  }
  return v->get<std::string>();
}

absl::StatusOr<int64_t> ConfigReader::RequiredSize(std::string_view key, int64_t max) const {
  ASSIGN_OR_RETURN(int64_t value, RequiredInt(key));
  return CheckSize(key, value, max);
}

absl::StatusOr<std::vector<int64_t>> ConfigReader::LayerList(std::string_view key,
                                                             int64_t layers) const {
  std::vector<int64_t> out;
  const Json* v = Find(key);
  if (v == nullptr) return out;
  if (!v->is_array()) return FieldError(key, "must be an array of layer indices");
  for (const Json& e : *v) {
    ASSIGN_OR_RETURN(int64_t l, ToInt(e, key));
    if (l < 0 || l >= layers) {
      return FieldError(key, absl::StrCat("names layer ", l, ", outside [0, ", layers, ")"));
    }
    out.push_back(l);
  }
  return out;
}

}  // namespace tandem::model
