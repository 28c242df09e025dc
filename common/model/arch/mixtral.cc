// Mixtral (Hugging Face's MixtralForCausalLM): grouped-query attention without bias, over a
// sliding window in every layer where sliding_window is set, every layer an MoE whose top-k
// weights are renormalised (a softmax over the chosen logits).
#include "common/model/arch/recipes.h"
#include "common/util/status.h"

namespace tandem::model {
namespace {

absl::Status Recipe(const ConfigReader& json, ModelConfig* c) {
  c->norm_topk_prob = true;
  RETURN_IF_ERROR(arch::NoAttentionBias(json, c));
  RETURN_IF_ERROR(arch::NoSharedExperts(json, c));
  RETURN_IF_ERROR(arch::NoDenseLayers(json, c));
  return arch::SlidingWindowEveryLayer(c);
}

constexpr ArchitectureSpec kMixtral{
    .model_type = "mixtral",
    .num_experts_key = "num_local_experts",
    .intermediate_size_key = "intermediate_size",
    .default_rope_theta = 1e6,
    .default_rms_norm_eps = 1e-5,
    .default_use_sliding_window = true,
    .tensor_names = arch::TensorNames(
        {arch::kDecoderNames},
        {
            {TensorKind::kRouter, "model.layers.{layer}.block_sparse_moe.gate.weight"},
            {TensorKind::kExpertGate,
             "model.layers.{layer}.block_sparse_moe.experts.{expert}.w1.weight"},
            {TensorKind::kExpertUp,
             "model.layers.{layer}.block_sparse_moe.experts.{expert}.w3.weight"},
            {TensorKind::kExpertDown,
             "model.layers.{layer}.block_sparse_moe.experts.{expert}.w2.weight"},
        }),
    .recipe = Recipe,
};

}  // namespace

const ArchitectureSpec& MixtralArchitecture() { return kMixtral; }

}  // namespace tandem::model
