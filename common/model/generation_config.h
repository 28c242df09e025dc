// generation_config.json of a Hugging Face model directory: the sampling defaults its authors
// publish and the tokens that end a reply. As vLLM does, the defaults apply where a request
// is silent, and every eos_token_id ends a generation (unless the request ignores EOS).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::model {

struct GenerationDefaults {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> top_k;
  std::optional<double> repetition_penalty;
  std::optional<int> max_new_tokens;
  // eos_token_id: one id or a list (Qwen3: <|im_end|> and <|endoftext|>).
  std::vector<int32_t> eos_token_ids;
  // transformers' stop_strings: Tandem ends chat replies at them (the shipped tiny models,
  // which write a chat as quoted dialogue, end a reply at its closing quote).
  std::vector<std::string> stop_strings;
};

// Parses a generation_config.json document; INVALID_ARGUMENT naming the key that is wrong.
// Keys Tandem does not use (do_sample, bos_token_id, ...) are ignored.
absl::StatusOr<GenerationDefaults> ParseGenerationConfig(const std::string& json);

}  // namespace tandem::model
