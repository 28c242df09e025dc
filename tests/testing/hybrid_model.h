// A small hybrid model for the service tests: Qwen3.5-MoE's layout (three Gated DeltaNet layers,
// then gated attention; stacked experts; the published text_config nesting) with random
// weights (--load_format dummy) and the shipped tiny model's tokenizer, so real prompts run
// through prefill, the state handoff and decode.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/subprocess.h"

namespace tandem::testing {

// Writes the model's config.json into `dir` and links the tiny model's tokenizer files there.
inline void WriteDummyHybridModel(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path tiny = SourceDir() + "/models/tiny-moe";
  for (const char* file : {"tokenizer.model", "tokenizer_config.json", "generation_config.json"}) {
    fs::create_symlink(tiny / file, fs::path(dir) / file);
  }
  std::ofstream(fs::path(dir) / "config.json") << R"({
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
    "tie_word_embeddings": false,
    "text_config": {
      "model_type": "qwen3_5_moe_text", "vocab_size": 8192, "hidden_size": 64,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "shared_expert_intermediate_size": 32, "linear_num_key_heads": 2,
      "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
      "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "max_position_embeddings": 512,
      "bos_token_id": 1, "eos_token_id": 2, "rms_norm_eps": 1e-6,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                          "partial_rotary_factor": 0.25}}})";
}

// The flags every engine service of the model takes: the same random weights and routing.
inline std::vector<std::string> DummyHybridFlags(std::vector<std::string> flags = {}) {
  for (const char* flag : {"--load_format=dummy", "--routing=zipf:1", "--seed=7"}) {
    flags.push_back(flag);
  }
  return flags;
}

}  // namespace tandem::testing
