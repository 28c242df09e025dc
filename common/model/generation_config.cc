#include "common/model/generation_config.h"

#include <tuple>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem::model {
namespace {

using nlohmann::json;

absl::Status Invalid(const char* key, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("generation_config.json: ", key, " ", what));
}

bool IsTokenId(const json& value) {
  return value.is_number_integer() && value.get<int64_t>() >= 0 &&
         value.get<int64_t>() <= INT32_MAX;
}

}  // namespace

absl::StatusOr<GenerationDefaults> ParseGenerationConfig(const std::string& text) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("generation_config.json is not a JSON object");
  }
  GenerationDefaults out;
  for (const auto& [key, target, min, max] :
       {std::tuple{"temperature", &out.temperature, 0.0, 2.0},
        std::tuple{"top_p", &out.top_p, 0.0, 1.0},
        std::tuple{"repetition_penalty", &out.repetition_penalty, 0.0, 2.0}}) {
    const auto it = doc.find(key);
    if (it == doc.end() || it->is_null()) continue;
    if (!it->is_number()) return Invalid(key, "must be a number");
    const double v = it->get<double>();
    // top_p and repetition_penalty exclude 0 (vLLM's ranges).
    if (!(v >= min && v <= max) || (v == 0 && std::string(key) != "temperature")) {
      return Invalid(key, "is out of range");
    }
    *target = v;
  }
  for (const auto& [key, target, min] :
       {std::tuple{"top_k", &out.top_k, int64_t{0}},
        std::tuple{"max_new_tokens", &out.max_new_tokens, int64_t{1}}}) {
    const auto it = doc.find(key);
    if (it == doc.end() || it->is_null()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < min ||
        it->get<int64_t>() > (int64_t{1} << 30)) {
      return Invalid(key, "must be an integer in range");
    }
    *target = static_cast<int>(it->get<int64_t>());
  }
  if (out.top_k == 0) out.top_k.reset();  // 0 = off, as in transformers
  if (const auto it = doc.find("eos_token_id"); it != doc.end() && !it->is_null()) {
    if (IsTokenId(*it)) {
      out.eos_token_ids.push_back(it->get<int32_t>());
    } else if (it->is_array()) {
      for (const json& id : *it) {
        if (!IsTokenId(id)) return Invalid("eos_token_id", "must be a token id or a list of them");
        out.eos_token_ids.push_back(id.get<int32_t>());
      }
    } else {
      return Invalid("eos_token_id", "must be a token id or a list of them");
    }
  }
  if (const auto it = doc.find("stop_strings"); it != doc.end() && !it->is_null()) {
    const json list = it->is_string() ? json::array({*it}) : *it;
    if (!list.is_array()) return Invalid("stop_strings", "must be a string or a list of strings");
    for (const json& s : list) {
      if (!s.is_string() || s.get<std::string>().empty()) {
        return Invalid("stop_strings", "must hold non-empty strings");
      }
      out.stop_strings.push_back(s.get<std::string>());
    }
  }
  return out;
}

}  // namespace tandem::model
