// A model's weights in the layout the CPU kernels use: matrices as bfloat16 (raw bits,
// row-major, one row per output feature), norm weights as float32. Loaded from a checkpoint
// (converted from bf16/f16/f32) or made random for throughput work (`--load-format dummy`).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/safetensors.h"
#include "common/util/huge_pages.h"

namespace tandem::engine {

// A bf16 matrix W (rows, cols), row-major.
struct Bf16Matrix {
  int rows = 0;
  int cols = 0;
  // (rows, cols); in huge pages when large, since decode streams it from memory every step
  std::vector<uint16_t, util::HugePageAllocator<uint16_t>> data;
  const uint16_t* row(int r) const { return data.data() + static_cast<size_t>(r) * cols; }
};

// Experts each layer keeps; an empty mask keeps every expert.
struct ExpertMask {
  std::vector<std::vector<bool>> retained;  // (layers, experts)
};

struct ExpertWeights {
  Bf16Matrix gate;  // w1 (intermediate, hidden)
  Bf16Matrix up;    // w3 (intermediate, hidden)
  Bf16Matrix down;  // w2 (hidden, intermediate)
};

struct LayerWeights {
  std::vector<float> attn_norm;  // (hidden,)
  Bf16Matrix q;                  // (heads*head_dim, hidden)
  Bf16Matrix k;                  // (kv_heads*head_dim, hidden)
  Bf16Matrix v;                  // (kv_heads*head_dim, hidden)
  Bf16Matrix o;                  // (hidden, heads*head_dim)
  // Empty where the architecture or config has none.
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // (q_dim,), (kv_dim,) x2, (hidden,)
  std::vector<float> q_norm, k_norm;                  // (head_dim,): per-head RMSNorm weights
  std::vector<float> ffn_norm;                        // (hidden,)
  // A sparse layer: the router, its routed experts and, where the model has one, the
  // always-on shared expert and its scalar gate (1, hidden).
  Bf16Matrix router;                   // (experts, hidden)
  std::vector<ExpertWeights> experts;  // (experts,); empty matrices for experts not loaded
  ExpertWeights shared;                // (shared_intermediate) wide; empty when none
  Bf16Matrix shared_gate;              // (1, hidden)
  // A dense layer (config.IsSparseLayer false): its MLP, and no router or experts.
  ExpertWeights dense;
};

struct ModelWeights {
  model::ModelConfig config;
  Bf16Matrix embed;  // (vocab, hidden)
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // (hidden,)
  Bf16Matrix lm_head;             // (vocab, hidden); the embedding when tied
  // The experts whose weights are here (a pruned decoder loads only its plan's); empty: all.
  ExpertMask resident;

  bool HasExpert(int layer, int expert) const {
    return resident.retained.empty() || resident.retained[layer][expert];
  }

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

// A checkpoint tensor as the engine holds it, from any supported dtype: a matrix as bf16
// (INVALID_ARGUMENT if it is not 2-D), a vector (any shape, flattened) as float32.
absl::StatusOr<Bf16Matrix> MatrixFromTensor(const model::TensorView& view);
std::vector<float> VectorFromTensor(const model::TensorView& view);

// How a model directory's weights are obtained: from its safetensors, or random at the shape
// its config.json gives (`--load-format dummy`, for throughput work).
enum class LoadFormat { kSafetensors, kDummy };

// "safetensors" (also "auto") or "dummy"; INVALID_ARGUMENT otherwise.
absl::StatusOr<LoadFormat> ParseLoadFormat(const std::string& name);

// Reads DIR/config.json, then the weights as `format` says (`seed` for dummy weights), of the
// experts in `only` when it is not empty.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const std::string& dir,
                                                               LoadFormat format, uint64_t seed = 0,
                                                               const ExpertMask& only = {});

}  // namespace tandem::engine
