#include "common/model/config.h"

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/util/status.h"
#include "nlohmann/json.hpp"

namespace tandem::model {
namespace {

using Json = nlohmann::json;

// The installed Abseil's string_view is its own type, not std::string_view; absl::StrCat and
// friends need it.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr std::array<std::string_view, kNumTensorKinds> MakeNames(
    std::initializer_list<std::pair<TensorKind, std::string_view>> entries) {
  std::array<std::string_view, kNumTensorKinds> names{};
  for (const auto& [kind, pattern] : entries) names[static_cast<int>(kind)] = pattern;
  return names;
}

constexpr ArchitectureSpec kMixtral{
    .model_type = "mixtral",
    .norm_topk_prob = true,
    .norm_topk_prob_from_config = false,
    .num_experts_key = "num_local_experts",
    .intermediate_size_key = "intermediate_size",
    .default_rope_theta = 1e6,
    .default_rms_norm_eps = 1e-5,
    .default_use_sliding_window = true,
    .attention_bias_key = "",
    .attention_bias_default = false,
    .attention_bias_covers_output = false,
    .dense_intermediate_size_key = "",
    .shared_expert_size_key = "",
    .tensor_names = MakeNames({
        {TensorKind::kTokenEmbedding, "model.embed_tokens.weight"},
        {TensorKind::kOutputNorm, "model.norm.weight"},
        {TensorKind::kOutput, "lm_head.weight"},
        {TensorKind::kAttnNorm, "model.layers.{layer}.input_layernorm.weight"},
        {TensorKind::kAttnQ, "model.layers.{layer}.self_attn.q_proj.weight"},
        {TensorKind::kAttnK, "model.layers.{layer}.self_attn.k_proj.weight"},
        {TensorKind::kAttnV, "model.layers.{layer}.self_attn.v_proj.weight"},
        {TensorKind::kAttnOut, "model.layers.{layer}.self_attn.o_proj.weight"},
        {TensorKind::kFfnNorm, "model.layers.{layer}.post_attention_layernorm.weight"},
        {TensorKind::kRouter, "model.layers.{layer}.block_sparse_moe.gate.weight"},
        {TensorKind::kExpertGate,
         "model.layers.{layer}.block_sparse_moe.experts.{expert}.w1.weight"},
        {TensorKind::kExpertUp, "model.layers.{layer}.block_sparse_moe.experts.{expert}.w3.weight"},
        {TensorKind::kExpertDown,
         "model.layers.{layer}.block_sparse_moe.experts.{expert}.w2.weight"},
    }),
};

// Qwen3-MoE: per-head q/k RMSNorm, explicit head_dim, top-k renormalisation set by config,
// dense MLP layers by decoder_sparse_step / mlp_only_layers, optional attention bias.
constexpr ArchitectureSpec kQwen3Moe{
    .model_type = "qwen3_moe",
    .norm_topk_prob = false,  // the Hugging Face default when the key is absent
    .norm_topk_prob_from_config = true,
    .num_experts_key = "num_experts",
    .intermediate_size_key = "moe_intermediate_size",
    .default_rope_theta = 10000.0,
    .default_rms_norm_eps = 1e-6,
    .default_use_sliding_window = false,
    .attention_bias_key = "attention_bias",
    .attention_bias_default = false,
    .attention_bias_covers_output = true,
    .dense_intermediate_size_key = "intermediate_size",
    .shared_expert_size_key = "",
    .tensor_names = MakeNames({
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
};

// Qwen2-MoE (Qwen1.5-MoE): q/k/v bias, an always-on shared expert scaled by
// sigmoid(shared_expert_gate . x), top-k renormalisation set by config (default off), dense MLP
// layers by decoder_sparse_step / mlp_only_layers.
constexpr ArchitectureSpec kQwen2Moe{
    .model_type = "qwen2_moe",
    .norm_topk_prob = false,
    .norm_topk_prob_from_config = true,
    .num_experts_key = "num_experts",
    .intermediate_size_key = "moe_intermediate_size",
    .default_rope_theta = 10000.0,
    .default_rms_norm_eps = 1e-6,
    .default_use_sliding_window = false,
    .attention_bias_key = "qkv_bias",
    .attention_bias_default = true,
    .attention_bias_covers_output = false,
    .dense_intermediate_size_key = "intermediate_size",
    .shared_expert_size_key = "shared_expert_intermediate_size",
    .tensor_names = MakeNames({
        {TensorKind::kTokenEmbedding, "model.embed_tokens.weight"},
        {TensorKind::kOutputNorm, "model.norm.weight"},
        {TensorKind::kOutput, "lm_head.weight"},
        {TensorKind::kAttnNorm, "model.layers.{layer}.input_layernorm.weight"},
        {TensorKind::kAttnQ, "model.layers.{layer}.self_attn.q_proj.weight"},
        {TensorKind::kAttnK, "model.layers.{layer}.self_attn.k_proj.weight"},
        {TensorKind::kAttnV, "model.layers.{layer}.self_attn.v_proj.weight"},
        {TensorKind::kAttnOut, "model.layers.{layer}.self_attn.o_proj.weight"},
        {TensorKind::kAttnQBias, "model.layers.{layer}.self_attn.q_proj.bias"},
        {TensorKind::kAttnKBias, "model.layers.{layer}.self_attn.k_proj.bias"},
        {TensorKind::kAttnVBias, "model.layers.{layer}.self_attn.v_proj.bias"},
        {TensorKind::kFfnNorm, "model.layers.{layer}.post_attention_layernorm.weight"},
        {TensorKind::kRouter, "model.layers.{layer}.mlp.gate.weight"},
        {TensorKind::kExpertGate, "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight"},
        {TensorKind::kExpertUp, "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight"},
        {TensorKind::kExpertDown, "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"},
        {TensorKind::kSharedGate, "model.layers.{layer}.mlp.shared_expert.gate_proj.weight"},
        {TensorKind::kSharedUp, "model.layers.{layer}.mlp.shared_expert.up_proj.weight"},
        {TensorKind::kSharedDown, "model.layers.{layer}.mlp.shared_expert.down_proj.weight"},
        {TensorKind::kSharedExpertGate, "model.layers.{layer}.mlp.shared_expert_gate.weight"},
        {TensorKind::kDenseGate, "model.layers.{layer}.mlp.gate_proj.weight"},
        {TensorKind::kDenseUp, "model.layers.{layer}.mlp.up_proj.weight"},
        {TensorKind::kDenseDown, "model.layers.{layer}.mlp.down_proj.weight"},
    }),
};

// Bounds far above any real model; they keep shape products inside int64 and the expected
// tensor list finite for hostile configs.
constexpr int64_t kMaxDim = int64_t{1} << 31;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxExperts = 4096;

absl::Status FieldError(std::string_view field, std::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: field '", Sv(field), "' ", Sv(problem)));
}

// Returns nullptr when the key is absent or null.
const Json* Find(const Json& obj, std::string_view key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<int64_t> ToInt(const Json& v, std::string_view key) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FieldError(key, "is out of range");
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return FieldError(key, absl::StrCat("must be an integer, got ", v.type_name()));
}

absl::StatusOr<int64_t> RequiredInt(const Json& obj, std::string_view key) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return FieldError(key, "is required but missing");
  return ToInt(*v, key);
}

absl::StatusOr<int64_t> OptionalInt(const Json& obj, std::string_view key, int64_t fallback) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return fallback;
  return ToInt(*v, key);
}

absl::StatusOr<double> OptionalDouble(const Json& obj, std::string_view key, double fallback) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_number()) {
    return FieldError(key, absl::StrCat("must be a number, got ", v->type_name()));
  }
  return v->get<double>();
}

absl::StatusOr<bool> OptionalBool(const Json& obj, std::string_view key, bool fallback) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) {
    return FieldError(key, absl::StrCat("must be a boolean, got ", v->type_name()));
  }
  return v->get<bool>();
}

// A size field: positive and at most `max`.
absl::StatusOr<int64_t> CheckSize(std::string_view key, int64_t value, int64_t max = kMaxDim) {
  if (value <= 0) return FieldError(key, absl::StrCat("must be positive, got ", value));
  if (value > max) return FieldError(key, absl::StrCat("is too large: ", value, " > ", max));
  return value;
}

absl::StatusOr<int32_t> CheckTokenId(std::string_view key, int64_t id, int64_t vocab_size) {
  if (id < 0 || id >= vocab_size) {
    return FieldError(key, absl::StrCat("must be in [0, vocab_size=", vocab_size, "), got ", id));
  }
  return static_cast<int32_t>(id);
}

// config.json's "quantization_config" (docs/quantization.md), checked against the shapes of
// the matrices it covers: each one's input width must be a multiple of the group size.
absl::StatusOr<QuantizationConfig> ParseQuantization(const Json& v, const ModelConfig& c) {
  if (!v.is_object()) return FieldError("quantization_config", "must be an object");
  const Json* method = Find(v, "quant_method");
  if (method == nullptr || !method->is_string() || *method != "tandem") {
    return FieldError("quantization_config.quant_method",
                      absl::StrCat(method == nullptr ? "is missing" : "is " + method->dump(),
                                   ": only \"tandem\" (written by tandem quantize) is supported"));
  }
  QuantizationConfig q;
  const Json* bits = Find(v, "bits");
  if (bits == nullptr || !bits->is_number_integer() || (*bits != 8 && *bits != 4)) {
    return FieldError("quantization_config.bits", "must be 8 or 4");
  }
  q.bits = bits->get<int>();
  const Json* group = Find(v, "group_size");
  if (group == nullptr || !group->is_number_integer() ||
      (*group != 32 && *group != 64 && *group != 128)) {
    return FieldError("quantization_config.group_size", "must be 32, 64 or 128");
  }
  q.group_size = group->get<int>();
  if (const Json* symmetric = Find(v, "symmetric");
      symmetric != nullptr && *symmetric != Json(true)) {
    return FieldError("quantization_config.symmetric", "must be true (no zero points)");
  }
  const Json* modules = Find(v, "modules");
  if (modules == nullptr || !modules->is_array() || modules->empty()) {
    return FieldError("quantization_config.modules",
                      "must be a non-empty array of \"experts\", \"attention\", "
                      "\"shared_expert\", \"dense_mlp\", \"lm_head\"");
  }
  for (const Json& m : *modules) {
    if (m == "experts") {
      q.experts = true;
    } else if (m == "attention") {
      q.attention = true;
    } else if (m == "shared_expert") {
      q.shared_expert = true;
    } else if (m == "dense_mlp") {
      q.dense_mlp = true;
    } else if (m == "lm_head") {
      q.lm_head = true;
    } else {
      return FieldError("quantization_config.modules",
                        absl::StrCat("has unknown module ", m.dump(),
                                     " (known: experts, attention, shared_expert, dense_mlp, "
                                     "lm_head)"));
    }
  }
  if (q.lm_head && c.tie_word_embeddings) {
    return FieldError("quantization_config.modules",
                      "names lm_head, which is the (unquantized) embedding when "
                      "tie_word_embeddings is true");
  }
  // Every quantized matrix's input width must be a multiple of the group size.
  auto divisible = [&](bool on, std::string_view what, int64_t width) -> absl::Status {
    if (!on || width <= 0 || width % q.group_size == 0) return absl::OkStatus();
    return FieldError(
        "quantization_config.group_size",
        absl::StrCat("(", q.group_size, ") must divide the ", Sv(what), " (", width, ")"));
  };
  RETURN_IF_ERROR(divisible(true, "hidden size", c.hidden_size));
  RETURN_IF_ERROR(divisible(q.experts, "expert width", c.intermediate_size));
  RETURN_IF_ERROR(divisible(q.attention, "attention width (heads x head_dim)",
                            c.num_attention_heads * c.head_dim));
  RETURN_IF_ERROR(
      divisible(q.shared_expert, "shared expert width", c.shared_expert_intermediate_size));
  RETURN_IF_ERROR(divisible(q.dense_mlp && c.dense_intermediate_size > 0, "dense MLP width",
                            c.dense_intermediate_size));
  return q;
}

}  // namespace

bool QuantizationConfig::Quantizes(TensorKind kind) const {
  if (bits == 0) return false;
  switch (kind) {
    case TensorKind::kExpertGate:
    case TensorKind::kExpertUp:
    case TensorKind::kExpertDown:
      return experts;
    case TensorKind::kAttnQ:
    case TensorKind::kAttnK:
    case TensorKind::kAttnV:
    case TensorKind::kAttnOut:
      return attention;
    case TensorKind::kSharedGate:
    case TensorKind::kSharedUp:
    case TensorKind::kSharedDown:
      return shared_expert;
    case TensorKind::kDenseGate:
    case TensorKind::kDenseUp:
    case TensorKind::kDenseDown:
      return dense_mlp;
    case TensorKind::kOutput:
      return lm_head;
    default:
      return false;
  }
}

std::string ScaleTensorName(const std::string& weight_name) { return weight_name + "_scale"; }

const std::vector<const ArchitectureSpec*>& Architectures() {
  static const std::vector<const ArchitectureSpec*> kAll = {&kMixtral, &kQwen2Moe, &kQwen3Moe};
  return kAll;
}

const ArchitectureSpec& MixtralArchitecture() { return kMixtral; }

absl::StatusOr<const ArchitectureSpec*> FindArchitecture(std::string_view model_type) {
  std::vector<absl::string_view> known;
  for (const ArchitectureSpec* arch : Architectures()) {
    if (arch->model_type == model_type) return arch;
    known.push_back(Sv(arch->model_type));
  }
  return FieldError("model_type", absl::StrCat("has unsupported value \"", Sv(model_type),
                                               "\" (supported: ", absl::StrJoin(known, ", "), ")"));
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text) {
  Json root = Json::parse(json_text.begin(), json_text.end(), /*cb=*/nullptr,
                          /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("config.json: malformed JSON");
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: top level must be an object, got ", root.type_name()));
  }

  ModelConfig c;
  const Json* model_type = Find(root, "model_type");
  if (model_type == nullptr) return FieldError("model_type", "is required but missing");
  if (!model_type->is_string()) {
    return FieldError("model_type",
                      absl::StrCat("must be a string, got ", model_type->type_name()));
  }
  ASSIGN_OR_RETURN(c.arch, FindArchitecture(model_type->get<std::string>()));
  const ArchitectureSpec& arch = *c.arch;

  if (const Json* v = Find(root, "architectures"); v != nullptr) {
    if (!v->is_array()) return FieldError("architectures", "must be an array of strings");
    for (const Json& e : *v) {
      if (!e.is_string()) return FieldError("architectures", "must be an array of strings");
      c.architectures.push_back(e.get<std::string>());
    }
  }

  ASSIGN_OR_RETURN(int64_t vocab_size, RequiredInt(root, "vocab_size"));
  ASSIGN_OR_RETURN(c.vocab_size, CheckSize("vocab_size", vocab_size));
  ASSIGN_OR_RETURN(int64_t hidden_size, RequiredInt(root, "hidden_size"));
  ASSIGN_OR_RETURN(c.hidden_size, CheckSize("hidden_size", hidden_size));
  ASSIGN_OR_RETURN(int64_t intermediate_size, RequiredInt(root, arch.intermediate_size_key));
  ASSIGN_OR_RETURN(c.intermediate_size, CheckSize(arch.intermediate_size_key, intermediate_size));
  ASSIGN_OR_RETURN(int64_t layers, RequiredInt(root, "num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_hidden_layers, CheckSize("num_hidden_layers", layers, kMaxLayers));
  ASSIGN_OR_RETURN(int64_t heads, RequiredInt(root, "num_attention_heads"));
  ASSIGN_OR_RETURN(c.num_attention_heads, CheckSize("num_attention_heads", heads));
  ASSIGN_OR_RETURN(int64_t kv_heads, OptionalInt(root, "num_key_value_heads", heads));
  ASSIGN_OR_RETURN(c.num_key_value_heads, CheckSize("num_key_value_heads", kv_heads));
  ASSIGN_OR_RETURN(int64_t experts, RequiredInt(root, arch.num_experts_key));
  ASSIGN_OR_RETURN(c.num_local_experts, CheckSize(arch.num_experts_key, experts, kMaxExperts));
  ASSIGN_OR_RETURN(int64_t top_k, RequiredInt(root, "num_experts_per_tok"));
  ASSIGN_OR_RETURN(c.num_experts_per_tok, CheckSize("num_experts_per_tok", top_k));
  ASSIGN_OR_RETURN(int64_t max_pos, OptionalInt(root, "max_position_embeddings", 4096 * 32));
  ASSIGN_OR_RETURN(c.max_position_embeddings, CheckSize("max_position_embeddings", max_pos));

  if (Find(root, "head_dim") != nullptr) {
    ASSIGN_OR_RETURN(int64_t head_dim, RequiredInt(root, "head_dim"));
    ASSIGN_OR_RETURN(c.head_dim, CheckSize("head_dim", head_dim));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return FieldError("num_attention_heads",
                        absl::StrCat("(", c.num_attention_heads, ") must divide hidden_size (",
                                     c.hidden_size, ") when head_dim is absent"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return FieldError("num_key_value_heads", absl::StrCat("(", c.num_key_value_heads,
                                                          ") must divide num_attention_heads (",
                                                          c.num_attention_heads, ")"));
  }
  if (c.num_attention_heads * c.head_dim > kMaxDim) {
    return FieldError("head_dim", "times num_attention_heads is too large");
  }
  if (c.num_experts_per_tok > c.num_local_experts) {
    return FieldError("num_experts_per_tok",
                      absl::StrCat("(", c.num_experts_per_tok, ") must not exceed ",
                                   Sv(arch.num_experts_key), " (", c.num_local_experts, ")"));
  }

  ASSIGN_OR_RETURN(c.rope_theta, OptionalDouble(root, "rope_theta", arch.default_rope_theta));
  if (!(c.rope_theta > 0)) return FieldError("rope_theta", "must be positive");
  ASSIGN_OR_RETURN(c.rms_norm_eps, OptionalDouble(root, "rms_norm_eps", arch.default_rms_norm_eps));
  if (!(c.rms_norm_eps > 0)) return FieldError("rms_norm_eps", "must be positive");
  ASSIGN_OR_RETURN(c.tie_word_embeddings, OptionalBool(root, "tie_word_embeddings", false));
  c.norm_topk_prob = arch.norm_topk_prob;
  if (arch.norm_topk_prob_from_config) {
    ASSIGN_OR_RETURN(c.norm_topk_prob, OptionalBool(root, "norm_topk_prob", arch.norm_topk_prob));
  }

  ASSIGN_OR_RETURN(bool use_sliding_window,
                   OptionalBool(root, "use_sliding_window", arch.default_use_sliding_window));
  ASSIGN_OR_RETURN(int64_t window, OptionalInt(root, "sliding_window", 0));
  if (window < 0) return FieldError("sliding_window", "must not be negative");
  c.sliding_window = use_sliding_window ? window : 0;
  // The engine attends over the whole context; a window shorter than the context would change
  // what the model computes.
  if (c.sliding_window > 0 && c.sliding_window < c.max_position_embeddings) {
    return FieldError("sliding_window",
                      absl::StrCat("(", c.sliding_window, ", shorter than the context of ",
                                   c.max_position_embeddings,
                                   ") is not supported: Tandem attends over the whole context"));
  }

  if (const Json* v = Find(root, "bos_token_id"); v != nullptr) {
    ASSIGN_OR_RETURN(int64_t id, ToInt(*v, "bos_token_id"));
    ASSIGN_OR_RETURN(c.bos_token_id, CheckTokenId("bos_token_id", id, c.vocab_size));
  }
  if (const Json* v = Find(root, "eos_token_id"); v != nullptr) {
    if (v->is_array()) {
      if (v->empty()) return FieldError("eos_token_id", "must not be an empty array");
      for (const Json& e : *v) {
        ASSIGN_OR_RETURN(int64_t id, ToInt(e, "eos_token_id"));
        ASSIGN_OR_RETURN(int32_t checked, CheckTokenId("eos_token_id", id, c.vocab_size));
        c.eos_token_ids.push_back(checked);
      }
    } else {
      ASSIGN_OR_RETURN(int64_t id, ToInt(*v, "eos_token_id"));
      ASSIGN_OR_RETURN(int32_t checked, CheckTokenId("eos_token_id", id, c.vocab_size));
      c.eos_token_ids.push_back(checked);
    }
    c.eos_token_id = c.eos_token_ids.front();
  }

  if (const Json* v = Find(root, "torch_dtype"); v != nullptr) {
    if (!v->is_string()) {
      return FieldError("torch_dtype", absl::StrCat("must be a string, got ", v->type_name()));
    }
    c.torch_dtype = v->get<std::string>();
    if (c.torch_dtype != "bfloat16" && c.torch_dtype != "float16" && c.torch_dtype != "float32") {
      return FieldError("torch_dtype", absl::StrCat("has unsupported value \"", c.torch_dtype,
                                                    "\" (supported: bfloat16, float16, float32)"));
    }
  }

  // Features Tandem does not implement are refused rather than silently ignored.
  if (const Json* v = Find(root, "rope_scaling"); v != nullptr) {
    return FieldError("rope_scaling", "is not supported (must be null or absent)");
  }
  if (const Json* v = Find(root, "hidden_act"); v != nullptr && *v != "silu") {
    return FieldError("hidden_act", "other than \"silu\" is not supported");
  }
  if (!arch.attention_bias_key.empty()) {
    ASSIGN_OR_RETURN(bool bias,
                     OptionalBool(root, arch.attention_bias_key, arch.attention_bias_default));
    c.attention_qkv_bias = bias;
    c.attention_out_bias = bias && arch.attention_bias_covers_output;
  }
  if (arch.attention_bias_key != "attention_bias") {
    ASSIGN_OR_RETURN(bool attention_bias, OptionalBool(root, "attention_bias", false));
    if (attention_bias) {
      return FieldError("attention_bias", absl::StrCat("is not supported for ", Sv(arch.model_type),
                                                       " (must be false)"));
    }
  }
  if (arch.shared_expert_size_key.empty()) {
    for (std::string_view key : {"shared_expert_intermediate_size", "n_shared_experts"}) {
      ASSIGN_OR_RETURN(int64_t shared, OptionalInt(root, key, 0));
      if (shared != 0) {
        return FieldError(key,
                          absl::StrCat("(shared experts) is not part of ", Sv(arch.model_type)));
      }
    }
  } else {
    ASSIGN_OR_RETURN(int64_t shared, OptionalInt(root, arch.shared_expert_size_key, 0));
    if (shared < 0) return FieldError(arch.shared_expert_size_key, "must not be negative");
    if (shared > 0) {
      ASSIGN_OR_RETURN(c.shared_expert_intermediate_size,
                       CheckSize(arch.shared_expert_size_key, shared));
    }
  }

  // Dense MLP layers: layer l is sparse iff it is not in mlp_only_layers and
  // (l + 1) % decoder_sparse_step == 0, as Hugging Face's Qwen MoE decoder layers decide.
  ASSIGN_OR_RETURN(int64_t sparse_step, OptionalInt(root, "decoder_sparse_step", 1));
  if (sparse_step < 1) return FieldError("decoder_sparse_step", "must be at least 1");
  std::vector<bool> sparse(c.num_hidden_layers, true);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) sparse[l] = (l + 1) % sparse_step == 0;
  if (const Json* v = Find(root, "mlp_only_layers"); v != nullptr) {
    if (!v->is_array()) return FieldError("mlp_only_layers", "must be an array of layer indices");
    for (const Json& e : *v) {
      ASSIGN_OR_RETURN(int64_t l, ToInt(e, "mlp_only_layers"));
      if (l < 0 || l >= c.num_hidden_layers) {
        return FieldError("mlp_only_layers", absl::StrCat("names layer ", l, ", outside [0, ",
                                                          c.num_hidden_layers, ")"));
      }
      sparse[l] = false;
    }
  }
  const bool any_dense = std::find(sparse.begin(), sparse.end(), false) != sparse.end();
  if (any_dense) {
    if (arch.dense_intermediate_size_key.empty()) {
      return FieldError(
          sparse_step != 1 ? "decoder_sparse_step" : "mlp_only_layers",
          absl::StrCat("makes dense MLP layers, which ", Sv(arch.model_type), " does not have"));
    }
    if (std::find(sparse.begin(), sparse.end(), true) == sparse.end()) {
      return FieldError("decoder_sparse_step",
                        "and mlp_only_layers leave no MoE layer: a dense model is not supported");
    }
    ASSIGN_OR_RETURN(int64_t dense, RequiredInt(root, arch.dense_intermediate_size_key));
    ASSIGN_OR_RETURN(c.dense_intermediate_size, CheckSize(arch.dense_intermediate_size_key, dense));
    c.sparse_layers = std::move(sparse);
  }
  // Last: it checks the widths of the matrices it covers.
  if (const Json* v = Find(root, "quantization_config"); v != nullptr && !v->is_null()) {
    ASSIGN_OR_RETURN(c.quantization, ParseQuantization(*v, c));
  }
  return c;
}

bool ModelConfig::HasDenseLayers() const {
  return std::find(sparse_layers.begin(), sparse_layers.end(), false) != sparse_layers.end();
}

bool ModelConfig::HasQkNorm() const { return !TensorName(*arch, TensorKind::kAttnQNorm).empty(); }

std::string ModelNameFromDir(const std::string& model_dir) {
  std::filesystem::path dir = std::filesystem::absolute(model_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // a trailing separator
  return dir.filename().string();
}

std::string TensorName(const ArchitectureSpec& arch, TensorKind kind, int layer, int expert) {
  const std::string_view pattern = arch.tensor_names[static_cast<int>(kind)];
  if (pattern.empty()) return "";
  return absl::StrReplaceAll(
      Sv(pattern), {{"{layer}", absl::StrCat(layer)}, {"{expert}", absl::StrCat(expert)}});
}

std::vector<int64_t> TensorShape(const ModelConfig& c, TensorKind kind) {
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  switch (kind) {
    case TensorKind::kTokenEmbedding:
    case TensorKind::kOutput:
      return {c.vocab_size, c.hidden_size};
    case TensorKind::kOutputNorm:
    case TensorKind::kAttnNorm:
    case TensorKind::kFfnNorm:
      return {c.hidden_size};
    case TensorKind::kAttnQ:
      return {q_dim, c.hidden_size};
    case TensorKind::kAttnK:
    case TensorKind::kAttnV:
      return {kv_dim, c.hidden_size};
    case TensorKind::kAttnOut:
      return {c.hidden_size, q_dim};
    case TensorKind::kAttnQNorm:
    case TensorKind::kAttnKNorm:
      return {c.head_dim};
    case TensorKind::kAttnQBias:
      return {q_dim};
    case TensorKind::kAttnKBias:
    case TensorKind::kAttnVBias:
      return {kv_dim};
    case TensorKind::kAttnOutBias:
      return {c.hidden_size};
    case TensorKind::kSharedGate:
    case TensorKind::kSharedUp:
      return {c.shared_expert_intermediate_size, c.hidden_size};
    case TensorKind::kSharedDown:
      return {c.hidden_size, c.shared_expert_intermediate_size};
    case TensorKind::kSharedExpertGate:
      return {1, c.hidden_size};
    case TensorKind::kDenseGate:
    case TensorKind::kDenseUp:
      return {c.dense_intermediate_size, c.hidden_size};
    case TensorKind::kDenseDown:
      return {c.hidden_size, c.dense_intermediate_size};
    case TensorKind::kRouter:
      return {c.num_local_experts, c.hidden_size};
    case TensorKind::kExpertGate:
    case TensorKind::kExpertUp:
      return {c.intermediate_size, c.hidden_size};
    case TensorKind::kExpertDown:
      return {c.hidden_size, c.intermediate_size};
  }
  return {};
}

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c) {
  const ArchitectureSpec& arch = *c.arch;
  std::vector<TensorSpec> out;
  const QuantizationConfig& q = c.quantization;
  auto add = [&](TensorKind kind, int layer, int expert) {
    std::string name = TensorName(arch, kind, layer, expert);
    if (name.empty()) return;  // the architecture has no such tensor
    std::vector<int64_t> shape = TensorShape(c, kind);
    if (!q.Quantizes(kind)) {
      out.push_back(TensorSpec{std::move(name), std::move(shape), kind, layer, expert});
      return;
    }
    const int64_t rows = shape[0], cols = shape[1];
    std::string scales = ScaleTensorName(name);
    out.push_back(TensorSpec{std::move(name),
                             {rows, q.bits == 4 ? cols / 2 : cols},
                             kind,
                             layer,
                             expert,
                             q.bits == 4 ? TensorStorage::kInt4 : TensorStorage::kInt8});
    out.push_back(TensorSpec{std::move(scales),
                             {rows, cols / q.group_size},
                             kind,
                             layer,
                             expert,
                             TensorStorage::kScale});
  };
  add(TensorKind::kTokenEmbedding, -1, -1);
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    for (TensorKind kind :
         {TensorKind::kAttnNorm, TensorKind::kAttnQ, TensorKind::kAttnK, TensorKind::kAttnV,
          TensorKind::kAttnOut, TensorKind::kAttnQNorm, TensorKind::kAttnKNorm}) {
      add(kind, layer, -1);
    }
    if (c.attention_qkv_bias) {
      for (TensorKind kind :
           {TensorKind::kAttnQBias, TensorKind::kAttnKBias, TensorKind::kAttnVBias}) {
        add(kind, layer, -1);
      }
    }
    if (c.attention_out_bias) add(TensorKind::kAttnOutBias, layer, -1);
    add(TensorKind::kFfnNorm, layer, -1);
    if (!c.IsSparseLayer(layer)) {
      for (TensorKind kind :
           {TensorKind::kDenseGate, TensorKind::kDenseUp, TensorKind::kDenseDown}) {
        add(kind, layer, -1);
      }
      continue;
    }
    add(TensorKind::kRouter, layer, -1);
    for (int expert = 0; expert < c.num_local_experts; ++expert) {
      for (TensorKind kind :
           {TensorKind::kExpertGate, TensorKind::kExpertUp, TensorKind::kExpertDown}) {
        add(kind, layer, expert);
      }
    }
    if (c.HasSharedExpert()) {
      for (TensorKind kind : {TensorKind::kSharedGate, TensorKind::kSharedUp,
                              TensorKind::kSharedDown, TensorKind::kSharedExpertGate}) {
        add(kind, layer, -1);
      }
    }
  }
  add(TensorKind::kOutputNorm, -1, -1);
  if (!c.tie_word_embeddings) add(TensorKind::kOutput, -1, -1);
  return out;
}

}  // namespace tandem::model
