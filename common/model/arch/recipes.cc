#include "common/model/arch/recipes.h"

#include <algorithm>
#include <cmath>
#include <string>
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

absl::Status SlidingWindowEveryLayer(ModelConfig* c) {
  if (c->sliding_window <= 0) return absl::OkStatus();
  if (c->layer_specs.empty()) c->layer_specs.assign(c->num_hidden_layers, LayerSpec{});
  for (LayerSpec& spec : c->layer_specs) spec.window = c->sliding_window;
  return absl::OkStatus();
}

absl::Status QwenSlidingWindows(const ConfigReader& json, int64_t max_window_layers,
                                ModelConfig* c) {
  if (c->sliding_window <= 0) return absl::OkStatus();
  std::vector<bool> sliding(c->num_hidden_layers);
  if (!json.Contains("layer_types")) {
    ASSIGN_OR_RETURN(int64_t from, json.OptionalInt("max_window_layers", max_window_layers));
    if (from < 0) return FieldError("max_window_layers", "must not be negative");
    for (int64_t l = 0; l < c->num_hidden_layers; ++l) sliding[l] = l >= from;
  }
  return LayerTypeWindows(json, std::move(sliding), c);
}

absl::Status LayerTypeWindows(const ConfigReader& json, std::vector<bool> sliding, ModelConfig* c) {
  if (c->sliding_window <= 0) return absl::OkStatus();
  sliding.resize(c->num_hidden_layers);
  if (const nlohmann::json* types = json.Find("layer_types"); types != nullptr) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c->num_hidden_layers) {
      return FieldError("layer_types", absl::StrCat("must list the ", c->num_hidden_layers,
                                                    " layers' attention types"));
    }
    for (int64_t l = 0; l < c->num_hidden_layers; ++l) {
      const nlohmann::json& t = (*types)[l];
      const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
      if (type != "sliding_attention" && type != "full_attention") {
        return FieldError(
            "layer_types",
            absl::StrCat("has ", type, " (supported: \"sliding_attention\", \"full_attention\")"));
      }
      sliding[l] = type == "sliding_attention";
    }
  }
  if (c->layer_specs.empty()) c->layer_specs.assign(c->num_hidden_layers, LayerSpec{});
  for (int64_t l = 0; l < c->num_hidden_layers; ++l) {
    if (sliding[l]) c->layer_specs[l].window = c->sliding_window;
  }
  return absl::OkStatus();
}

absl::Status DeepseekLayers(const ConfigReader& json, ModelConfig* c) {
  ASSIGN_OR_RETURN(int64_t shared, json.OptionalInt("n_shared_experts", 0));
  if (shared < 0) return FieldError("n_shared_experts", "must not be negative");
  if (shared > 0) {
    ASSIGN_OR_RETURN(c->shared_expert_intermediate_size,
                     ConfigReader::CheckSize("n_shared_experts", shared * c->intermediate_size));
  }
  c->shared_expert_gated = false;
  ASSIGN_OR_RETURN(int64_t first_dense, json.OptionalInt("first_k_dense_replace", 0));
  if (first_dense < 0) return FieldError("first_k_dense_replace", "must not be negative");
  ASSIGN_OR_RETURN(int64_t frequency, json.OptionalInt("moe_layer_freq", 1));
  if (frequency < 1) return FieldError("moe_layer_freq", "must be at least 1");
  SparseLayers layers{std::vector<bool>(c->num_hidden_layers),
                      first_dense > 0 ? "first_k_dense_replace" : "moe_layer_freq"};
  for (int64_t l = 0; l < c->num_hidden_layers; ++l) {
    layers.sparse[l] = l >= first_dense && l % frequency == 0;
  }
  return SetDenseLayers(json, layers, "intermediate_size", c);
}

absl::Status LatentAttention(const ConfigReader& json, ModelConfig* c) {
  LatentAttentionConfig& m = c->mla;
  // Hugging Face's DeepseekV2Config / DeepseekV3Config defaults.
  m.q_lora_rank = 1536;
  if (json.Contains("q_lora_rank")) {
    ASSIGN_OR_RETURN(m.q_lora_rank, json.OptionalInt("q_lora_rank", 0));  // null: none
    if (m.q_lora_rank < 0) return FieldError("q_lora_rank", "must not be negative");
  }
  auto size = [&](std::string_view key, int64_t fallback) -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(int64_t v, json.OptionalInt(key, fallback));
    return ConfigReader::CheckSize(key, v, int64_t{1} << 16);
  };
  ASSIGN_OR_RETURN(m.kv_lora_rank, size("kv_lora_rank", 512));
  ASSIGN_OR_RETURN(m.qk_nope_head_dim, size("qk_nope_head_dim", 128));
  ASSIGN_OR_RETURN(m.qk_rope_head_dim, size("qk_rope_head_dim", 64));
  ASSIGN_OR_RETURN(m.v_head_dim, size("v_head_dim", 128));
  if (m.q_lora_rank > (int64_t{1} << 16)) return FieldError("q_lora_rank", "is too large");
  if (m.qk_rope_head_dim % 2 != 0) return FieldError("qk_rope_head_dim", "must be even");
  ASSIGN_OR_RETURN(bool bias, json.OptionalBool("attention_bias", false));
  if (bias) {
    return FieldError("attention_bias", absl::StrCat("is not supported for ", Sv(c->model_type()),
                                                     " (must be false)"));
  }
  // Hugging Face sets num_key_value_heads to the heads: every head reads the same latent.
  c->head_dim = m.qk_head_dim();
  c->rotary_dim = m.qk_rope_head_dim;
  c->rope_interleaved = true;
  if (c->num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim + m.qk_rope_head_dim) > kMaxDim) {
    return FieldError("num_attention_heads", "times the head dims is too large");
  }
  if (c->layer_specs.empty()) c->layer_specs.assign(c->num_hidden_layers, LayerSpec{});
  for (LayerSpec& spec : c->layer_specs) spec.mixer = MixerKind::kLatentAttention;
  return absl::OkStatus();
}

absl::Status DeepseekGroups(const ConfigReader& json, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->router.scaling, json.OptionalDouble("routed_scaling_factor", 1.0));
  if (!(c->router.scaling > 0) || !std::isfinite(c->router.scaling)) {
    return FieldError("routed_scaling_factor", "must be a positive number");
  }
  ASSIGN_OR_RETURN(c->router.groups, json.OptionalInt("n_group", 1));
  ASSIGN_OR_RETURN(c->router.top_groups, json.OptionalInt("topk_group", 1));
  const RouterConfig& r = c->router;
  if (r.groups < 1 || c->num_local_experts % r.groups != 0) {
    return FieldError("n_group", absl::StrCat("(", r.groups, ") must divide the ",
                                              c->num_local_experts, " routed experts"));
  }
  if (r.top_groups < 1 || r.top_groups > r.groups) {
    return FieldError("topk_group",
                      absl::StrCat("(", r.top_groups, ") must lie in [1, n_group=", r.groups, "]"));
  }
  if (r.top_groups * (c->num_local_experts / r.groups) < c->num_experts_per_tok) {
    return FieldError("topk_group", "leaves fewer experts than num_experts_per_tok to choose from");
  }
  return absl::OkStatus();
}

}  // namespace tandem::model::arch
