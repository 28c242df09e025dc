// Model configuration: a Hugging Face config.json parsed into ModelConfig, and the
// architecture table that says, per MoE family, what its config keys mean, what the
// checkpoint's tensors are called and what each layer is made of. Adding an architecture is a
// file in common/model/arch (its table entry and recipe, composed from the blocks the engine
// has) and its line in the table (arch/architectures.cc), not a new code path.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::model {

// The weights of a decoder-only MoE transformer, by role. Per-layer kinds take a layer index;
// expert kinds take a layer and an expert index.
enum class TensorKind {
  kTokenEmbedding,    // (vocab, hidden)
  kOutputNorm,        // (hidden)
  kOutput,            // (vocab, hidden); absent when tie_word_embeddings
  kAttnNorm,          // (hidden)
  kAttnQ,             // (heads*head_dim, hidden)
  kAttnK,             // (kv_heads*head_dim, hidden)
  kAttnV,             // (kv_heads*head_dim, hidden)
  kAttnOut,           // (hidden, heads*head_dim)
  kAttnQNorm,         // (head_dim); per-head RMSNorm of q, only where the architecture has it
  kAttnKNorm,         // (head_dim)
  kAttnQBias,         // (heads*head_dim); only when the config says the projections have bias
  kAttnKBias,         // (kv_heads*head_dim)
  kAttnVBias,         // (kv_heads*head_dim)
  kAttnOutBias,       // (hidden)
  kFfnNorm,           // (hidden)
  kRouter,            // (experts, hidden); sparse layers only
  kExpertGate,        // (intermediate, hidden)   w1 / gate_proj
  kExpertUp,          // (intermediate, hidden)   w3 / up_proj
  kExpertDown,        // (hidden, intermediate)   w2 / down_proj
  kSharedGate,        // (shared_intermediate, hidden); the always-on shared expert (Qwen2-MoE)
  kSharedUp,          // (shared_intermediate, hidden)
  kSharedDown,        // (hidden, shared_intermediate)
  kSharedExpertGate,  // (1, hidden): the shared expert's output scales by sigmoid(gate . x)
  kDenseGate,         // (dense_intermediate, hidden); dense MLP layers only
  kDenseUp,           // (dense_intermediate, hidden)
  kDenseDown,         // (hidden, dense_intermediate)
  // Routed experts stored stacked, one tensor per layer (Qwen3.5-MoE as published), read as
  // the per-expert kinds above: an expert's gate rows then its up rows, and its down matrix.
  kExpertsGateUp,  // (experts, 2 * intermediate, hidden)
  kExpertsDown,    // (experts, hidden, intermediate)
  // A Gated DeltaNet layer (linear attention): key_dim = linear key heads x key head dim,
  // value_dim likewise, conv_dim = 2 * key_dim + value_dim.
  kLinearQkv,     // (conv_dim, hidden): [Q | K | V] before the convolution
  kLinearZ,       // (value_dim, hidden): the output gate
  kLinearB,       // (value heads, hidden): beta = sigmoid(b)
  kLinearA,       // (value heads, hidden): the decay's input
  kLinearConv,    // (conv_dim, 1, kernel): causal depthwise convolution
  kLinearALog,    // (value heads): g = -exp(A_log) * softplus(a + dt_bias)
  kLinearDtBias,  // (value heads)
  kLinearNorm,    // (value head dim): RMSNorm of each head's output (plain, not zero-centred)
  kLinearOut,     // (hidden, value_dim)
  // Multi-head latent attention (DeepSeek-V2/V3; LatentAttentionConfig's shape). kAttnQ is
  // q_proj (heads*qk_head_dim, hidden) where the queries have no low-rank step.
  kAttnQA,       // (q_lora_rank, hidden): q_a_proj
  kAttnQANorm,   // (q_lora_rank): q_a_layernorm
  kAttnQB,       // (heads*qk_head_dim, q_lora_rank): q_b_proj
  kAttnKvA,      // (kv_lora_rank + qk_rope_head_dim, hidden): kv_a_proj_with_mqa
  kAttnKvANorm,  // (kv_lora_rank): kv_a_layernorm
  kAttnKvB,      // (heads*(qk_nope_head_dim + v_head_dim), kv_lora_rank): kv_b_proj
  kRouterBias,   // (experts): e_score_correction_bias (RouterConfig::selection_bias), or the
                 // router's own bias on its logits (RouterConfig::logit_bias: gpt-oss)
  // gpt-oss: a learned logit per head in every softmax (attention sinks), and biases on the
  // experts' projections (ModelConfig::expert_bias), per expert or stacked like the experts.
  kAttnSinks,          // (heads)
  kExpertGateBias,     // (intermediate)
  kExpertUpBias,       // (intermediate)
  kExpertDownBias,     // (hidden)
  kExpertsGateUpBias,  // (experts, 2 * intermediate), laid out as kExpertsGateUp's columns
  kExpertsDownBias,    // (experts, hidden)
  // Gemma 4: sandwich norms (the mixer's and the feed-forward block's outputs RMS-normed before
  // their residual adds), the norms of a layer whose dense MLP and MoE run side by side
  // (FfnKind::kDenseAndMoe), the router's input scale and per-expert output scale, and a scalar
  // on the whole layer's output.
  kPostAttnNorm,       // (hidden): post_attention_layernorm
  kPostFfnNorm,        // (hidden): post_feedforward_layernorm
  kPostDenseNorm,      // (hidden): post_feedforward_layernorm_1, after the dense MLP
  kPreMoeNorm,         // (hidden): pre_feedforward_layernorm_2, the experts' input
  kPostMoeNorm,        // (hidden): post_feedforward_layernorm_2, after the experts
  kRouterScale,        // (hidden): the router's input, RMS-normed without weight, times this
  kRouterExpertScale,  // (experts): each chosen expert's weight times this (per_expert_scale)
  kLayerScalar,        // (1): the layer's output (the residual stream) times this
};
inline constexpr int kNumTensorKinds = static_cast<int>(TensorKind::kLayerScalar) + 1;

class ConfigReader;  // common/model/config_reader.h
struct ModelConfig;

// One MoE family: a table entry (its config keys, Hugging Face's defaults, its tensor names) and
// a recipe (common/model/arch/<model_type>.cc) that reads the keys only it has and says what
// each layer is made of. Name patterns use "{layer}" and "{expert}"; an empty pattern means
// the architecture has no such tensor.
struct ArchitectureSpec {
  std::string_view model_type;             // config.json "model_type", e.g. "mixtral"
  std::string_view num_experts_key;        // "num_local_experts" (Mixtral), "num_experts"
  std::string_view intermediate_size_key;  // the expert FFN width's key
  // Hugging Face's defaults where config.json has no such key.
  double default_rope_theta;
  double default_rms_norm_eps;
  bool default_use_sliding_window;
  std::array<std::string_view, kNumTensorKinds> tensor_names;  // indexed by TensorKind
  // config.json's object holding the text model's keys ("text_config" for a multimodal
  // checkpoint's language model; "": the top level).
  std::string_view text_config_key = "";
  // Checkpoint tensors the engine does not use, by name prefix (a multimodal checkpoint's
  // vision tower, multi-token-prediction heads): skipped by the loader, which says so.
  std::array<std::string_view, 4> ignored_prefixes = {};
  // Layers past num_hidden_layers under this prefix are skipped too (DeepSeek-V3's
  // multi-token-prediction layers, model.layers.{num_hidden_layers}.*); empty: none.
  std::string_view extra_layers_prefix = "";
  // How stacked experts are stored: kExpertsGateUp (experts, 2 * intermediate, hidden), an
  // expert's gate rows then its up rows, and kExpertsDown (experts, hidden, intermediate)
  // (Qwen3.5); or, interleaved, as x @ W: kExpertsGateUp (experts, hidden, 2 * intermediate)
  // with gate and up in alternate columns (gate first) and kExpertsDown (experts, intermediate,
  // hidden) (gpt-oss, whose MXFP4 blocks hold the same matrices a row per output).
  bool stacked_interleaved = false;
  // The key of the experts a token is routed to ("top_k_experts": Gemma 4).
  std::string_view experts_per_tok_key = "num_experts_per_tok";
  // Reads the architecture's own keys into `config`, whose common fields (sizes, heads,
  // experts, RoPE, norms, token ids) are already parsed: routing (norm_topk_prob), attention
  // bias, shared experts, and layer_specs (which layers are dense); refuses, naming the key,
  // what the architecture does not have.
  absl::Status (*recipe)(const ConfigReader& config_json, ModelConfig* config);
};

// All known architectures; the table is the single source of per-architecture facts.
const std::vector<const ArchitectureSpec*>& Architectures();
// The entry for `model_type`; INVALID_ARGUMENT listing the known ones when there is none.
absl::StatusOr<const ArchitectureSpec*> FindArchitecture(std::string_view model_type);
const ArchitectureSpec& MixtralArchitecture();

// Weights stored as integer levels with one float16 scale per group of input columns, as
// `tandem quantize` writes them (docs/quantization.md); config.json's "quantization_config":
//   {"quant_method": "tandem", "bits": 8 | 4, "group_size": 32 | 64 | 128,
//    "modules": ["experts", "attention", "shared_expert", "dense_mlp", "lm_head"]}
// (modules: which matrices are quantized; routers, the embedding and norms never are, and an
// lm_head only where it is not tied to the embedding).
struct QuantizationConfig {
  int bits = 0;  // 0: no quantized weights
  int group_size = 0;
  bool experts = false;        // routed experts' gate, up and down projections
  bool attention = false;      // q, k, v and o projections
  bool shared_expert = false;  // the shared expert's gate, up and down (not its scalar gate)
  bool dense_mlp = false;      // dense MLP layers
  bool lm_head = false;        // the output projection (not with tied embeddings)
  // The lm_head's own bits (8 or 4; 0: `bits`), as llama.cpp keeps a 4-bit model's output
  // matrix at 6 bits: "lm_head_bits" in quantization_config.
  int lm_head_bits = 0;
  // A checkpoint quantized by another method Tandem parses but cannot load (DeepSeek-V3 as
  // published: "fp8", e4m3 in 128 x 128 blocks); empty otherwise. Its dims serve (a dummy of its
  // shape runs); ModelWeights::Load refuses its weights, naming the method.
  std::string unsupported_method = "";
  // The routed experts are stored as MXFP4 (gpt-oss as published, quant_method "mxfp4": E2M1
  // values, two a byte low nibble first, and an E8M0 exponent per 32, as <stacked name>_blocks
  // (experts, rows, cols / 32, 16) and _scales (experts, rows, cols / 32)); they load as int8
  // groups of 32 (bits 8, group_size 32, experts), which hold every MXFP4 value exactly: twice
  // an E2M1 value is an integer in [-12, 12], its scale 2^(exponent - 128).
  bool mxfp4 = false;

  bool Quantizes(TensorKind kind) const;
  // The bits of a quantized tensor of `kind`.
  int BitsOf(TensorKind kind) const {
    return kind == TensorKind::kOutput && lm_head_bits != 0 ? lm_head_bits : bits;
  }
};

// What one layer is made of: the blocks the forward pass composes (common/engine/layers), each
// after its RMSNorm with a residual add: a token mixer, then a feed-forward block.
enum class MixerKind {
  kAttention,        // grouped-query attention over the paged KV cache
  kGatedDeltaNet,    // linear attention with a fixed-size recurrent state per sequence
  kLatentAttention,  // multi-head latent attention: a latent and one rotary key cached a token
};
enum class FfnKind {
  kMoe,       // router, routed experts, and the shared expert where the model has one
  kDenseMlp,  // one gated MLP of dense_intermediate_size on every token
  // Gemma 4: the dense MLP on the block's normed input and the MoE on the residual stream,
  // side by side, each with its own norms (kPostDenseNorm; kPreMoeNorm, kPostMoeNorm), summed.
  kDenseAndMoe,
};
struct LayerSpec {
  MixerKind mixer = MixerKind::kAttention;
  FfnKind ffn = FfnKind::kMoe;
  // Attention over the last `window` positions only (a sliding window, each query's own
  // included); 0: the whole context.
  int64_t window = 0;
};

// A Gated DeltaNet's shape (Qwen3.5's linear_* keys).
struct DeltaNetConfig {
  int64_t num_key_heads = 0;
  int64_t num_value_heads = 0;  // a multiple of num_key_heads: each key head serves the ratio
  int64_t key_head_dim = 0;
  int64_t value_head_dim = 0;
  int64_t conv_kernel = 0;

  int64_t key_dim() const { return num_key_heads * key_head_dim; }
  int64_t value_dim() const { return num_value_heads * value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  // Bytes of one layer's state per sequence, float32: the convolution's last kernel - 1
  // inputs per channel, then the recurrent state (value heads x key head dim x value head dim).
  int64_t state_bytes() const {
    return 4 * (conv_dim() * (conv_kernel - 1) + num_value_heads * key_head_dim * value_head_dim);
  }
};

// Multi-head latent attention's shape (DeepSeek-V2/V3's keys). Keys and values of every head
// come from one latent per token (kv_lora_rank values, RMS-normed) and one rotary key shared by
// the heads: what the cache holds (cache_dim() values a token and layer).
struct LatentAttentionConfig {
  int64_t q_lora_rank = 0;  // 0: q_proj reads the hidden state (no q_a_proj / q_b_proj)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t cache_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

// One attention layer's shape (ModelConfig::LayerAttention): its KV heads and head dim, where its
// values come from and how RoPE turns its heads.
struct AttentionShape {
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  // RoPE turns the first rotary_dim of each head, pairing (i, i + rotary_dim / 2) (or (2i, 2i + 1)
  // with rope_interleaved); of its rotary_dim / 2 pairs only the first rope_pairs have a
  // frequency, the others pass through (Gemma 4's "proportional" RoPE: rotary_dim is head_dim and
  // rope_pairs its partial_rotary_factor share).
  int64_t rotary_dim = 0;
  int64_t rope_pairs = 0;
  double rope_theta = 0;
  // No v_proj: the values are the keys' projection before their norm and RoPE (Gemma 4's
  // attention_k_eq_v).
  bool values_from_keys = false;
};

// RoPE's frequencies (config.json "rope_scaling"): the default theta^(-2i/d), or YaRN's blend of
// those (extrapolated, the fast ones) and those divided by `factor` (interpolated, the slow
// ones), ramped between the dimensions that turn beta_fast and beta_slow times over
// original_max_position_embeddings (Hugging Face's _compute_yarn_parameters).
struct RopeScaling {
  enum class Kind { kDefault, kYarn };
  Kind kind = Kind::kDefault;
  double factor = 1;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32;
  double beta_slow = 1;
  // DeepSeek's attention scale factor: softmax scale * (0.1 * mscale_all_dim * ln(factor) + 1)^2;
  // 0: none.
  double mscale_all_dim = 0;
  // YaRN's scale of cos and sin (Hugging Face's attention_factor; gpt-oss's 1 + 0.1 ln(factor)):
  // with RoPE over the whole head it scales every query and key, so the engine applies its
  // square to the softmax scale (ModelConfig::AttentionScale).
  double attention_factor = 1;
  bool truncate = true;  // correction range rounded to whole dimensions
};

// How a router turns its logits into experts and weights (kernels::RouteSpec).
struct RouterConfig {
  bool sigmoid = false;         // scores: sigmoid (DeepSeek-V3's scoring_func) or softmax
  bool selection_bias = false;  // e_score_correction_bias (kRouterBias), for choosing only
  int64_t groups = 1;           // n_group: experts chosen within the best topk_group groups
  int64_t top_groups = 1;
  bool group_top_two = false;  // a group's score: its best two (noaux_tc) or its best
  double scaling = 1;          // routed_scaling_factor
  bool logit_bias = false;     // the router's bias (kRouterBias) added to its logits (gpt-oss)
  // Gemma 4: the router reads the residual stream, RMS-normed without weight, times kRouterScale
  // and hidden_size^-0.5 (not the block's normed input), and each chosen expert's weight is
  // multiplied by its kRouterExpertScale after renormalising.
  bool gemma = false;
};

// The gated MLPs' activation (dense MLPs, shared and routed experts): act(gate) * up.
enum class Activation {
  kSilu,      // SwiGLU
  kGeluTanh,  // GeGLU with the tanh approximation (Hugging Face's gelu_pytorch_tanh: Gemma)
};

// How a checkpoint stores routed experts: a tensor per expert and projection, or stacked per
// layer (kExpertsGateUp, kExpertsDown), as the checkpoint holds them.
enum class ExpertLayout { kPerExpert, kStacked };

// How a checkpoint stores a tensor.
enum class TensorStorage {
  kFloat,        // BF16, F16 or F32, the shape as given
  kInt8,         // I8 levels, the weight's shape (rows, cols)
  kInt4,         // U8, two levels a byte (low nibble first, each + 8): (rows, cols / 2)
  kScale,        // F16 scales of a quantized weight: (rows, cols / group_size)
  kMxfp4Blocks,  // U8 E2M1 pairs (experts, rows, cols / 32, 16)
  kMxfp4Scales,  // U8 E8M0 exponents (experts, rows, cols / 32)
};

// A parsed config.json. Sizes are validated by ParseModelConfig: all positive,
// hidden_size == num_attention_heads * head_dim unless head_dim was given explicitly,
// num_attention_heads % num_key_value_heads == 0, num_experts_per_tok <= num_local_experts.
struct ModelConfig {
  const ArchitectureSpec* arch = &MixtralArchitecture();  // never null; static storage
  std::vector<std::string> architectures;  // config.json "architectures" (informational)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;        // per-expert FFN width (Qwen: moe_intermediate_size)
  int64_t dense_intermediate_size = 0;  // dense MLP layers' width; 0 when there are none
  int64_t shared_expert_intermediate_size = 0;  // 0: no shared expert
  // Whether the shared expert's output scales by sigmoid(shared_expert_gate . x) (Qwen2-MoE)
  // or is added as it is (DeepSeek-MoE).
  bool shared_expert_gated = true;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  // RoPE turns the first rotary_dim of each head (head_dim unless partial_rotary_factor says
  // less); the rest passes through.
  int64_t rotary_dim = 0;
  // Attention's q_proj emits [q | gate] per head and the output is scaled by sigmoid(gate)
  // before o_proj (Qwen3.5's attn_output_gate).
  bool attention_output_gate = false;
  // RMSNorm weights are stored centred on zero: the engine scales by 1 + w (Qwen3.5).
  bool zero_centred_norms = false;
  DeltaNetConfig linear;      // Gated DeltaNet layers' shape; zero without such layers
  LatentAttentionConfig mla;  // latent attention layers' shape; zero without such layers
  RopeScaling rope_scaling;
  // RoPE pairs a head's dimensions (2i, 2i + 1) rather than (i, i + rotary_dim / 2) (DeepSeek's
  // rotary keys and queries).
  bool rope_interleaved = false;
  RouterConfig router;
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t max_position_embeddings = 0;
  // The sliding window config.json gives (0: none, null or absent); which layers it applies to
  // is the recipe's (LayerSpec::window).
  int64_t sliding_window = 0;
  double rope_theta = 1e6;
  double rms_norm_eps = 1e-5;
  int32_t bos_token_id = -1;           // -1 when config.json has none
  int32_t eos_token_id = -1;           // the first when config.json lists several; -1: none
  std::vector<int32_t> eos_token_ids;  // all of them
  bool tie_word_embeddings = false;
  bool norm_topk_prob = true;
  bool attention_qkv_bias = false;  // q, k and v projections have bias
  bool attention_out_bias = false;  // o_proj has bias
  // Each head's softmax has one more logit, a learned sink (kAttnSinks), whose share of the
  // mass is dropped (gpt-oss).
  bool attention_sinks = false;
  // The experts' projections have biases (kExpertGateBias, ...), and their activation is
  // gpt-oss's clamped SwiGLU, (clamp(up, -limit, limit) + 1) * g * sigmoid(1.702 g) with
  // g = min(gate, limit), where swiglu_limit > 0 (0: silu(gate) * up).
  bool expert_bias = false;
  double swiglu_limit = 0;
  Activation activation = Activation::kSilu;
  // Gemma 4's options: the whole-context attention layers' own shape (head_dim 0: they have the
  // model's); values RMS-normed without weight (v_norm); the softmax scale where it is not
  // 1 / sqrt(head_dim) (0: that); sandwich norms (kPostAttnNorm, kPostFfnNorm); a scalar on each
  // layer's output (kLayerScalar); the embedding times embedding_scale (0: none); the logits
  // soft-capped, cap * tanh(logits / cap) (0: none).
  AttentionShape global_attention;
  bool value_norm = false;
  double attention_scale = 0;
  bool sandwich_norms = false;
  bool layer_scalar = false;
  double embedding_scale = 0;
  double final_logit_softcap = 0;
  // Per layer, as the architecture's recipe composes it; empty: every layer is attention then
  // MoE.
  std::vector<LayerSpec> layer_specs;
  std::string torch_dtype;  // "bfloat16", "float16", "float32", or empty when absent
  QuantizationConfig quantization;

  std::string_view model_type() const { return arch->model_type; }
  FfnKind Ffn(int layer) const {
    return layer_specs.empty() ? FfnKind::kMoe : layer_specs[static_cast<size_t>(layer)].ffn;
  }
  // Whether layer `layer` routes tokens to experts (an MoE, alone or beside a dense MLP).
  bool IsSparseLayer(int layer) const { return Ffn(layer) != FfnKind::kDenseMlp; }
  // Whether layer `layer` runs a dense MLP (alone or beside an MoE).
  bool HasDenseMlp(int layer) const { return Ffn(layer) != FfnKind::kMoe; }
  bool HasDenseLayers() const;
  bool HasSharedExpert() const { return shared_expert_intermediate_size > 0; }
  bool HasQkNorm() const;
  MixerKind Mixer(int layer) const {
    return layer_specs.empty() ? MixerKind::kAttention
                               : layer_specs[static_cast<size_t>(layer)].mixer;
  }
  // Layer `layer`'s sliding window (0: it attends over the whole context).
  int64_t LayerWindow(int layer) const {
    return layer_specs.empty() ? 0 : layer_specs[static_cast<size_t>(layer)].window;
  }
  // Layers of each mixer kind.
  int NumLayers(MixerKind kind) const;
  // Bytes of a sequence's state in every recurrent layer (0 without such layers).
  int64_t RecurrentStateBytes() const {
    return NumLayers(MixerKind::kGatedDeltaNet) * linear.state_bytes();
  }
  // Layers whose mixer keeps paged K/V (attention, latent attention).
  int NumKvLayers() const {
    return NumLayers(MixerKind::kAttention) + NumLayers(MixerKind::kLatentAttention);
  }
  // Whether layer `layer` is a whole-context layer of a model whose whole-context layers have
  // a shape of their own (global_attention).
  bool HasGlobalAttention(int layer) const;
  // Attention layer `layer`'s shape: the model's heads, or the whole-context layers' own
  // (global_attention) where it has them.
  AttentionShape LayerAttention(int layer) const;
  // What a paged KV layer caches per token: num_kv_heads heads of head_dim (the whole-context
  // layers' shape where it differs: the windowed ones then keep rings of their own, CacheLayout);
  // or, with latent attention, one "head" of the latent and the rotary key whose values are its
  // first kv_lora_rank values (keys_only: no value pool).
  struct KvShape {
    int heads = 0;
    int head_dim = 0;
    bool keys_only = false;
  };
  KvShape kv_shape() const;
  // RoPE's frequencies, rotary_dim / 2 of them (rope_theta and rope_scaling); of attention layer
  // `layer` (its AttentionShape's, 0 past rope_pairs) where given.
  std::vector<float> RopeFrequencies(int layer = -1) const;
  // Latent attention's softmax scale (DeepSeek's): 1 / sqrt(query-key head dim), times YaRN's
  // (0.1 * mscale_all_dim * ln(factor) + 1)^2 where rope_scaling gives mscale_all_dim.
  double LatentAttentionScale() const;
  // Attention's softmax scale: attention_scale where set, else 1 / sqrt(head_dim) (layer
  // `layer`'s where given), times YaRN's attention factor squared.
  float AttentionScale(int layer = -1) const;
};

// Every matrix `q` quantizes in a model of `c`'s shapes reads a multiple of q.group_size input
// columns; INVALID_ARGUMENT naming quantization_config.group_size and the width otherwise.
// ParseModelConfig checks it; tandem quantize uses it to choose a group.
absl::Status CheckGroupDividesWidths(const ModelConfig& c, const QuantizationConfig& q);

// Parses config.json text. Every problem is an INVALID_ARGUMENT naming the field. Keys that
// Tandem does not use are ignored (Hugging Face configs carry many).
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text);
// The name a model directory is served under: its last path component ("models/tiny-moe/"
// and "models/tiny-moe" are both "tiny-moe").
std::string ModelNameFromDir(const std::string& model_dir);

// One expected checkpoint tensor.
struct TensorSpec {
  std::string name;            // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // row-major, as stored
  TensorKind kind;
  int layer = -1;   // -1 for whole-model tensors
  int expert = -1;  // -1 for non-expert tensors
  TensorStorage storage = TensorStorage::kFloat;
};

// The name of the scales of a quantized weight: its name + "_scale".
std::string ScaleTensorName(const std::string& weight_name);

// The Hugging Face name of a tensor; layer/expert are ignored where the kind has none.
// Empty when the architecture has no tensor of that kind.
std::string TensorName(const ArchitectureSpec& arch, TensorKind kind, int layer = -1,
                       int expert = -1);
// The shape a tensor of `kind` has under `config` (in layer `layer`, whose attention may have a
// shape of its own: ModelConfig::LayerAttention).
std::vector<int64_t> TensorShape(const ModelConfig& config, TensorKind kind, int layer = -1);
// Every tensor a checkpoint of `config` must hold, in a stable order: embedding, then per
// layer (norms, attention and its biases, then the router, experts in index order and shared
// expert of a sparse layer, or the dense MLP), then final norm and lm_head. Only the tensors
// the config implies: biases when it has them, a shared expert when its width is set. A
// quantized weight is followed by its scales (storage kScale).
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config,
                                        ExpertLayout layout = ExpertLayout::kPerExpert);
// The layout `checkpoint_names` use for `config`'s experts: stacked when the architecture has
// stacked names and the checkpoint holds the first MoE layer's stacked tensor.
ExpertLayout DetectExpertLayout(const ModelConfig& config,
                                const std::vector<std::string>& checkpoint_names);
// Whether the engine skips checkpoint tensor `name` (ArchitectureSpec::ignored_prefixes).
bool IsIgnoredTensor(const ModelConfig& config, std::string_view name);

}  // namespace tandem::model
