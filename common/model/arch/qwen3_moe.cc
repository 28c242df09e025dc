// Qwen3-MoE (Hugging Face's Qwen3MoeForCausalLM): per-head q/k RMSNorm, explicit head_dim,
// attention_bias on q, k, v and o (default false), top-k renormalisation by norm_topk_prob
// (default false), dense MLP layers by decoder_sparse_step / mlp_only_layers, a sliding window
// (use_sliding_window) on the layers layer_types or max_window_layers (default 28) say.
#include "common/model/arch/recipes.h"
#include "common/util/status.h"

namespace tandem::model {
namespace {

absl::Status Recipe(const ConfigReader& json, ModelConfig* c) {
  RETURN_IF_ERROR(arch::NormTopkProb(json, /*fallback=*/false, c));
  RETURN_IF_ERROR(arch::AttentionBias(json, "attention_bias", /*fallback=*/false,
                                      /*covers_output=*/true, c));
  RETURN_IF_ERROR(arch::NoSharedExperts(json, c));
  ASSIGN_OR_RETURN(arch::SparseLayers layers, arch::QwenSparseLayers(json, *c));
  RETURN_IF_ERROR(arch::SetDenseLayers(json, layers, "intermediate_size", c));
  return arch::QwenSlidingWindows(json, /*max_window_layers=*/28, c);
}

constexpr ArchitectureSpec kQwen3Moe{
    .model_type = "qwen3_moe",
    .num_experts_key = "num_experts",
    .intermediate_size_key = "moe_intermediate_size",
    .default_rope_theta = 10000.0,
    .default_rms_norm_eps = 1e-6,
    .default_use_sliding_window = false,
    .tensor_names = arch::TensorNames(
        {arch::kDecoderNames, arch::kQkvBiasNames, arch::kOutBiasNames, arch::kMlpNames},
        {
            {TensorKind::kAttnQNorm, "model.layers.{layer}.self_attn.q_norm.weight"},
            {TensorKind::kAttnKNorm, "model.layers.{layer}.self_attn.k_norm.weight"},
        }),
    .recipe = Recipe,
};

}  // namespace

const ArchitectureSpec& Qwen3MoeArchitecture() { return kQwen3Moe; }

}  // namespace tandem::model
