// gpt-oss (Hugging Face's GptOssForCausalLM, model_type "gpt_oss"): grouped-query attention with
// biases on q, k, v and o (attention_bias, default true) and a learned sink logit per head in
// every softmax; a sliding window (sliding_window, default 128) on the layers layer_types calls
// "sliding_attention" (default: the even ones); YaRN RoPE whose attention factor scales cos and
// sin. Every layer an MoE: a router with bias whose top-k logits are softmaxed (the renormalised
// softmax of them all), experts with biases and the clamped SwiGLU (swiglu_limit, default 7),
// stored stacked as x @ W with gate and up in alternate columns (mlp.experts.gate_up_proj,
// down_proj and their _bias), or, as published, their matrices in MXFP4 (quant_method "mxfp4").
#include <cmath>
#include <utility>
#include <vector>

#include "common/model/arch/recipes.h"
#include "common/util/status.h"

namespace tandem::model {
namespace {

absl::Status Recipe(const ConfigReader& json, ModelConfig* c) {
  c->norm_topk_prob = true;
  c->router.logit_bias = true;
  c->attention_sinks = true;
  c->expert_bias = true;
  ASSIGN_OR_RETURN(c->swiglu_limit, json.OptionalDouble("swiglu_limit", 7.0));
  if (!(c->swiglu_limit > 0) || !std::isfinite(c->swiglu_limit)) {
    return FieldError("swiglu_limit", "must be a positive number");
  }
  RETURN_IF_ERROR(arch::AttentionBias(json, "attention_bias", /*fallback=*/true,
                                      /*covers_output=*/true, c));
  RETURN_IF_ERROR(arch::NoSharedExperts(json, c));
  RETURN_IF_ERROR(arch::NoDenseLayers(json, c));
  if (!json.Contains("sliding_window")) c->sliding_window = 128;  // GptOssConfig's default
  std::vector<bool> even(c->num_hidden_layers);
  for (int64_t l = 0; l < c->num_hidden_layers; ++l) even[l] = l % 2 == 0;
  return arch::LayerTypeWindows(json, std::move(even), c);
}

#define GPT_OSS_EXPERT(name) "model.layers.{layer}.mlp.experts.{expert}." name
constexpr ArchitectureSpec kGptOss{
    .model_type = "gpt_oss",
    .num_experts_key = "num_local_experts",
    .intermediate_size_key = "intermediate_size",
    .default_rope_theta = 150000.0,
    .default_rms_norm_eps = 1e-5,
    .default_use_sliding_window = true,
    .tensor_names = arch::TensorNames(
        {arch::kDecoderNames, arch::kQkvBiasNames, arch::kOutBiasNames},
        {
            {TensorKind::kAttnSinks, "model.layers.{layer}.self_attn.sinks"},
            {TensorKind::kRouter, "model.layers.{layer}.mlp.router.weight"},
            {TensorKind::kRouterBias, "model.layers.{layer}.mlp.router.bias"},
            {TensorKind::kExpertsGateUp, "model.layers.{layer}.mlp.experts.gate_up_proj"},
            {TensorKind::kExpertsDown, "model.layers.{layer}.mlp.experts.down_proj"},
            {TensorKind::kExpertsGateUpBias, "model.layers.{layer}.mlp.experts.gate_up_proj_bias"},
            {TensorKind::kExpertsDownBias, "model.layers.{layer}.mlp.experts.down_proj_bias"},
            // One tensor an expert, as tandem quantize and reorder write stacked experts.
            {TensorKind::kExpertGate, GPT_OSS_EXPERT("gate_proj.weight")},
            {TensorKind::kExpertUp, GPT_OSS_EXPERT("up_proj.weight")},
            {TensorKind::kExpertDown, GPT_OSS_EXPERT("down_proj.weight")},
            {TensorKind::kExpertGateBias, GPT_OSS_EXPERT("gate_proj.bias")},
            {TensorKind::kExpertUpBias, GPT_OSS_EXPERT("up_proj.bias")},
            {TensorKind::kExpertDownBias, GPT_OSS_EXPERT("down_proj.bias")},
        }),
    .stacked_interleaved = true,
    .recipe = Recipe,
};
#undef GPT_OSS_EXPERT

}  // namespace

const ArchitectureSpec& GptOssArchitecture() { return kGptOss; }

}  // namespace tandem::model
