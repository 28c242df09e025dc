// Qwen2-MoE (Qwen1.5-MoE; Hugging Face's Qwen2MoeForCausalLM): q/k/v bias (qkv_bias, default
// true), an always-on shared expert scaled by sigmoid(shared_expert_gate . x), top-k
// renormalisation by norm_topk_prob (default false), dense MLP layers by decoder_sparse_step /
// mlp_only_layers, a sliding window (use_sliding_window) on the layers layer_types or
// max_window_layers (default 28) say.
#include "common/model/arch/recipes.h"
#include "common/util/status.h"

namespace tandem::model {
namespace {

absl::Status Recipe(const ConfigReader& json, ModelConfig* c) {
  RETURN_IF_ERROR(arch::NormTopkProb(json, /*fallback=*/false, c));
  RETURN_IF_ERROR(
      arch::AttentionBias(json, "qkv_bias", /*fallback=*/true, /*covers_output=*/false, c));
  RETURN_IF_ERROR(arch::SharedExpert(json, "shared_expert_intermediate_size", /*gated=*/true, c));
  ASSIGN_OR_RETURN(arch::SparseLayers layers, arch::QwenSparseLayers(json, *c));
  RETURN_IF_ERROR(arch::SetDenseLayers(json, layers, "intermediate_size", c));
  return arch::QwenSlidingWindows(json, /*max_window_layers=*/28, c);
}

constexpr ArchitectureSpec kQwen2Moe{
    .model_type = "qwen2_moe",
    .num_experts_key = "num_experts",
    .intermediate_size_key = "moe_intermediate_size",
    .default_rope_theta = 10000.0,
    .default_rms_norm_eps = 1e-6,
    .default_use_sliding_window = false,
    .tensor_names = arch::TensorNames(
        {arch::kDecoderNames, arch::kQkvBiasNames, arch::kMlpNames},
        {
            {TensorKind::kSharedGate, "model.layers.{layer}.mlp.shared_expert.gate_proj.weight"},
            {TensorKind::kSharedUp, "model.layers.{layer}.mlp.shared_expert.up_proj.weight"},
            {TensorKind::kSharedDown, "model.layers.{layer}.mlp.shared_expert.down_proj.weight"},
            {TensorKind::kSharedExpertGate, "model.layers.{layer}.mlp.shared_expert_gate.weight"},
        }),
    .recipe = Recipe,
};

}  // namespace

const ArchitectureSpec& Qwen2MoeArchitecture() { return kQwen2Moe; }

}  // namespace tandem::model
