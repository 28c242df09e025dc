// Qwen3.5 / Qwen3.6-MoE (Hugging Face's Qwen3_5MoeForConditionalGeneration, model_type
// "qwen3_5_moe": its language model, the keys in text_config and the tensors under
// model.language_model; "qwen3_5_moe_text": the text-only layout, Qwen3_5MoeForCausalLM): a
// hybrid whose layers are Gated DeltaNet ("linear_attention", a per-sequence recurrent state)
// or gated full attention ("full_attention"), by layer_types or every
// full_attention_interval-th layer (default 4); every layer an MoE of num_experts routed
// experts (softmax top-k, always renormalised) plus a sigmoid-gated shared expert. Attention:
// q_proj emits [q | gate] per head (attn_output_gate), per-head q/k RMSNorm, RoPE over the
// first partial_rotary_factor of head_dim (rope_parameters; a text prompt's mRoPE positions are
// all equal, so mrope_section does not change it). RMSNorm weights are zero-centred (1 + w),
// except the DeltaNet's own. Experts are stacked per layer as published, or per expert. The
// vision tower (model.visual.*) and the multi-token-prediction head (mtp.*) are not run: their
// tensors are skipped.
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/arch/recipes.h"
#include "common/util/status.h"

namespace tandem::model {
namespace {

using Json = nlohmann::json;

absl::Status Recipe(const ConfigReader& json, ModelConfig* c) {
  c->norm_topk_prob = true;  // the router renormalises whatever norm_topk_prob says
  c->zero_centred_norms = true;
  RETURN_IF_ERROR(arch::AttentionBias(json, "attention_bias", /*fallback=*/false,
                                      /*covers_output=*/true, c));
  ASSIGN_OR_RETURN(c->attention_output_gate, json.OptionalBool("attn_output_gate", true));
  RETURN_IF_ERROR(arch::SharedExpert(json, "shared_expert_intermediate_size", /*gated=*/true, c));
  if (!c->HasSharedExpert()) {
    return FieldError("shared_expert_intermediate_size", "is required by qwen3_5_moe");
  }

  // RoPE: rope_parameters (or the older top-level keys).
  double theta = c->rope_theta;
  double partial = 0.25;
  ASSIGN_OR_RETURN(partial, json.OptionalDouble("partial_rotary_factor", partial));
  if (const Json* rope = json.Find("rope_parameters"); rope != nullptr) {
    if (!rope->is_object()) return FieldError("rope_parameters", "must be an object");
    const ConfigReader r(*rope);
    ASSIGN_OR_RETURN(std::string type, r.OptionalString("rope_type", "default"));
    if (type != "default") {
      return FieldError("rope_parameters.rope_type",
                        absl::StrCat("\"", type, "\" is not supported (only \"default\")"));
    }
    ASSIGN_OR_RETURN(theta, r.OptionalDouble("rope_theta", theta));
    ASSIGN_OR_RETURN(partial, r.OptionalDouble("partial_rotary_factor", partial));
  }
  if (!(theta > 0)) return FieldError("rope_parameters.rope_theta", "must be positive");
  c->rope_theta = theta;
  const double rotary = static_cast<double>(c->head_dim) * partial;
  const int64_t rotary_dim = static_cast<int64_t>(rotary);
  if (!(partial > 0 && partial <= 1) || rotary_dim % 2 != 0 || rotary_dim == 0) {
    return FieldError(
        "partial_rotary_factor",
        absl::StrCat("(", partial, ") must leave an even, positive share of head_dim ",
                     c->head_dim));
  }
  c->rotary_dim = rotary_dim;

  // The DeltaNet's shape (Hugging Face's defaults where absent).
  DeltaNetConfig& d = c->linear;
  ASSIGN_OR_RETURN(d.num_key_heads, json.OptionalInt("linear_num_key_heads", 16));
  ASSIGN_OR_RETURN(d.num_value_heads, json.OptionalInt("linear_num_value_heads", 32));
  ASSIGN_OR_RETURN(d.key_head_dim, json.OptionalInt("linear_key_head_dim", 128));
  ASSIGN_OR_RETURN(d.value_head_dim, json.OptionalInt("linear_value_head_dim", 128));
  ASSIGN_OR_RETURN(d.conv_kernel, json.OptionalInt("linear_conv_kernel_dim", 4));
  for (auto [key, value] : {std::pair{"linear_num_key_heads", d.num_key_heads},
                            std::pair{"linear_num_value_heads", d.num_value_heads},
                            std::pair{"linear_key_head_dim", d.key_head_dim},
                            std::pair{"linear_value_head_dim", d.value_head_dim}}) {
    RETURN_IF_ERROR(ConfigReader::CheckSize(key, value, int64_t{1} << 16).status());
  }
  RETURN_IF_ERROR(ConfigReader::CheckSize("linear_conv_kernel_dim", d.conv_kernel, 64).status());
  if (d.num_value_heads % d.num_key_heads != 0) {
    return FieldError("linear_num_value_heads", absl::StrCat("(", d.num_value_heads,
                                                             ") must be a multiple of "
                                                             "linear_num_key_heads (",
                                                             d.num_key_heads, ")"));
  }
  // The recurrent state is kept in float32, as the published config asks.
  ASSIGN_OR_RETURN(std::string state_dtype, json.OptionalString("mamba_ssm_dtype", "float32"));
  if (state_dtype != "float32") {
    return FieldError("mamba_ssm_dtype",
                      absl::StrCat("\"", state_dtype, "\" is not supported (float32 only)"));
  }

  // Which layers are DeltaNet and which full attention.
  c->layer_specs.assign(c->num_hidden_layers, LayerSpec{});
  if (const Json* types = json.Find("layer_types"); types != nullptr) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c->num_hidden_layers) {
      return FieldError("layer_types", absl::StrCat("must be an array of num_hidden_layers (",
                                                    c->num_hidden_layers, ") layer types"));
    }
    for (size_t l = 0; l < types->size(); ++l) {
      const Json& type = (*types)[l];
      if (type == "linear_attention") {
        c->layer_specs[l].mixer = MixerKind::kGatedDeltaNet;
      } else if (type != "full_attention") {
        return FieldError("layer_types",
                          absl::StrCat("[", l, "] is ", type.dump(),
                                       ": only \"linear_attention\" and \"full_attention\""));
      }
    }
  } else {
    ASSIGN_OR_RETURN(int64_t interval, json.OptionalInt("full_attention_interval", 4));
    if (interval < 1) return FieldError("full_attention_interval", "must be at least 1");
    for (int64_t l = 0; l < c->num_hidden_layers; ++l) {
      if ((l + 1) % interval != 0) c->layer_specs[l].mixer = MixerKind::kGatedDeltaNet;
    }
  }
  if (c->NumLayers(MixerKind::kGatedDeltaNet) == 0) c->linear = DeltaNetConfig{};
  return arch::NoDenseLayers(json, c);
}

#define QWEN35_LAYER(prefix, rest) prefix "layers.{layer}." rest

#define QWEN35_NAMES(prefix)                                                                    \
  arch::TensorNames({                                                                           \
      {TensorKind::kTokenEmbedding, prefix "embed_tokens.weight"},                              \
      {TensorKind::kOutputNorm, prefix "norm.weight"},                                          \
      {TensorKind::kOutput, "lm_head.weight"},                                                  \
      {TensorKind::kAttnNorm, QWEN35_LAYER(prefix, "input_layernorm.weight")},                  \
      {TensorKind::kAttnQ, QWEN35_LAYER(prefix, "self_attn.q_proj.weight")},                    \
      {TensorKind::kAttnK, QWEN35_LAYER(prefix, "self_attn.k_proj.weight")},                    \
      {TensorKind::kAttnV, QWEN35_LAYER(prefix, "self_attn.v_proj.weight")},                    \
      {TensorKind::kAttnOut, QWEN35_LAYER(prefix, "self_attn.o_proj.weight")},                  \
      {TensorKind::kAttnQNorm, QWEN35_LAYER(prefix, "self_attn.q_norm.weight")},                \
      {TensorKind::kAttnKNorm, QWEN35_LAYER(prefix, "self_attn.k_norm.weight")},                \
      {TensorKind::kAttnQBias, QWEN35_LAYER(prefix, "self_attn.q_proj.bias")},                  \
      {TensorKind::kAttnKBias, QWEN35_LAYER(prefix, "self_attn.k_proj.bias")},                  \
      {TensorKind::kAttnVBias, QWEN35_LAYER(prefix, "self_attn.v_proj.bias")},                  \
      {TensorKind::kAttnOutBias, QWEN35_LAYER(prefix, "self_attn.o_proj.bias")},                \
      {TensorKind::kFfnNorm, QWEN35_LAYER(prefix, "post_attention_layernorm.weight")},          \
      {TensorKind::kRouter, QWEN35_LAYER(prefix, "mlp.gate.weight")},                           \
      {TensorKind::kExpertGate, QWEN35_LAYER(prefix, "mlp.experts.{expert}.gate_proj.weight")}, \
      {TensorKind::kExpertUp, QWEN35_LAYER(prefix, "mlp.experts.{expert}.up_proj.weight")},     \
      {TensorKind::kExpertDown, QWEN35_LAYER(prefix, "mlp.experts.{expert}.down_proj.weight")}, \
      {TensorKind::kExpertsGateUp, QWEN35_LAYER(prefix, "mlp.experts.gate_up_proj")},           \
      {TensorKind::kExpertsDown, QWEN35_LAYER(prefix, "mlp.experts.down_proj")},                \
      {TensorKind::kSharedGate, QWEN35_LAYER(prefix, "mlp.shared_expert.gate_proj.weight")},    \
      {TensorKind::kSharedUp, QWEN35_LAYER(prefix, "mlp.shared_expert.up_proj.weight")},        \
      {TensorKind::kSharedDown, QWEN35_LAYER(prefix, "mlp.shared_expert.down_proj.weight")},    \
      {TensorKind::kSharedExpertGate, QWEN35_LAYER(prefix, "mlp.shared_expert_gate.weight")},   \
      {TensorKind::kLinearQkv, QWEN35_LAYER(prefix, "linear_attn.in_proj_qkv.weight")},         \
      {TensorKind::kLinearZ, QWEN35_LAYER(prefix, "linear_attn.in_proj_z.weight")},             \
      {TensorKind::kLinearB, QWEN35_LAYER(prefix, "linear_attn.in_proj_b.weight")},             \
      {TensorKind::kLinearA, QWEN35_LAYER(prefix, "linear_attn.in_proj_a.weight")},             \
      {TensorKind::kLinearConv, QWEN35_LAYER(prefix, "linear_attn.conv1d.weight")},             \
      {TensorKind::kLinearALog, QWEN35_LAYER(prefix, "linear_attn.A_log")},                     \
      {TensorKind::kLinearDtBias, QWEN35_LAYER(prefix, "linear_attn.dt_bias")},                 \
      {TensorKind::kLinearNorm, QWEN35_LAYER(prefix, "linear_attn.norm.weight")},               \
      {TensorKind::kLinearOut, QWEN35_LAYER(prefix, "linear_attn.out_proj.weight")},            \
  })

constexpr ArchitectureSpec kQwen35Moe{
    .model_type = "qwen3_5_moe",
    .num_experts_key = "num_experts",
    .intermediate_size_key = "moe_intermediate_size",
    .default_rope_theta = 10000.0,
    .default_rms_norm_eps = 1e-6,
    .default_use_sliding_window = false,
    .tensor_names = QWEN35_NAMES("model.language_model."),
    .text_config_key = "text_config",
    .ignored_prefixes = {"model.visual.", "mtp."},
    .recipe = Recipe,
};

constexpr ArchitectureSpec kQwen35MoeText{
    .model_type = "qwen3_5_moe_text",
    .num_experts_key = "num_experts",
    .intermediate_size_key = "moe_intermediate_size",
    .default_rope_theta = 10000.0,
    .default_rms_norm_eps = 1e-6,
    .default_use_sliding_window = false,
    .tensor_names = QWEN35_NAMES("model."),
    .text_config_key = "",
    .ignored_prefixes = {"mtp.", ""},
    .recipe = Recipe,
};

}  // namespace

const ArchitectureSpec& Qwen35MoeArchitecture() { return kQwen35Moe; }
const ArchitectureSpec& Qwen35MoeTextArchitecture() { return kQwen35MoeText; }

}  // namespace tandem::model
