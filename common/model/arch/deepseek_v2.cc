// DeepSeek-V2 (Hugging Face's DeepseekV2ForCausalLM, model_type "deepseek_v2", e.g.
// DeepSeek-V2-Lite): multi-head latent attention in every layer (recipes.h LatentAttention: a
// latent of kv_lora_rank and one rotary key of qk_rope_head_dim cached a token, rotary pairs
// interleaved, YaRN's mscale_all_dim in the softmax scale), then DeepSeek's MoE layout
// (ungated shared experts, first_k_dense_replace dense layers). The router: softmax over
// n_routed_experts, top-k greedy ("greedy") or within the best topk_group of n_group groups,
// each scored by its best expert ("group_limited_greedy"); weights not renormalised, times
// routed_scaling_factor (Hugging Face's DeepseekV2Moe; a true norm_topk_prob, which it ignores,
// is refused).
#include "absl/strings/str_cat.h"
#include "common/model/arch/recipes.h"
#include "common/util/status.h"

namespace tandem::model {
namespace {

absl::Status Recipe(const ConfigReader& json, ModelConfig* c) {
  ASSIGN_OR_RETURN(std::string scoring, json.OptionalString("scoring_func", "softmax"));
  if (scoring != "softmax") {
    return FieldError(
        "scoring_func",
        absl::StrCat("\"", scoring, "\" is not supported (deepseek_v2: \"softmax\")"));
  }
  ASSIGN_OR_RETURN(bool norm, json.OptionalBool("norm_topk_prob", false));
  if (norm) {
    return FieldError("norm_topk_prob",
                      "true is not supported for deepseek_v2 (its weights are the softmax's, "
                      "times routed_scaling_factor)");
  }
  c->norm_topk_prob = false;
  ASSIGN_OR_RETURN(std::string method, json.OptionalString("topk_method", "greedy"));
  RETURN_IF_ERROR(arch::DeepseekGroups(json, c));
  if (method == "greedy") {
    c->router.groups = c->router.top_groups = 1;
  } else if (method != "group_limited_greedy") {
    return FieldError("topk_method", absl::StrCat("\"", method,
                                                  "\" is not supported (deepseek_v2: \"greedy\", "
                                                  "\"group_limited_greedy\")"));
  }
  RETURN_IF_ERROR(arch::DeepseekLayers(json, c));
  return arch::LatentAttention(json, c);
}

constexpr ArchitectureSpec kDeepseekV2{
    .model_type = "deepseek_v2",
    .num_experts_key = "n_routed_experts",
    .intermediate_size_key = "moe_intermediate_size",
    .default_rope_theta = 10000.0,
    .default_rms_norm_eps = 1e-6,
    .default_use_sliding_window = false,
    .tensor_names = arch::TensorNames({arch::kDecoderNames, arch::kLatentAttentionNames,
                                       arch::kMlpNames, arch::kDeepseekSharedNames},
                                      {}),
    .recipe = Recipe,
};

}  // namespace

const ArchitectureSpec& DeepseekV2Architecture() { return kDeepseekV2; }

}  // namespace tandem::model
