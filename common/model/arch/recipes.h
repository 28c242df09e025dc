// The steps architecture recipes are written from (common/model/arch/<model_type>.cc): each
// reads one family of config.json keys the way Hugging Face's modeling code does, into the
// generic ModelConfig, and refuses, naming the key, what the architecture does not have.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/config_reader.h"

namespace tandem::model::arch {

using NamedTensor = std::pair<TensorKind, std::string_view>;

constexpr std::array<std::string_view, kNumTensorKinds> TensorNames(
    std::initializer_list<NamedTensor> entries) {
  std::array<std::string_view, kNumTensorKinds> names{};
  for (const auto& [kind, pattern] : entries) names[static_cast<int>(kind)] = pattern;
  return names;
}
// The table of `groups` of names (below), then `entries`.
constexpr std::array<std::string_view, kNumTensorKinds> TensorNames(
    std::initializer_list<std::span<const NamedTensor>> groups,
    std::initializer_list<NamedTensor> entries) {
  std::array<std::string_view, kNumTensorKinds> names = TensorNames(entries);
  for (std::span<const NamedTensor> group : groups) {
    for (const auto& [kind, pattern] : group) names[static_cast<int>(kind)] = pattern;
  }
  return names;
}

// Names Hugging Face's decoders share: the embedding, final norm and lm_head, a layer's two
// norms and its attention projections.
inline constexpr NamedTensor kDecoderNames[] = {
    {TensorKind::kTokenEmbedding, "model.embed_tokens.weight"},
    {TensorKind::kOutputNorm, "model.norm.weight"},
    {TensorKind::kOutput, "lm_head.weight"},
    {TensorKind::kAttnNorm, "model.layers.{layer}.input_layernorm.weight"},
    {TensorKind::kAttnQ, "model.layers.{layer}.self_attn.q_proj.weight"},
    {TensorKind::kAttnK, "model.layers.{layer}.self_attn.k_proj.weight"},
    {TensorKind::kAttnV, "model.layers.{layer}.self_attn.v_proj.weight"},
    {TensorKind::kAttnOut, "model.layers.{layer}.self_attn.o_proj.weight"},
    {TensorKind::kFfnNorm, "model.layers.{layer}.post_attention_layernorm.weight"},
};
// o_proj's bias.
inline constexpr NamedTensor kOutBiasNames[] = {
    {TensorKind::kAttnOutBias, "model.layers.{layer}.self_attn.o_proj.bias"},
};
// q, k and v projections' biases.
inline constexpr NamedTensor kQkvBiasNames[] = {
    {TensorKind::kAttnQBias, "model.layers.{layer}.self_attn.q_proj.bias"},
    {TensorKind::kAttnKBias, "model.layers.{layer}.self_attn.k_proj.bias"},
    {TensorKind::kAttnVBias, "model.layers.{layer}.self_attn.v_proj.bias"},
};
// An MoE under mlp (Qwen, DeepSeek): its router and experts, or a dense layer's MLP.
inline constexpr NamedTensor kMlpNames[] = {
    {TensorKind::kRouter, "model.layers.{layer}.mlp.gate.weight"},
    {TensorKind::kExpertGate, "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight"},
    {TensorKind::kExpertUp, "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight"},
    {TensorKind::kExpertDown, "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"},
    {TensorKind::kDenseGate, "model.layers.{layer}.mlp.gate_proj.weight"},
    {TensorKind::kDenseUp, "model.layers.{layer}.mlp.up_proj.weight"},
    {TensorKind::kDenseDown, "model.layers.{layer}.mlp.down_proj.weight"},
};

// Multi-head latent attention's tensors (DeepSeek-V2/V3).
inline constexpr NamedTensor kLatentAttentionNames[] = {
    {TensorKind::kAttnQA, "model.layers.{layer}.self_attn.q_a_proj.weight"},
    {TensorKind::kAttnQANorm, "model.layers.{layer}.self_attn.q_a_layernorm.weight"},
    {TensorKind::kAttnQB, "model.layers.{layer}.self_attn.q_b_proj.weight"},
    {TensorKind::kAttnKvA, "model.layers.{layer}.self_attn.kv_a_proj_with_mqa.weight"},
    {TensorKind::kAttnKvANorm, "model.layers.{layer}.self_attn.kv_a_layernorm.weight"},
    {TensorKind::kAttnKvB, "model.layers.{layer}.self_attn.kv_b_proj.weight"},
};
// DeepSeek's shared experts, one MLP (mlp.shared_experts).
inline constexpr NamedTensor kDeepseekSharedNames[] = {
    {TensorKind::kSharedGate, "model.layers.{layer}.mlp.shared_experts.gate_proj.weight"},
    {TensorKind::kSharedUp, "model.layers.{layer}.mlp.shared_experts.up_proj.weight"},
    {TensorKind::kSharedDown, "model.layers.{layer}.mlp.shared_experts.down_proj.weight"},
};

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

// The sliding window (ModelConfig::sliding_window, where use_sliding_window lets it) on the
// layers Hugging Face's code puts it on: every layer (Mixtral), or, as Qwen's configs say, the
// layers layer_types calls "sliding_attention", else those from max_window_layers on (default
// `max_window_layers`).
absl::Status SlidingWindowEveryLayer(ModelConfig* c);
absl::Status QwenSlidingWindows(const ConfigReader& json, int64_t max_window_layers,
                                ModelConfig* c);
// The sliding window on the layers layer_types calls "sliding_attention" (each must say that or
// "full_attention"), else on those `sliding` marks.
absl::Status LayerTypeWindows(const ConfigReader& json, std::vector<bool> sliding, ModelConfig* c);

// DeepSeek's MoE layout (deepseek, deepseek_v2, deepseek_v3): n_shared_experts always-on
// experts stored as one MLP of n_shared_experts * the expert width, added without a gate; layer
// l an MoE iff l >= first_k_dense_replace and l % moe_layer_freq == 0, else a dense MLP of
// intermediate_size.
absl::Status DeepseekLayers(const ConfigReader& json, ModelConfig* c);

// Multi-head latent attention in every layer (DeepSeek-V2/V3), Hugging Face's defaults where a
// key is absent: q_lora_rank (null: q_proj reads the hidden state), kv_lora_rank,
// qk_nope_head_dim, qk_rope_head_dim (the rotary share, pairs interleaved), v_head_dim;
// rope_scaling's mscale_all_dim in the softmax scale. attention_bias is refused.
absl::Status LatentAttention(const ConfigReader& json, ModelConfig* c);

// DeepSeek's routed_scaling_factor (default 1) and, for group-limited choice, n_group and
// topk_group (both 1 when absent), which must split the experts evenly.
absl::Status DeepseekGroups(const ConfigReader& json, ModelConfig* c);

// Refuses decoder_sparse_step / mlp_only_layers that would make a dense layer (every layer an
// MoE).
absl::Status NoDenseLayers(const ConfigReader& json, ModelConfig* c);

}  // namespace tandem::model::arch
