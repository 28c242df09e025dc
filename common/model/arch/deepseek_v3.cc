// DeepSeek-V3 (Hugging Face's DeepseekV3ForCausalLM, model_type "deepseek_v3"; Kimi K2 and
// Moonlight reuse it): DeepSeek-V2's latent attention and MoE layout, with the router of
// DeepseekV3TopkRouter: sigmoid scores over n_routed_experts; experts chosen by score +
// e_score_correction_bias (mlp.gate.e_score_correction_bias) within the best topk_group of
// n_group groups, each group scored by its best two ("noaux_tc"); weights the chosen scores,
// renormalised where norm_topk_prob says (default true), times routed_scaling_factor.
// rope_interleave (default true) must stay true. The multi-token-prediction layers
// (num_nextn_predict_layers, stored as model.layers.{num_hidden_layers}.*) are not run: their
// tensors are skipped.
#include "absl/strings/str_cat.h"
#include "common/model/arch/recipes.h"
#include "common/util/status.h"

namespace tandem::model {
namespace {

absl::Status Recipe(const ConfigReader& json, ModelConfig* c) {
  ASSIGN_OR_RETURN(std::string scoring, json.OptionalString("scoring_func", "sigmoid"));
  if (scoring != "sigmoid") {
    return FieldError(
        "scoring_func",
        absl::StrCat("\"", scoring, "\" is not supported (deepseek_v3: \"sigmoid\")"));
  }
  ASSIGN_OR_RETURN(std::string method, json.OptionalString("topk_method", "noaux_tc"));
  if (method != "noaux_tc") {
    return FieldError(
        "topk_method",
        absl::StrCat("\"", method, "\" is not supported (deepseek_v3: \"noaux_tc\")"));
  }
  ASSIGN_OR_RETURN(bool interleave, json.OptionalBool("rope_interleave", true));
  if (!interleave) {
    return FieldError("rope_interleave", "false is not supported (deepseek_v3 pairs interleave)");
  }
  RETURN_IF_ERROR(arch::NormTopkProb(json, /*fallback=*/true, c));
  c->router.sigmoid = true;
  c->router.selection_bias = true;
  c->router.group_top_two = true;
  RETURN_IF_ERROR(arch::DeepseekGroups(json, c));
  if (c->num_local_experts / c->router.groups < 2) {
    return FieldError("n_group",
                      "must leave at least two experts a group (a group scores its best two)");
  }
  RETURN_IF_ERROR(arch::DeepseekLayers(json, c));
  return arch::LatentAttention(json, c);
}

constexpr ArchitectureSpec kDeepseekV3{
    .model_type = "deepseek_v3",
    .num_experts_key = "n_routed_experts",
    .intermediate_size_key = "moe_intermediate_size",
    .default_rope_theta = 10000.0,
    .default_rms_norm_eps = 1e-6,
    .default_use_sliding_window = false,
    .tensor_names = arch::TensorNames(
        {arch::kDecoderNames, arch::kLatentAttentionNames, arch::kMlpNames,
         arch::kDeepseekSharedNames},
        {
            {TensorKind::kRouterBias, "model.layers.{layer}.mlp.gate.e_score_correction_bias"},
        }),
    .extra_layers_prefix = "model.layers.",
    .recipe = Recipe,
};

}  // namespace

const ArchitectureSpec& DeepseekV3Architecture() { return kDeepseekV3; }

}  // namespace tandem::model
