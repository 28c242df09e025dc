// Qwen3-MoE (Hugging Face's Qwen3MoeForCausalLM): per-head q/k RMSNorm, explicit head_dim,
// attention_bias on q, k, v and o (default false), top-k renormalisation by norm_topk_prob
// (default false), dense MLP layers by decoder_sparse_step / mlp_only_layers.
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
  return arch::SetDenseLayers(json, layers, "intermediate_size", c);
}

constexpr ArchitectureSpec kQwen3Moe{
    .model_type = "qwen3_moe",
    .num_experts_key = "num_experts",
    .intermediate_size_key = "moe_intermediate_size",
    .default_rope_theta = 10000.0,
    .default_rms_norm_eps = 1e-6,
    .default_use_sliding_window = false,
    .tensor_names = arch::TensorNames({
        {TensorKind::kTokenEmbedding, "model.embed_tokens.weight"},
        {TensorKind::kOutputNorm, "model.norm.weight"},
        {TensorKind::kOutput, "lm_head.weight"},
        {TensorKind::kAttnNorm, "model.layers.{layer}.input_layernorm.weight"},
        {TensorKind::kAttnQ, "model.layers.{layer}.self_attn.q_proj.weight"},
        {TensorKind::kAttnK, "model.layers.{layer}.self_attn.k_proj.weight"},
        {TensorKind::kAttnV, "model.layers.{layer}.self_attn.v_proj.weight"},
        {TensorKind::kAttnOut, "model.layers.{layer}.self_attn.o_proj.weight"},
        {TensorKind::kAttnQNorm, "model.layers.{layer}.self_attn.q_norm.weight"},
        {TensorKind::kAttnKNorm, "model.layers.{layer}.self_attn.k_norm.weight"},
        {TensorKind::kAttnQBias, "model.layers.{layer}.self_attn.q_proj.bias"},
        {TensorKind::kAttnKBias, "model.layers.{layer}.self_attn.k_proj.bias"},
        {TensorKind::kAttnVBias, "model.layers.{layer}.self_attn.v_proj.bias"},
        {TensorKind::kAttnOutBias, "model.layers.{layer}.self_attn.o_proj.bias"},
        {TensorKind::kFfnNorm, "model.layers.{layer}.post_attention_layernorm.weight"},
        {TensorKind::kRouter, "model.layers.{layer}.mlp.gate.weight"},
        {TensorKind::kExpertGate, "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight"},
        {TensorKind::kExpertUp, "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight"},
        {TensorKind::kExpertDown, "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"},
        {TensorKind::kDenseGate, "model.layers.{layer}.mlp.gate_proj.weight"},
        {TensorKind::kDenseUp, "model.layers.{layer}.mlp.up_proj.weight"},
        {TensorKind::kDenseDown, "model.layers.{layer}.mlp.down_proj.weight"},
    }),
    .recipe = Recipe,
};

}  // namespace

const ArchitectureSpec& Qwen3MoeArchitecture() { return kQwen3Moe; }

}  // namespace tandem::model
