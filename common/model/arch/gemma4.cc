// Gemma 4 MoE (Hugging Face's Gemma4ForConditionalGeneration, model_type "gemma4": its language
// model, the keys in text_config and the tensors under model.language_model; "gemma4_text": the
// text-only layout, Gemma4ForCausalLM). Layers by layer_types (default: every sixth whole-context,
// the others a sliding window of sliding_window; the last always whole-context, as Hugging Face
// forces it). Sliding layers: head_dim and num_key_value_heads, default RoPE with
// rope_parameters.sliding_attention's theta. Whole-context layers: global_head_dim and, with
// attention_k_eq_v, num_global_key_value_heads and no v_proj (the values are the keys'
// projection), "proportional" RoPE (rope_parameters.full_attention: theta^(-2i / global_head_dim)
// on the first partial_rotary_factor of the pairs of the whole head, the rest not turned). Every
// layer: q/k RMSNorm, values RMS-normed without weight, softmax scale 1; sandwich norms (the
// mixer's and the feed-forward block's outputs normed before their residual adds); a dense GeGLU
// MLP (intermediate_size) beside an MoE of num_experts routed experts (moe_intermediate_size,
// top_k_experts, GeGLU, stacked gate_up_proj / down_proj) whose router reads the residual stream
// RMS-normed times router.scale and hidden^-0.5, softmax, top-k renormalised, times
// per_expert_scale; the layer's output times layer_scalar. The embedding is scaled by
// sqrt(hidden_size), the lm_head tied, the logits soft-capped by final_logit_softcapping.
// Norm weights are plain (x * w). Per-layer embeddings (hidden_size_per_layer_input, which
// must say 0), shared KV layers (num_kv_shared_layers), bidirectional attention over text
// (use_bidirectional_attention "all"; "vision", as published, is causal over text) and a
// dense-only model are refused.
// The vision and audio towers are not run: their tensors are skipped.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/arch/recipes.h"
#include "common/util/status.h"

namespace tandem::model {
namespace {

using Json = nlohmann::json;

// A key Tandem does not run unless it has its neutral value (a number 0, false or null; or,
// where `absent_is_zero` is false, Hugging Face's default when absent is not neutral).
absl::Status RefuseUnlessZero(const ConfigReader& json, std::string_view key, std::string_view what,
                              bool absent_is_zero = true) {
  const Json* v = json.Find(key);
  if (v == nullptr && !absent_is_zero) {
    return FieldError(key, absl::StrCat("absent (Hugging Face's default: ", Sv(what),
                                        ") is not supported; give 0"));
  }
  if (v == nullptr || v->is_null() || (v->is_boolean() && !v->get<bool>()) ||
      (v->is_number() && v->get<double>() == 0)) {
    return absl::OkStatus();
  }
  return FieldError(key, absl::StrCat("(", v->dump(), ": ", Sv(what), ") is not supported"));
}

// rope_parameters[layer_type]: its theta, and for whole-context layers the share of the head's
// pairs that turn ("proportional") or all of them ("default").
struct RopeParams {
  double theta = 0;
  double partial = 1;
};
absl::StatusOr<RopeParams> ReadRope(const ConfigReader& json, std::string_view layer_type,
                                    double default_theta, bool proportional_allowed,
                                    double default_partial) {
  RopeParams p{default_theta, proportional_allowed ? default_partial : 1.0};
  const Json* all = json.Find("rope_parameters");
  if (all == nullptr || all->is_null()) return p;
  const std::string field = absl::StrCat("rope_parameters.", Sv(layer_type));
  if (!all->is_object()) return FieldError("rope_parameters", "must be an object");
  const auto it = all->find(std::string(layer_type));
  if (it == all->end() || it->is_null()) return p;
  if (!it->is_object()) return FieldError(field, "must be an object");
  const ConfigReader r(*it);
  ASSIGN_OR_RETURN(
      std::string type,
      r.OptionalString("rope_type", proportional_allowed ? "proportional" : "default"));
  if (type != "default" && !(proportional_allowed && type == "proportional")) {
    return FieldError(
        absl::StrCat(field, ".rope_type"),
        absl::StrCat("\"", type, "\" is not supported (",
                     proportional_allowed ? "\"default\" or \"proportional\"" : "\"default\"",
                     ")"));
  }
  ASSIGN_OR_RETURN(p.theta, r.OptionalDouble("rope_theta", default_theta));
  if (!(p.theta > 0) || !std::isfinite(p.theta)) {
    return FieldError(absl::StrCat(field, ".rope_theta"), "must be a positive number");
  }
  ASSIGN_OR_RETURN(double factor, r.OptionalDouble("factor", 1.0));
  if (factor != 1.0) {
    return FieldError(absl::StrCat(field, ".factor"), "other than 1 is not supported");
  }
  p.partial = 1.0;
  if (type == "proportional") {
    ASSIGN_OR_RETURN(p.partial, r.OptionalDouble("partial_rotary_factor", 1.0));
    if (!(p.partial > 0 && p.partial <= 1)) {
      return FieldError(absl::StrCat(field, ".partial_rotary_factor"), "must lie in (0, 1]");
    }
  }
  return p;
}

absl::Status Recipe(const ConfigReader& json, ModelConfig* c) {
  RETURN_IF_ERROR(RefuseUnlessZero(json, "hidden_size_per_layer_input", "per-layer embeddings",
                                   /*absent_is_zero=*/false));
  RETURN_IF_ERROR(RefuseUnlessZero(json, "num_kv_shared_layers", "layers sharing KV"));
  // "vision" (as published): image tokens attend both ways, text causally, so a text prompt
  // runs causal; "all" would make every token attend both ways.
  if (const Json* v = json.Find("use_bidirectional_attention");
      v != nullptr && !v->is_null() && *v != "vision") {
    return FieldError("use_bidirectional_attention",
                      absl::StrCat("(", v->dump(), ") is not supported (null or \"vision\")"));
  }
  RETURN_IF_ERROR(arch::NoAttentionBias(json, c));
  ASSIGN_OR_RETURN(bool moe, json.OptionalBool("enable_moe_block", false));
  if (!moe) {
    return FieldError("enable_moe_block",
                      "is false: a dense Gemma 4 is not an MoE, which is what Tandem serves");
  }
  ASSIGN_OR_RETURN(std::string act, json.OptionalString("hidden_activation", "gelu_pytorch_tanh"));
  if (act != "gelu_pytorch_tanh") {
    return FieldError("hidden_activation",
                      absl::StrCat("\"", act, "\" is not supported (\"gelu_pytorch_tanh\")"));
  }
  c->activation = Activation::kGeluTanh;
  c->norm_topk_prob = true;
  c->router.gemma = true;
  c->value_norm = true;
  c->attention_scale = 1.0;
  c->sandwich_norms = true;
  c->layer_scalar = true;
  c->embedding_scale = std::sqrt(static_cast<double>(c->hidden_size));
  // Gemma4TextConfig ties the lm_head to the embedding unless the config says otherwise.
  if (!json.Contains("tie_word_embeddings")) c->tie_word_embeddings = true;
  ASSIGN_OR_RETURN(c->dense_intermediate_size, json.RequiredSize("intermediate_size"));
  if (const Json* cap = json.Find("final_logit_softcapping"); cap != nullptr && !cap->is_null()) {
    ASSIGN_OR_RETURN(c->final_logit_softcap, json.OptionalDouble("final_logit_softcapping", 0));
    if (!(c->final_logit_softcap > 0) || !std::isfinite(c->final_logit_softcap)) {
      return FieldError("final_logit_softcapping", "must be a positive number or null");
    }
  }

  // Layers: sliding or whole-context, the last always whole-context.
  if (!json.Contains("sliding_window")) c->sliding_window = 512;  // Gemma4TextConfig's default
  if (c->sliding_window <= 0) return FieldError("sliding_window", "must be positive");
  std::vector<bool> sliding(c->num_hidden_layers);
  for (int64_t l = 0; l < c->num_hidden_layers; ++l) sliding[l] = (l + 1) % 6 != 0;
  RETURN_IF_ERROR(arch::LayerTypeWindows(json, std::move(sliding), c));
  c->layer_specs.back().window = 0;
  for (LayerSpec& spec : c->layer_specs) spec.ffn = FfnKind::kDenseAndMoe;

  // RoPE per layer type.
  ASSIGN_OR_RETURN(const RopeParams local,
                   ReadRope(json, "sliding_attention", 10000.0, /*proportional_allowed=*/false, 1));
  ASSIGN_OR_RETURN(const RopeParams global,
                   ReadRope(json, "full_attention", 1e6, /*proportional_allowed=*/true, 0.25));
  c->rope_theta = local.theta;

  // The whole-context layers' own shape.
  // Absent: Gemma4TextConfig's 512; null: the layers' own head_dim (Hugging Face's attention
  // falls back to it). ConfigReader reads null as absent, so null is told apart here.
  ASSIGN_OR_RETURN(int64_t global_head_dim, json.OptionalInt("global_head_dim", 512));
  if (json.Contains("global_head_dim") && !json.Has("global_head_dim")) {
    global_head_dim = c->head_dim;
  }
  ASSIGN_OR_RETURN(global_head_dim,
                   ConfigReader::CheckSize("global_head_dim", global_head_dim, int64_t{1} << 12));
  if (global_head_dim % 2 != 0) return FieldError("global_head_dim", "must be even");
  ASSIGN_OR_RETURN(bool k_eq_v, json.OptionalBool("attention_k_eq_v", false));
  int64_t global_kv_heads = c->num_key_value_heads;
  if (k_eq_v) {
    if (json.Has("num_global_key_value_heads")) {
      ASSIGN_OR_RETURN(global_kv_heads, json.RequiredSize("num_global_key_value_heads"));
    }
    if (c->num_attention_heads % global_kv_heads != 0) {
      return FieldError("num_global_key_value_heads",
                        absl::StrCat("(", global_kv_heads, ") must divide num_attention_heads (",
                                     c->num_attention_heads, ")"));
    }
  }
  if (c->num_attention_heads * global_head_dim > (int64_t{1} << 16)) {
    return FieldError("global_head_dim", "times num_attention_heads is too large");
  }
  c->global_attention = AttentionShape{
      .kv_heads = global_kv_heads,
      .head_dim = global_head_dim,
      .rotary_dim = global_head_dim,
      .rope_pairs = static_cast<int64_t>(global.partial * static_cast<double>(global_head_dim) /
                                         2),  // Hugging Face's int(p * hd // 2)
      .rope_theta = global.theta,
      .values_from_keys = k_eq_v,
  };
  return absl::OkStatus();
}

#define GEMMA4_LAYER(prefix, name) prefix "layers.{layer}." name
#define GEMMA4_NAMES(prefix)                                                                     \
  arch::TensorNames({                                                                            \
      {TensorKind::kTokenEmbedding, prefix "embed_tokens.weight"},                               \
      {TensorKind::kOutputNorm, prefix "norm.weight"},                                           \
      {TensorKind::kOutput, "lm_head.weight"},                                                   \
      {TensorKind::kAttnNorm, GEMMA4_LAYER(prefix, "input_layernorm.weight")},                   \
      {TensorKind::kAttnQ, GEMMA4_LAYER(prefix, "self_attn.q_proj.weight")},                     \
      {TensorKind::kAttnK, GEMMA4_LAYER(prefix, "self_attn.k_proj.weight")},                     \
      {TensorKind::kAttnV, GEMMA4_LAYER(prefix, "self_attn.v_proj.weight")},                     \
      {TensorKind::kAttnOut, GEMMA4_LAYER(prefix, "self_attn.o_proj.weight")},                   \
      {TensorKind::kAttnQNorm, GEMMA4_LAYER(prefix, "self_attn.q_norm.weight")},                 \
      {TensorKind::kAttnKNorm, GEMMA4_LAYER(prefix, "self_attn.k_norm.weight")},                 \
      {TensorKind::kPostAttnNorm, GEMMA4_LAYER(prefix, "post_attention_layernorm.weight")},      \
      {TensorKind::kFfnNorm, GEMMA4_LAYER(prefix, "pre_feedforward_layernorm.weight")},          \
      {TensorKind::kPostFfnNorm, GEMMA4_LAYER(prefix, "post_feedforward_layernorm.weight")},     \
      {TensorKind::kPostDenseNorm, GEMMA4_LAYER(prefix, "post_feedforward_layernorm_1.weight")}, \
      {TensorKind::kPreMoeNorm, GEMMA4_LAYER(prefix, "pre_feedforward_layernorm_2.weight")},     \
      {TensorKind::kPostMoeNorm, GEMMA4_LAYER(prefix, "post_feedforward_layernorm_2.weight")},   \
      {TensorKind::kLayerScalar, GEMMA4_LAYER(prefix, "layer_scalar")},                          \
      {TensorKind::kDenseGate, GEMMA4_LAYER(prefix, "mlp.gate_proj.weight")},                    \
      {TensorKind::kDenseUp, GEMMA4_LAYER(prefix, "mlp.up_proj.weight")},                        \
      {TensorKind::kDenseDown, GEMMA4_LAYER(prefix, "mlp.down_proj.weight")},                    \
      {TensorKind::kRouter, GEMMA4_LAYER(prefix, "router.proj.weight")},                         \
      {TensorKind::kRouterScale, GEMMA4_LAYER(prefix, "router.scale")},                          \
      {TensorKind::kRouterExpertScale, GEMMA4_LAYER(prefix, "router.per_expert_scale")},         \
      {TensorKind::kExpertsGateUp, GEMMA4_LAYER(prefix, "experts.gate_up_proj")},                \
      {TensorKind::kExpertsDown, GEMMA4_LAYER(prefix, "experts.down_proj")},                     \
      {TensorKind::kExpertGate, GEMMA4_LAYER(prefix, "experts.{expert}.gate_proj.weight")},      \
      {TensorKind::kExpertUp, GEMMA4_LAYER(prefix, "experts.{expert}.up_proj.weight")},          \
      {TensorKind::kExpertDown, GEMMA4_LAYER(prefix, "experts.{expert}.down_proj.weight")},      \
  })

constexpr ArchitectureSpec kGemma4{
    .model_type = "gemma4",
    .num_experts_key = "num_experts",
    .intermediate_size_key = "moe_intermediate_size",
    .default_rope_theta = 10000.0,
    .default_rms_norm_eps = 1e-6,
    .default_use_sliding_window = true,
    .tensor_names = GEMMA4_NAMES("model.language_model."),
    .text_config_key = "text_config",
    .ignored_prefixes = {"model.vision_tower.", "model.embed_vision.", "model.audio_tower.",
                         "model.embed_audio."},
    .experts_per_tok_key = "top_k_experts",
    .recipe = Recipe,
};

constexpr ArchitectureSpec kGemma4Text{
    .model_type = "gemma4_text",
    .num_experts_key = "num_experts",
    .intermediate_size_key = "moe_intermediate_size",
    .default_rope_theta = 10000.0,
    .default_rms_norm_eps = 1e-6,
    .default_use_sliding_window = true,
    .tensor_names = GEMMA4_NAMES("model."),
    .experts_per_tok_key = "top_k_experts",
    .recipe = Recipe,
};

#undef GEMMA4_NAMES
#undef GEMMA4_LAYER

}  // namespace

const ArchitectureSpec& Gemma4Architecture() { return kGemma4; }
const ArchitectureSpec& Gemma4TextArchitecture() { return kGemma4Text; }

}  // namespace tandem::model
