// DeepSeek-MoE (deepseek-ai's DeepseekForCausalLM, model_type "deepseek", e.g.
// deepseek-moe-16b): n_routed_experts of width moe_intermediate_size chosen by a softmax top-k
// (scoring_func "softmax"), renormalised only where norm_topk_prob says (default false);
// n_shared_experts always-on experts stored as one MLP of n_shared_experts *
// moe_intermediate_size (mlp.shared_experts) and added without a gate; layer l is MoE iff
// l >= first_k_dense_replace and l % moe_layer_freq == 0, else a dense MLP of
// intermediate_size; plain attention with attention_bias on q, k, v and o (default false).
#include "absl/strings/str_cat.h"
#include "common/model/arch/recipes.h"
#include "common/util/status.h"

namespace tandem::model {
namespace {

absl::Status Recipe(const ConfigReader& json, ModelConfig* c) {
  ASSIGN_OR_RETURN(std::string scoring, json.OptionalString("scoring_func", "softmax"));
  if (scoring != "softmax") {
    return FieldError("scoring_func",
                      absl::StrCat("\"", scoring, "\" is not supported (deepseek: \"softmax\")"));
  }
  RETURN_IF_ERROR(arch::NormTopkProb(json, /*fallback=*/false, c));
  RETURN_IF_ERROR(arch::AttentionBias(json, "attention_bias", /*fallback=*/false,
                                      /*covers_output=*/true, c));
  return arch::DeepseekLayers(json, c);
}

constexpr ArchitectureSpec kDeepseek{
    .model_type = "deepseek",
    .num_experts_key = "n_routed_experts",
    .intermediate_size_key = "moe_intermediate_size",
    .default_rope_theta = 10000.0,
    .default_rms_norm_eps = 1e-6,
    .default_use_sliding_window = false,
    .tensor_names =
        arch::TensorNames({arch::kDecoderNames, arch::kQkvBiasNames, arch::kOutBiasNames,
                           arch::kMlpNames, arch::kDeepseekSharedNames},
                          {}),
    .recipe = Recipe,
};

}  // namespace

const ArchitectureSpec& DeepseekArchitecture() { return kDeepseek; }

}  // namespace tandem::model
