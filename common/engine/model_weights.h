// A model's weights in the layout the kernels use: every linear layer's matrix packed in panels
// (common/kernels/packed_matrix.h) as bf16, or as int8 / int4 with group-wise scales where the
// checkpoint is quantized (tandem quantize); the token embedding as row-major bf16 (rows are
// gathered, not multiplied); norm weights and biases as float32. Loaded from a checkpoint
// (converted from bf16/f16/f32, or quantized levels and scales) or made random for throughput
// work (`--load-format dummy`, quantized as the config says).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kernels/packed_matrix.h"
#include "common/model/config.h"
#include "common/model/model_dir.h"
#include "common/model/safetensors.h"
#include "common/util/huge_pages.h"

namespace tandem::engine {

// A bf16 matrix W (rows, cols), row-major: the token embedding.
struct Bf16Matrix {
  int rows = 0;
  int cols = 0;
  // (rows, cols); in huge pages when large, since decode streams it from memory every step
  std::vector<uint16_t, util::HugePageAllocator<uint16_t>> data;
  const uint16_t* row(int r) const { return data.data() + static_cast<size_t>(r) * cols; }
};

// A linear layer's weight W (rows, cols), one row per output feature, packed for the matrix
// products in the format its layout says.
struct WeightMatrix {
  kernels::PanelLayout layout;
  // layout.bytes(); in huge pages when large, since decode streams it from memory every step
  std::vector<std::byte, util::HugePageAllocator<std::byte>> data;

  int rows() const { return layout.rows; }
  int cols() const { return layout.cols; }
  bool empty() const { return data.empty(); }
  kernels::WeightFormat format() const { return layout.format; }
  kernels::PackedMatrix view() const { return kernels::View(layout, data.data()); }
  // The first `rows` rows and `cols` columns: an expert at a narrower width.
  kernels::PackedMatrix view(int rows, int cols) const {
    return kernels::View(layout, data.data(), rows, cols);
  }
  // W[r][c], dequantized.
  float at(int r, int c) const { return kernels::PackedElement(view(), r, c); }
};

// Packs a row-major bf16 matrix (rows, cols).
WeightMatrix PackBf16Matrix(const uint16_t* w, int rows, int cols);
// Quantizes a row-major float32 matrix (rows, cols) to `format` in groups of `group` columns
// (kernels::QuantizeRows) and packs it; bf16 rounds and packs.
WeightMatrix QuantizeMatrix(const float* w, int rows, int cols, kernels::WeightFormat format,
                            int group);

// Experts each layer keeps; an empty mask keeps every expert.
struct ExpertMask {
  std::vector<std::vector<bool>> retained;  // (layers, experts)
};

struct ExpertWeights {
  WeightMatrix gate;  // w1 (intermediate, hidden)
  WeightMatrix up;    // w3 (intermediate, hidden)
  WeightMatrix down;  // w2 (hidden, intermediate)
  // A routed expert's biases where the model has them (config.expert_bias: gpt-oss), else
  // empty: (intermediate,), (intermediate,), (hidden,). Loaded with the expert's matrices,
  // and for every expert of a layer whose experts stream (the matrices then come from the
  // stream; these are small).
  std::vector<float> gate_bias, up_bias, down_bias;
};

// A Gated DeltaNet layer (model::MixerKind::kGatedDeltaNet), in the config's DeltaNetConfig
// shape.
struct DeltaNetWeights {
  WeightMatrix qkv;                   // (conv_dim, hidden): [Q | K | V] before the convolution
  WeightMatrix z;                     // (value_dim, hidden): the output gate
  WeightMatrix b, a;                  // (value heads, hidden): beta's and the decay's inputs
  WeightMatrix out;                   // (hidden, value_dim)
  std::vector<float> conv;            // (conv_dim, kernel): the causal depthwise convolution
  std::vector<float> a_log, dt_bias;  // (value heads,)
  std::vector<float> norm;            // (value head dim,): RMSNorm of each head's output
};

// Grouped-query attention's (AttentionBlock).
struct AttentionWeights {
  // q (heads*head_dim, hidden), k and v (kv_heads*head_dim, hidden): a step runs them as one
  // group of products (Backend::linear_group).
  WeightMatrix q, k, v;
  // With an output gate (config.attention_output_gate) q's rows are [q | gate] per head,
  // 2 * heads * head_dim of them.
  WeightMatrix o;  // (hidden, heads*head_dim)
  // Empty where the architecture or config has none.
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // (q_dim,), (kv_dim,) x2, (hidden,)
  std::vector<float> q_norm, k_norm;                  // (head_dim,): per-head RMSNorm weights
  std::vector<float> sinks;  // (heads,): each head's sink logit (config.attention_sinks)
};

// Multi-head latent attention's (LatentAttentionBlock, DeepSeek-V2/V3), with the latent's
// up-projection (kv_b_proj) split per head at load for the absorbed form: a head's query meets
// the cached latent through W_uk^T and its output leaves the latent through W_uv, so no head's
// keys or values are ever made.
struct LatentAttentionWeights {
  WeightMatrix q;                      // (heads*qk_head_dim, hidden): q_proj; empty with q_lora
  WeightMatrix q_a;                    // (q_lora_rank, hidden): q_a_proj
  std::vector<float> q_a_norm;         // (q_lora_rank,)
  WeightMatrix q_b;                    // (heads*qk_head_dim, q_lora_rank): q_b_proj
  WeightMatrix kv_a;                   // (kv_lora_rank + qk_rope_head_dim, hidden)
  std::vector<float> kv_a_norm;        // (kv_lora_rank,)
  std::vector<WeightMatrix> q_absorb;  // per head (kv_lora_rank, qk_nope_head_dim): W_uk^T, bf16
  std::vector<WeightMatrix> v_up;      // per head (v_head_dim, kv_lora_rank): W_uv, bf16
  WeightMatrix o;                      // (hidden, heads*v_head_dim)
};

// A sparse layer's (MoeBlock): the router, its routed experts and, where the model has one, the
// always-on shared expert and its scalar gate (1, hidden; empty when it has none).
struct MoeWeights {
  WeightMatrix router;  // (experts, hidden), bf16
  // (experts,): added to the router's scores for choosing experts only (DeepSeek-V3's
  // e_score_correction_bias), or to its logits (gpt-oss's router bias); empty where the router
  // has none. The model's is used whatever overlay a sequence runs.
  std::vector<float> router_bias;
  // Gemma 4's (empty elsewhere): the router's input norm weight, its scale times hidden^-0.5
  // (hidden,), and the chosen experts' weight scales (experts,).
  std::vector<float> router_norm, expert_scale;
  std::vector<ExpertWeights> experts;  // (experts,); empty matrices for experts not loaded
  ExpertWeights shared;                // (shared_intermediate) wide; empty when none
  WeightMatrix shared_gate;            // (1, hidden), bf16
};

// A layer: its token mixer's norm and weights (attention or a Gated DeltaNet, as the layer's
// spec says; the other is empty), then its feed-forward block's norm and weights (an MoE or,
// in a dense layer, an MLP, or both side by side; what it lacks is empty). Each block reads its
// own.
struct LayerWeights {
  std::vector<float> attn_norm;  // (hidden,): the token mixer's norm
  AttentionWeights attention;
  DeltaNetWeights linear;
  LatentAttentionWeights latent;
  std::vector<float> ffn_norm;  // (hidden,)
  MoeWeights moe;
  ExpertWeights dense;
  // Gemma 4's (empty elsewhere), (hidden,) each: the sandwich norms of the mixer's and the
  // feed-forward block's outputs; the dense MLP's output norm, the experts' input and output
  // norms (DenseAndMoeBlock); and the layer's output scalar (1,).
  std::vector<float> post_attn_norm, post_ffn_norm;
  std::vector<float> post_dense_norm, pre_moe_norm, post_moe_norm;
  std::vector<float> layer_scalar;
};

struct ModelWeights {
  model::ModelConfig config;
  Bf16Matrix embed;  // (vocab, hidden)
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // (hidden,)
  WeightMatrix lm_head;           // (vocab, hidden), bf16; the embedding when tied
  // The experts whose weights are here (a pruned decoder loads only its plan's); empty: all.
  ExpertMask resident;

  bool HasExpert(int layer, int expert) const {
    return resident.retained.empty() || resident.retained[layer][expert];
  }
  // Bytes of every matrix and vector held (the tied lm_head's packed copy included).
  int64_t bytes() const;

  // Copies every tensor out of `checkpoint` (validated against `config` first), of the experts
  // in `only` when it is not empty. INVALID_ARGUMENT for a mask of another shape.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Load(
      const model::ModelConfig& config, const model::SafetensorsModel& checkpoint,
      const ExpertMask& only = {});
  // Random weights (uniform, standard deviation 0.02; norms 1) of any configured shape,
  // deterministic in `seed`; an expert's weights do not depend on `only`.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Random(const model::ModelConfig& config,
                                                              uint64_t seed,
                                                              const ExpertMask& only = {});
};

// A checkpoint tensor as the engine holds it, from any float dtype: a matrix as row-major bf16
// or packed bf16 (INVALID_ARGUMENT if it is not 2-D), a vector (any shape, flattened) as
// float32.
absl::StatusOr<Bf16Matrix> MatrixFromTensor(const model::TensorView& view);
absl::StatusOr<WeightMatrix> WeightFromTensor(const model::TensorView& view);
std::vector<float> VectorFromTensor(const model::TensorView& view);
// A norm's weight as the engine applies it: 1 + w where the config says the checkpoint stores
// it centred on zero (config.zero_centred_norms), else w.
std::vector<float> NormFromTensor(const model::TensorView& view, const model::ModelConfig& config);
// Gemma 4's router input norm weight from its scale (kRouterScale): scale * hidden^-0.5.
std::vector<float> RouterNormFromScale(const model::TensorView& view,
                                       const model::ModelConfig& config);
// A quantized weight from its levels (I8, or U8 with two int4 levels a byte) and its float16
// scales (rows, cols / group), as the checkpoint stores them; INVALID_ARGUMENT for shapes or
// dtypes that do not fit.
absl::StatusOr<WeightMatrix> WeightFromQuantized(const model::TensorView& levels,
                                                 const model::TensorView& scales, int bits,
                                                 int group);

// How a model directory's weights are obtained: from its safetensors, or random at the shape
// its config.json gives (`--load-format dummy`, for throughput work).
enum class LoadFormat { kSafetensors, kDummy };

// "safetensors" (also "auto") or "dummy"; INVALID_ARGUMENT otherwise.
absl::StatusOr<LoadFormat> ParseLoadFormat(const std::string& name);

// The weights of `dir` as `format` says (`seed` for dummy weights), of the experts in `only`
// when it is not empty.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const model::ModelDir& dir,
                                                               LoadFormat format, uint64_t seed = 0,
                                                               const ExpertMask& only = {});

}  // namespace tandem::engine
