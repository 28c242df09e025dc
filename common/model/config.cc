#include "common/model/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/model/config_reader.h"
#include "common/util/status.h"
#include "nlohmann/json.hpp"

namespace tandem::model {
namespace {

using Json = nlohmann::json;

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
  const ConfigReader json(v);
  const Json* method = json.Find("quant_method");
  if (method != nullptr && *method == "fp8") {
    QuantizationConfig q;
    q.unsupported_method = "fp8";
    return q;
  }
  if (method != nullptr && *method == "mxfp4") {
    // gpt-oss as published: the routed experts in MXFP4 (modules_to_not_convert names the
    // rest), loaded as int8 groups of 32.
    if (!c.arch->stacked_interleaved) {
      return FieldError("quantization_config.quant_method",
                        absl::StrCat("\"mxfp4\" is supported for gpt_oss's experts, not for ",
                                     Sv(c.model_type())));
    }
    if (c.hidden_size % 32 != 0 || c.intermediate_size % 32 != 0) {
      return FieldError("quantization_config.quant_method",
                        "\"mxfp4\" needs hidden_size and intermediate_size multiples of 32");
    }
    QuantizationConfig q;
    q.mxfp4 = true;
    q.bits = 8;
    q.group_size = 32;
    q.experts = true;
    return q;
  }
  if (method == nullptr || !method->is_string() || *method != "tandem") {
    return FieldError("quantization_config.quant_method",
                      absl::StrCat(method == nullptr ? "is missing" : "is " + method->dump(),
                                   ": supported: \"tandem\" (written by tandem quantize), "
                                   "\"mxfp4\" (gpt-oss's experts)"));
  }
  QuantizationConfig q;
  const Json* bits = json.Find("bits");
  if (bits == nullptr || !bits->is_number_integer() || (*bits != 8 && *bits != 4)) {
    return FieldError("quantization_config.bits", "must be 8 or 4");
  }
  q.bits = bits->get<int>();
  const Json* group = json.Find("group_size");
  if (group == nullptr || !group->is_number_integer() ||
      (*group != 32 && *group != 64 && *group != 128)) {
    return FieldError("quantization_config.group_size", "must be 32, 64 or 128");
  }
  q.group_size = group->get<int>();
  if (const Json* symmetric = json.Find("symmetric");
      symmetric != nullptr && *symmetric != Json(true)) {
    return FieldError("quantization_config.symmetric", "must be true (no zero points)");
  }
  const Json* modules = json.Find("modules");
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
  if (const Json* lm_head_bits = json.Find("lm_head_bits"); lm_head_bits != nullptr) {
    if (!lm_head_bits->is_number_integer() || (*lm_head_bits != 8 && *lm_head_bits != 4)) {
      return FieldError("quantization_config.lm_head_bits", "must be 8 or 4");
    }
    if (!q.lm_head) {
      return FieldError("quantization_config.lm_head_bits",
                        "is set but modules does not name lm_head");
    }
    q.lm_head_bits = lm_head_bits->get<int>();
  }
  if (q.lm_head && c.tie_word_embeddings) {
    return FieldError("quantization_config.modules",
                      "names lm_head, which is the (unquantized) embedding when "
                      "tie_word_embeddings is true");
  }
  RETURN_IF_ERROR(CheckGroupDividesWidths(c, q));
  return q;
}

}  // namespace

absl::Status CheckGroupDividesWidths(const ModelConfig& c, const QuantizationConfig& q) {
  auto divisible = [&](bool on, std::string_view what, int64_t width) -> absl::Status {
    if (!on || width <= 0 || width % q.group_size == 0) return absl::OkStatus();
    return FieldError(
        "quantization_config.group_size",
        absl::StrCat("(", q.group_size, ") must divide the ", Sv(what), " (", width, ")"));
  };
  RETURN_IF_ERROR(divisible(true, "hidden size", c.hidden_size));
  RETURN_IF_ERROR(divisible(q.experts, "expert width", c.intermediate_size));
  if (c.NumLayers(MixerKind::kLatentAttention) > 0) {
    RETURN_IF_ERROR(divisible(q.attention, "attention width (heads x v_head_dim)",
                              c.num_attention_heads * c.mla.v_head_dim));
    RETURN_IF_ERROR(divisible(q.attention, "q_lora_rank", c.mla.q_lora_rank));
  } else {
    RETURN_IF_ERROR(divisible(q.attention, "attention width (heads x head_dim)",
                              c.num_attention_heads * c.head_dim));
  }
  RETURN_IF_ERROR(
      divisible(q.shared_expert, "shared expert width", c.shared_expert_intermediate_size));
  RETURN_IF_ERROR(divisible(q.dense_mlp && c.dense_intermediate_size > 0, "dense MLP width",
                            c.dense_intermediate_size));
  return absl::OkStatus();
}

namespace {

// config.json's "rope_scaling": YaRN (Hugging Face's "yarn" rope type, "type" in older
// configs). Its attention factor scales cos and sin: ParseModelConfig takes it where RoPE turns
// whole heads (its square then scales the softmax) and refuses it elsewhere.
absl::StatusOr<RopeScaling> ParseRopeScaling(const Json& v, const ModelConfig& c) {
  if (!v.is_object()) return FieldError("rope_scaling", "must be an object or null");
  const ConfigReader json(v);
  const std::string_view type_key = json.Has("rope_type") ? "rope_type" : "type";
  ASSIGN_OR_RETURN(const std::string type, json.OptionalString(type_key, "default"));
  if (type == "default") return RopeScaling{};
  if (type != "yarn") {
    return FieldError("rope_scaling.rope_type",
                      absl::StrCat("\"", type, "\" is not supported (supported: yarn, default)"));
  }
  RopeScaling r;
  r.kind = RopeScaling::Kind::kYarn;
  ASSIGN_OR_RETURN(r.factor, json.OptionalDouble("factor", 0));
  if (!(r.factor >= 1) || !std::isfinite(r.factor)) {
    return FieldError("rope_scaling.factor", "must be a number of at least 1");
  }
  ASSIGN_OR_RETURN(r.original_max_position_embeddings,
                   json.OptionalInt("original_max_position_embeddings", c.max_position_embeddings));
  if (r.original_max_position_embeddings <= 0) {
    return FieldError("rope_scaling.original_max_position_embeddings", "must be positive");
  }
  ASSIGN_OR_RETURN(r.beta_fast, json.OptionalDouble("beta_fast", 32));
  ASSIGN_OR_RETURN(r.beta_slow, json.OptionalDouble("beta_slow", 1));
  if (!(r.beta_fast > 0) || !(r.beta_slow > 0) || !std::isfinite(r.beta_fast) ||
      !std::isfinite(r.beta_slow)) {
    return FieldError("rope_scaling.beta_fast", "and beta_slow must be positive numbers");
  }
  ASSIGN_OR_RETURN(r.truncate, json.OptionalBool("truncate", true));
  ASSIGN_OR_RETURN(double mscale, json.OptionalDouble("mscale", 0));
  ASSIGN_OR_RETURN(double mscale_all_dim, json.OptionalDouble("mscale_all_dim", 0));
  ASSIGN_OR_RETURN(double attention_factor, json.OptionalDouble("attention_factor", 0));
  auto get_mscale = [&](double m) {
    return r.factor <= 1 ? 1.0 : 0.1 * m * std::log(r.factor) + 1;
  };
  double factor = attention_factor;
  if (factor == 0) {
    factor = mscale != 0 && mscale_all_dim != 0 ? get_mscale(mscale) / get_mscale(mscale_all_dim)
                                                : get_mscale(1.0);
  }
  if (!(factor > 0) || !std::isfinite(factor)) {
    return FieldError("rope_scaling.attention_factor", "must be a positive number");
  }
  r.attention_factor = std::abs(factor - 1.0) > 1e-12 ? factor : 1.0;
  r.mscale_all_dim = mscale_all_dim;
  return r;
}

}  // namespace

ModelConfig::KvShape ModelConfig::kv_shape() const {
  if (NumLayers(MixerKind::kLatentAttention) > 0) {
    return {1, static_cast<int>(mla.cache_dim()), true};
  }
  if (global_attention.head_dim > 0) {
    return {static_cast<int>(global_attention.kv_heads),
            static_cast<int>(global_attention.head_dim), false};
  }
  return {static_cast<int>(num_key_value_heads), static_cast<int>(head_dim), false};
}

bool ModelConfig::HasGlobalAttention(int layer) const {
  return layer >= 0 && global_attention.head_dim > 0 && LayerWindow(layer) == 0;
}

AttentionShape ModelConfig::LayerAttention(int layer) const {
  if (HasGlobalAttention(layer)) return global_attention;
  return {.kv_heads = num_key_value_heads,
          .head_dim = head_dim,
          .rotary_dim = rotary_dim,
          .rope_pairs = rotary_dim / 2,
          .rope_theta = rope_theta};
}

std::vector<float> ModelConfig::RopeFrequencies(int layer) const {
  if (HasGlobalAttention(layer)) {
    // Gemma 4's proportional RoPE: theta^(-2i / head_dim) on the first rope_pairs pairs of the
    // whole head, 0 on the rest (Hugging Face's _compute_proportional_rope_parameters).
    const AttentionShape& a = global_attention;
    std::vector<float> inv_freq(static_cast<size_t>(a.rotary_dim / 2), 0.0f);
    for (int64_t i = 0; i < a.rope_pairs; ++i) {
      inv_freq[i] = 1.0f / std::pow(static_cast<float>(a.rope_theta),
                                    static_cast<float>(2 * i) / static_cast<float>(a.head_dim));
    }
    return inv_freq;
  }
  const int dim = static_cast<int>(rotary_dim);
  const int half = dim / 2;
  const float theta = static_cast<float>(rope_theta);
  // Float32 throughout, as Hugging Face computes them.
  std::vector<float> base(half);
  for (int i = 0; i < half; ++i) {
    base[i] = std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
  }
  std::vector<float> inv_freq(half);
  if (rope_scaling.kind == RopeScaling::Kind::kDefault) {
    for (int i = 0; i < half; ++i) inv_freq[i] = 1.0f / base[i];
    return inv_freq;
  }
  const RopeScaling& r = rope_scaling;
  // The dimension that turns `rotations` times over the original context.
  auto correction_dim = [&](double rotations) {
    return dim *
           std::log(static_cast<double>(r.original_max_position_embeddings) /
                    (rotations * 2 * M_PI)) /
           (2 * std::log(rope_theta));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  const float factor = static_cast<float>(r.factor);
  for (int i = 0; i < half; ++i) {
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float extrapolation = 1.0f - ramp;  // 1: the dimension keeps its frequency
    const float extrapolated = 1.0f / base[i];
    const float interpolated = 1.0f / (factor * base[i]);
    inv_freq[i] = interpolated * (1.0f - extrapolation) + extrapolated * extrapolation;
  }
  return inv_freq;
}

float ModelConfig::AttentionScale(int layer) const {
  const double a = rope_scaling.attention_factor;
  if (attention_scale > 0) return static_cast<float>(attention_scale * a * a);
  const int64_t dim = layer >= 0 ? LayerAttention(layer).head_dim : head_dim;
  return 1.0f / std::sqrt(static_cast<float>(dim)) * static_cast<float>(a * a);
}

double ModelConfig::LatentAttentionScale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const RopeScaling& r = rope_scaling;
  if (r.kind == RopeScaling::Kind::kYarn && r.mscale_all_dim != 0 && r.factor > 1) {
    const double mscale = 0.1 * r.mscale_all_dim * std::log(r.factor) + 1;
    scale *= mscale * mscale;
  }
  return scale;
}

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
    case TensorKind::kAttnQA:
    case TensorKind::kAttnQB:
    case TensorKind::kAttnKvA:
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

  const ConfigReader json(root);
  ModelConfig c;
  const Json* model_type = json.Find("model_type");
  if (model_type == nullptr) return FieldError("model_type", "is required but missing");
  if (!model_type->is_string()) {
    return FieldError("model_type",
                      absl::StrCat("must be a string, got ", model_type->type_name()));
  }
  ASSIGN_OR_RETURN(c.arch, FindArchitecture(model_type->get<std::string>()));
  const ArchitectureSpec& arch = *c.arch;

  if (const Json* v = json.Find("architectures"); v != nullptr) {
    if (!v->is_array()) return FieldError("architectures", "must be an array of strings");
    for (const Json& e : *v) {
      if (!e.is_string()) return FieldError("architectures", "must be an array of strings");
      c.architectures.push_back(e.get<std::string>());
    }
  }
  // A multimodal checkpoint keeps its language model's keys in an object of their own.
  const Json* text_root = &root;
  if (!arch.text_config_key.empty()) {
    text_root = json.Find(arch.text_config_key);
    if (text_root == nullptr || !text_root->is_object()) {
      return FieldError(arch.text_config_key, "must be an object (the language model's config)");
    }
  }
  const ConfigReader text(*text_root);

  ASSIGN_OR_RETURN(c.vocab_size, text.RequiredSize("vocab_size"));
  ASSIGN_OR_RETURN(c.hidden_size, text.RequiredSize("hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, text.RequiredSize(arch.intermediate_size_key));
  ASSIGN_OR_RETURN(c.num_hidden_layers, text.RequiredSize("num_hidden_layers", kMaxLayers));
  ASSIGN_OR_RETURN(c.num_attention_heads, text.RequiredSize("num_attention_heads"));
  ASSIGN_OR_RETURN(int64_t kv_heads,
                   text.OptionalInt("num_key_value_heads", c.num_attention_heads));
  ASSIGN_OR_RETURN(c.num_key_value_heads, ConfigReader::CheckSize("num_key_value_heads", kv_heads));
  ASSIGN_OR_RETURN(c.num_local_experts, text.RequiredSize(arch.num_experts_key, kMaxExperts));
  ASSIGN_OR_RETURN(c.num_experts_per_tok, text.RequiredSize(arch.experts_per_tok_key));
  ASSIGN_OR_RETURN(int64_t max_pos, text.OptionalInt("max_position_embeddings", 4096 * 32));
  ASSIGN_OR_RETURN(c.max_position_embeddings,
                   ConfigReader::CheckSize("max_position_embeddings", max_pos));

  if (text.Has("head_dim")) {
    ASSIGN_OR_RETURN(c.head_dim, text.RequiredSize("head_dim"));
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
    return FieldError(arch.experts_per_tok_key,
                      absl::StrCat("(", c.num_experts_per_tok, ") must not exceed ",
                                   Sv(arch.num_experts_key), " (", c.num_local_experts, ")"));
  }

  ASSIGN_OR_RETURN(c.rope_theta, text.OptionalDouble("rope_theta", arch.default_rope_theta));
  if (!(c.rope_theta > 0)) return FieldError("rope_theta", "must be positive");
  ASSIGN_OR_RETURN(c.rms_norm_eps, text.OptionalDouble("rms_norm_eps", arch.default_rms_norm_eps));
  if (!(c.rms_norm_eps > 0)) return FieldError("rms_norm_eps", "must be positive");
  // A multimodal checkpoint says it at the top level.
  ASSIGN_OR_RETURN(c.tie_word_embeddings, text.OptionalBool("tie_word_embeddings", false));
  ASSIGN_OR_RETURN(c.tie_word_embeddings,
                   json.OptionalBool("tie_word_embeddings", c.tie_word_embeddings));
  ASSIGN_OR_RETURN(bool use_sliding_window,
                   text.OptionalBool("use_sliding_window", arch.default_use_sliding_window));
  ASSIGN_OR_RETURN(int64_t window, text.OptionalInt("sliding_window", 0));
  if (window < 0) return FieldError("sliding_window", "must not be negative");
  c.sliding_window = use_sliding_window ? window : 0;

  if (const Json* v = text.Find("bos_token_id"); v != nullptr) {
    ASSIGN_OR_RETURN(int64_t id, ConfigReader::ToInt(*v, "bos_token_id"));
    ASSIGN_OR_RETURN(c.bos_token_id, CheckTokenId("bos_token_id", id, c.vocab_size));
  }
  if (const Json* v = text.Find("eos_token_id"); v != nullptr) {
    if (v->is_array()) {
      if (v->empty()) return FieldError("eos_token_id", "must not be an empty array");
      for (const Json& e : *v) {
        ASSIGN_OR_RETURN(int64_t id, ConfigReader::ToInt(e, "eos_token_id"));
        ASSIGN_OR_RETURN(int32_t checked, CheckTokenId("eos_token_id", id, c.vocab_size));
        c.eos_token_ids.push_back(checked);
      }
    } else {
      ASSIGN_OR_RETURN(int64_t id, ConfigReader::ToInt(*v, "eos_token_id"));
      ASSIGN_OR_RETURN(int32_t checked, CheckTokenId("eos_token_id", id, c.vocab_size));
      c.eos_token_ids.push_back(checked);
    }
    c.eos_token_id = c.eos_token_ids.front();
  }

  // Newer configs say "dtype".
  const std::string_view dtype_key = text.Has("torch_dtype") ? "torch_dtype" : "dtype";
  if (const Json* v = text.Find(dtype_key); v != nullptr) {
    if (!v->is_string()) {
      return FieldError(dtype_key, absl::StrCat("must be a string, got ", v->type_name()));
    }
    c.torch_dtype = v->get<std::string>();
    if (c.torch_dtype != "bfloat16" && c.torch_dtype != "float16" && c.torch_dtype != "float32") {
      return FieldError(dtype_key, absl::StrCat("has unsupported value \"", c.torch_dtype,
                                                "\" (supported: bfloat16, float16, float32)"));
    }
  }

  if (const Json* v = text.Find("rope_scaling"); v != nullptr) {
    ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(*v, c));
  }
  // Features Tandem does not implement are refused rather than silently ignored.
  if (const Json* v = text.Find("hidden_act"); v != nullptr && *v != "silu") {
    return FieldError("hidden_act", "other than \"silu\" is not supported");
  }
  // What the architecture adds: routing, attention bias, shared experts, dense layers.
  c.rotary_dim = c.head_dim;
  RETURN_IF_ERROR(arch.recipe(text, &c));
  if (!c.layer_specs.empty() && static_cast<int64_t>(c.layer_specs.size()) != c.num_hidden_layers) {
    return absl::InternalError(absl::StrCat(Sv(arch.model_type), "'s recipe composed ",
                                            c.layer_specs.size(), " layers of ",
                                            c.num_hidden_layers));
  }
  // YaRN's attention factor scales cos and sin, so only the rotated part of each query and key:
  // the softmax scale takes its square only where that part is the whole head.
  if (c.rope_scaling.attention_factor != 1 &&
      (c.rotary_dim != c.head_dim || c.NumLayers(MixerKind::kAttention) != c.num_hidden_layers)) {
    return FieldError(
        "rope_scaling.attention_factor",
        absl::StrCat("(YaRN's scale of cos and sin, here ", c.rope_scaling.attention_factor,
                     ") other than 1 is supported only where RoPE turns whole heads "
                     "of grouped-query attention: give mscale equal to "
                     "mscale_all_dim, or attention_factor 1"));
  }
  // A window the recipe placed on no layer is a window the engine would ignore.
  if (c.sliding_window > 0 && std::none_of(c.layer_specs.begin(), c.layer_specs.end(),
                                           [](const LayerSpec& spec) { return spec.window > 0; })) {
    return FieldError("sliding_window",
                      absl::StrCat("(", c.sliding_window, ") is not supported for ",
                                   Sv(arch.model_type), ", which has no sliding-window layers"));
  }
  // Last: it checks the widths of the matrices it covers.
  if (const Json* v = json.Find("quantization_config"); v != nullptr) {
    ASSIGN_OR_RETURN(c.quantization, ParseQuantization(*v, c));
  }
  return c;
}

bool ModelConfig::HasDenseLayers() const {
  return std::any_of(layer_specs.begin(), layer_specs.end(),
                     [](const LayerSpec& spec) { return spec.ffn != FfnKind::kMoe; });
}

bool ModelConfig::HasQkNorm() const { return !TensorName(*arch, TensorKind::kAttnQNorm).empty(); }

int ModelConfig::NumLayers(MixerKind kind) const {
  int n = 0;
  for (int l = 0; l < num_hidden_layers; ++l) n += Mixer(l) == kind;
  return n;
}

ExpertLayout DetectExpertLayout(const ModelConfig& config,
                                const std::vector<std::string>& checkpoint_names) {
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    if (!config.IsSparseLayer(l)) continue;
    std::string stacked = TensorName(*config.arch, TensorKind::kExpertsGateUp, l);
    if (stacked.empty()) return ExpertLayout::kPerExpert;
    if (config.quantization.mxfp4) stacked += "_blocks";
    return std::find(checkpoint_names.begin(), checkpoint_names.end(), stacked) !=
                   checkpoint_names.end()
               ? ExpertLayout::kStacked
               : ExpertLayout::kPerExpert;
  }
  return ExpertLayout::kPerExpert;
}

bool IsIgnoredTensor(const ModelConfig& config, std::string_view name) {
  for (std::string_view prefix : config.arch->ignored_prefixes) {
    if (!prefix.empty() && name.substr(0, prefix.size()) == prefix) return true;
  }
  if (const std::string_view prefix = config.arch->extra_layers_prefix;
      !prefix.empty() && name.substr(0, prefix.size()) == prefix) {
    const std::string_view rest = name.substr(prefix.size());
    int64_t layer = 0;
    size_t digits = 0;
    while (digits < rest.size() && digits < 9 && rest[digits] >= '0' && rest[digits] <= '9') {
      layer = layer * 10 + (rest[digits++] - '0');
    }
    if (digits > 0 && digits < rest.size() && rest[digits] == '.' &&
        layer >= config.num_hidden_layers) {
      return true;
    }
  }
  return false;
}

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

std::vector<int64_t> TensorShape(const ModelConfig& c, TensorKind kind, int layer) {
  const bool mla = c.NumLayers(MixerKind::kLatentAttention) > 0;
  const AttentionShape attention = c.LayerAttention(layer);
  const int64_t q_dim = c.num_attention_heads * attention.head_dim;
  const int64_t kv_dim = attention.kv_heads * attention.head_dim;
  switch (kind) {
    case TensorKind::kTokenEmbedding:
    case TensorKind::kOutput:
      return {c.vocab_size, c.hidden_size};
    case TensorKind::kOutputNorm:
    case TensorKind::kAttnNorm:
    case TensorKind::kFfnNorm:
    case TensorKind::kPostAttnNorm:
    case TensorKind::kPostFfnNorm:
    case TensorKind::kPostDenseNorm:
    case TensorKind::kPreMoeNorm:
    case TensorKind::kPostMoeNorm:
    case TensorKind::kRouterScale:
      return {c.hidden_size};
    case TensorKind::kRouterExpertScale:
      return {c.num_local_experts};
    case TensorKind::kLayerScalar:
      return {1};
    case TensorKind::kAttnQ:  // with its output gate: [q | gate] per head
      return {c.attention_output_gate ? 2 * q_dim : q_dim, c.hidden_size};
    case TensorKind::kAttnK:
    case TensorKind::kAttnV:
      return {kv_dim, c.hidden_size};
    case TensorKind::kAttnOut:
      return {c.hidden_size, mla ? c.num_attention_heads * c.mla.v_head_dim : q_dim};
    case TensorKind::kAttnQA:
      return {c.mla.q_lora_rank, c.hidden_size};
    case TensorKind::kAttnQANorm:
      return {c.mla.q_lora_rank};
    case TensorKind::kAttnQB:
      return {q_dim, c.mla.q_lora_rank};
    case TensorKind::kAttnKvA:
      return {c.mla.cache_dim(), c.hidden_size};
    case TensorKind::kAttnKvANorm:
      return {c.mla.kv_lora_rank};
    case TensorKind::kAttnKvB:
      return {c.num_attention_heads * (c.mla.qk_nope_head_dim + c.mla.v_head_dim),
              c.mla.kv_lora_rank};
    case TensorKind::kRouterBias:
      return {c.num_local_experts};
    case TensorKind::kAttnSinks:
      return {c.num_attention_heads};
    case TensorKind::kExpertGateBias:
    case TensorKind::kExpertUpBias:
      return {c.intermediate_size};
    case TensorKind::kExpertDownBias:
      return {c.hidden_size};
    case TensorKind::kExpertsGateUpBias:
      return {c.num_local_experts, 2 * c.intermediate_size};
    case TensorKind::kExpertsDownBias:
      return {c.num_local_experts, c.hidden_size};
    case TensorKind::kAttnQNorm:
    case TensorKind::kAttnKNorm:
      return {attention.head_dim};
    case TensorKind::kAttnQBias:
      return {c.attention_output_gate ? 2 * q_dim : q_dim};
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
    case TensorKind::kExpertsGateUp:
      if (c.arch->stacked_interleaved) {
        return {c.num_local_experts, c.hidden_size, 2 * c.intermediate_size};
      }
      return {c.num_local_experts, 2 * c.intermediate_size, c.hidden_size};
    case TensorKind::kExpertsDown:
      if (c.arch->stacked_interleaved) {
        return {c.num_local_experts, c.intermediate_size, c.hidden_size};
      }
      return {c.num_local_experts, c.hidden_size, c.intermediate_size};
    case TensorKind::kLinearQkv:
      return {c.linear.conv_dim(), c.hidden_size};
    case TensorKind::kLinearZ:
      return {c.linear.value_dim(), c.hidden_size};
    case TensorKind::kLinearB:
    case TensorKind::kLinearA:
      return {c.linear.num_value_heads, c.hidden_size};
    case TensorKind::kLinearConv:
      return {c.linear.conv_dim(), 1, c.linear.conv_kernel};
    case TensorKind::kLinearALog:
    case TensorKind::kLinearDtBias:
      return {c.linear.num_value_heads};
    case TensorKind::kLinearNorm:
      return {c.linear.value_head_dim};
    case TensorKind::kLinearOut:
      return {c.hidden_size, c.linear.value_dim()};
  }
  return {};
}

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c, ExpertLayout layout) {
  const ArchitectureSpec& arch = *c.arch;
  std::vector<TensorSpec> out;
  const QuantizationConfig& q = c.quantization;
  auto add = [&](TensorKind kind, int layer, int expert) {
    std::string name = TensorName(arch, kind, layer, expert);
    if (name.empty()) return;  // the architecture has no such tensor
    std::vector<int64_t> shape = TensorShape(c, kind, layer);
    if (!q.Quantizes(kind)) {
      out.push_back(TensorSpec{std::move(name), std::move(shape), kind, layer, expert});
      return;
    }
    const int64_t rows = shape[0], cols = shape[1];
    std::string scales = ScaleTensorName(name);
    const int bits = q.BitsOf(kind);
    out.push_back(TensorSpec{std::move(name),
                             {rows, bits == 4 ? cols / 2 : cols},
                             kind,
                             layer,
                             expert,
                             bits == 4 ? TensorStorage::kInt4 : TensorStorage::kInt8});
    out.push_back(TensorSpec{std::move(scales),
                             {rows, cols / q.group_size},
                             kind,
                             layer,
                             expert,
                             TensorStorage::kScale});
  };
  add(TensorKind::kTokenEmbedding, -1, -1);
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    add(TensorKind::kAttnNorm, layer, -1);
    if (c.Mixer(layer) == MixerKind::kGatedDeltaNet) {
      for (TensorKind kind :
           {TensorKind::kLinearQkv, TensorKind::kLinearZ, TensorKind::kLinearB,
            TensorKind::kLinearA, TensorKind::kLinearConv, TensorKind::kLinearALog,
            TensorKind::kLinearDtBias, TensorKind::kLinearNorm, TensorKind::kLinearOut}) {
        add(kind, layer, -1);
      }
    } else if (c.Mixer(layer) == MixerKind::kLatentAttention) {
      if (c.mla.q_lora_rank > 0) {
        for (TensorKind kind :
             {TensorKind::kAttnQA, TensorKind::kAttnQANorm, TensorKind::kAttnQB}) {
          add(kind, layer, -1);
        }
      } else {
        add(TensorKind::kAttnQ, layer, -1);
      }
      for (TensorKind kind : {TensorKind::kAttnKvA, TensorKind::kAttnKvANorm, TensorKind::kAttnKvB,
                              TensorKind::kAttnOut}) {
        add(kind, layer, -1);
      }
    } else {
      for (TensorKind kind :
           {TensorKind::kAttnQ, TensorKind::kAttnK, TensorKind::kAttnV, TensorKind::kAttnOut,
            TensorKind::kAttnQNorm, TensorKind::kAttnKNorm}) {
        if (kind == TensorKind::kAttnV && c.LayerAttention(layer).values_from_keys) continue;
        add(kind, layer, -1);
      }
    }
    if (c.attention_qkv_bias && c.Mixer(layer) == MixerKind::kAttention) {
      for (TensorKind kind :
           {TensorKind::kAttnQBias, TensorKind::kAttnKBias, TensorKind::kAttnVBias}) {
        add(kind, layer, -1);
      }
    }
    if (c.attention_out_bias && c.Mixer(layer) == MixerKind::kAttention) {
      add(TensorKind::kAttnOutBias, layer, -1);
    }
    if (c.attention_sinks && c.Mixer(layer) == MixerKind::kAttention) {
      add(TensorKind::kAttnSinks, layer, -1);
    }
    if (c.sandwich_norms) {
      add(TensorKind::kPostAttnNorm, layer, -1);
      add(TensorKind::kPostFfnNorm, layer, -1);
    }
    if (c.layer_scalar) add(TensorKind::kLayerScalar, layer, -1);
    add(TensorKind::kFfnNorm, layer, -1);
    if (c.HasDenseMlp(layer)) {
      for (TensorKind kind :
           {TensorKind::kDenseGate, TensorKind::kDenseUp, TensorKind::kDenseDown}) {
        add(kind, layer, -1);
      }
    }
    if (!c.IsSparseLayer(layer)) continue;
    if (c.Ffn(layer) == FfnKind::kDenseAndMoe) {
      for (TensorKind kind :
           {TensorKind::kPostDenseNorm, TensorKind::kPreMoeNorm, TensorKind::kPostMoeNorm}) {
        add(kind, layer, -1);
      }
    }
    add(TensorKind::kRouter, layer, -1);
    if (c.router.gemma) {
      add(TensorKind::kRouterScale, layer, -1);
      add(TensorKind::kRouterExpertScale, layer, -1);
    }
    if (c.router.selection_bias || c.router.logit_bias) add(TensorKind::kRouterBias, layer, -1);
    if (layout == ExpertLayout::kStacked && q.mxfp4) {
      // Blocks and scales a row per output: gate_up (2 * intermediate, hidden), down (hidden,
      // intermediate).
      for (TensorKind kind : {TensorKind::kExpertsGateUp, TensorKind::kExpertsDown}) {
        const std::string name = TensorName(arch, kind, layer);
        const bool gate_up = kind == TensorKind::kExpertsGateUp;
        const int64_t rows = gate_up ? 2 * c.intermediate_size : c.hidden_size;
        const int64_t groups = (gate_up ? c.hidden_size : c.intermediate_size) / 32;
        out.push_back(TensorSpec{name + "_blocks",
                                 {c.num_local_experts, rows, groups, 16},
                                 kind,
                                 layer,
                                 -1,
                                 TensorStorage::kMxfp4Blocks});
        out.push_back(TensorSpec{name + "_scales",
                                 {c.num_local_experts, rows, groups},
                                 kind,
                                 layer,
                                 -1,
                                 TensorStorage::kMxfp4Scales});
      }
    } else if (layout == ExpertLayout::kStacked) {
      add(TensorKind::kExpertsGateUp, layer, -1);
      add(TensorKind::kExpertsDown, layer, -1);
    }
    if (layout == ExpertLayout::kStacked && c.expert_bias) {
      add(TensorKind::kExpertsGateUpBias, layer, -1);
      add(TensorKind::kExpertsDownBias, layer, -1);
    }
    if (layout == ExpertLayout::kPerExpert) {
      for (int expert = 0; expert < c.num_local_experts; ++expert) {
        for (TensorKind kind :
             {TensorKind::kExpertGate, TensorKind::kExpertUp, TensorKind::kExpertDown}) {
          add(kind, layer, expert);
        }
        if (!c.expert_bias) continue;
        for (TensorKind kind : {TensorKind::kExpertGateBias, TensorKind::kExpertUpBias,
                                TensorKind::kExpertDownBias}) {
          add(kind, layer, expert);
        }
      }
    }
    if (c.HasSharedExpert()) {
      for (TensorKind kind :
           {TensorKind::kSharedGate, TensorKind::kSharedUp, TensorKind::kSharedDown}) {
        add(kind, layer, -1);
      }
      if (c.shared_expert_gated) add(TensorKind::kSharedExpertGate, layer, -1);
    }
  }
  add(TensorKind::kOutputNorm, -1, -1);
  if (!c.tie_word_embeddings) add(TensorKind::kOutput, -1, -1);
  return out;
}

}  // namespace tandem::model
