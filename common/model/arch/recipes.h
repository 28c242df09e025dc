// The steps architecture recipes are written from (common/model/arch/<model_type>.cc): each
// reads one family of config.json keys the way Hugging Face's modeling code does, into the
// generic ModelConfig, and refuses, naming the key, what the architecture does not have.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/config_reader.h"

namespace tandem::model::arch {

constexpr std::array<std::string_view, kNumTensorKinds> TensorNames(
    std::initializer_list<std::pair<TensorKind, std::string_view>> entries) {
  std::array<std::string_view, kNumTensorKinds> names{};
  for (const auto& [kind, pattern] : entries) names[static_cast<int>(kind)] = pattern;
  return names;
}

// norm_topk_prob from `key`, `fallback` when absent.
absl::Status NormTopkProb(const ConfigReader& json, bool fallback, ModelConfig* c);

// Attention projections' bias from `key` (default `fallback`): q, k and v, and o too where
// `covers_output`. Any other architecture's "attention_bias" that is true is refused.
absl::Status AttentionBias(const ConfigReader& json, std::string_view key, bool fallback,
                           bool covers_output, ModelConfig* c);
// Refuses a true "attention_bias", naming the architecture.
absl::Status NoAttentionBias(const ConfigReader& json, ModelConfig* c);

// The shared expert's width from `key` (absent or 0: none; negative refused); `gated`: scaled
// by sigmoid(shared_expert_gate . x).
absl::Status SharedExpert(const ConfigReader& json, std::string_view key, bool gated,
                          ModelConfig* c);
// Refuses shared_expert_intermediate_size / n_shared_experts other than 0.
absl::Status NoSharedExperts(const ConfigReader& json, ModelConfig* c);

// Which layers are MoE (true) and the key that made any dense, to name in errors.
struct SparseLayers {
  std::vector<bool> sparse;
  std::string_view rule_key;
};
// Qwen's rule (Hugging Face's Qwen MoE decoder layers): layer l is MoE iff l is not in
// mlp_only_layers and (l + 1) % decoder_sparse_step == 0.
absl::StatusOr<SparseLayers> QwenSparseLayers(const ConfigReader& json, const ModelConfig& c);

// Sets layer_specs from `layers`: when some layer is dense, its MLP width comes from
// `dense_width_key`; the rule's key is named if every layer is dense (a dense model is not an
// MoE) or if the architecture has no dense layers (`dense_width_key` empty).
absl::Status SetDenseLayers(const ConfigReader& json, const SparseLayers& layers,
                            std::string_view dense_width_key, ModelConfig* c);

// Refuses decoder_sparse_step / mlp_only_layers that would make a dense layer (every layer an
// MoE).
absl::Status NoDenseLayers(const ConfigReader& json, ModelConfig* c);

}  // namespace tandem::model::arch
