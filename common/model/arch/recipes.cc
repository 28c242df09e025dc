#include "common/model/arch/recipes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status.h"

namespace tandem::model::arch {

absl::Status NormTopkProb(const ConfigReader& json, bool fallback, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->norm_topk_prob, json.OptionalBool("norm_topk_prob", fallback));
  return absl::OkStatus();
}

absl::Status NoAttentionBias(const ConfigReader& json, ModelConfig* c) {
  ASSIGN_OR_RETURN(bool attention_bias, json.OptionalBool("attention_bias", false));
  if (attention_bias) {
    return FieldError("attention_bias", absl::StrCat("is not supported for ", Sv(c->model_type()),
                                                     " (must be false)"));
  }
  return absl::OkStatus();
}

absl::Status AttentionBias(const ConfigReader& json, std::string_view key, bool fallback,
                           bool covers_output, ModelConfig* c) {
  ASSIGN_OR_RETURN(bool bias, json.OptionalBool(key, fallback));
  c->attention_qkv_bias = bias;
  c->attention_out_bias = bias && covers_output;
  if (key != "attention_bias") return NoAttentionBias(json, c);
  return absl::OkStatus();
}

absl::Status SharedExpert(const ConfigReader& json, std::string_view key, bool gated,
                          ModelConfig* c) {
  ASSIGN_OR_RETURN(int64_t shared, json.OptionalInt(key, 0));
  if (shared < 0) return FieldError(key, "must not be negative");
  if (shared > 0) {
    ASSIGN_OR_RETURN(c->shared_expert_intermediate_size, ConfigReader::CheckSize(key, shared));
  }
  c->shared_expert_gated = gated;
  return absl::OkStatus();
}

absl::Status NoSharedExperts(const ConfigReader& json, ModelConfig* c) {
  for (std::string_view key : {"shared_expert_intermediate_size", "n_shared_experts"}) {
    ASSIGN_OR_RETURN(int64_t shared, json.OptionalInt(key, 0));
    if (shared != 0) {
      return FieldError(key, absl::StrCat("(shared experts) is not part of ", Sv(c->model_type())));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SparseLayers> QwenSparseLayers(const ConfigReader& json, const ModelConfig& c) {
  ASSIGN_OR_RETURN(int64_t sparse_step, json.OptionalInt("decoder_sparse_step", 1));
  if (sparse_step < 1) return FieldError("decoder_sparse_step", "must be at least 1");
  std::vector<bool> sparse(c.num_hidden_layers, true);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) sparse[l] = (l + 1) % sparse_step == 0;
  ASSIGN_OR_RETURN(std::vector<int64_t> dense,
                   json.LayerList("mlp_only_layers", c.num_hidden_layers));
  for (int64_t l : dense) sparse[l] = false;
  return SparseLayers{std::move(sparse),
                      sparse_step != 1 ? "decoder_sparse_step" : "mlp_only_layers"};
}

absl::Status SetDenseLayers(const ConfigReader& json, const SparseLayers& layers,
                            std::string_view dense_width_key, ModelConfig* c) {
  const std::vector<bool>& sparse = layers.sparse;
  const std::string_view dense_rule_key = layers.rule_key;
  if (std::find(sparse.begin(), sparse.end(), false) == sparse.end()) return absl::OkStatus();
  if (dense_width_key.empty()) {
    return FieldError(dense_rule_key, absl::StrCat("makes dense MLP layers, which ",
                                                   Sv(c->model_type()), " does not have"));
  }
  if (std::find(sparse.begin(), sparse.end(), true) == sparse.end()) {
    return FieldError(dense_rule_key, "leaves no MoE layer: a dense model is not supported");
  }
  ASSIGN_OR_RETURN(c->dense_intermediate_size, json.RequiredSize(dense_width_key));
  c->layer_specs.assign(sparse.size(), LayerSpec{});
  for (size_t l = 0; l < sparse.size(); ++l) {
    if (!sparse[l]) c->layer_specs[l].ffn = FfnKind::kDenseMlp;
  }
  return absl::OkStatus();
}

absl::Status NoDenseLayers(const ConfigReader& json, ModelConfig* c) {
  ASSIGN_OR_RETURN(SparseLayers layers, QwenSparseLayers(json, *c));
  // Without a dense width SetDenseLayers changes nothing: it accepts all-sparse or refuses.
  return SetDenseLayers(json, layers, /*dense_width_key=*/"", c);
}

}  // namespace tandem::model::arch
