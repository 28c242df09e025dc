// The blocks a forward step is composed of. A layer is a token mixer then a feed-forward block
// (model::LayerSpec, as the architecture's recipe says), each after its RMSNorm and with a
// residual add; the forward pass (forward.h) loops over the layers and each block emits its
// ops on the step's backend. A block kind is one class here (attention.h, moe.h, mlp.h) with
// its options taken from the model's config, and says what it keeps per sequence in the cache
// (CacheSpec), so the pool is sized and checked from the blocks, not from one assumed kind of
// layer.
//
// StepContext is what every block of a step shares: the batch laid out as tokens, the runs of
// rows that share always-on weights (the model's or a decoder overlay's), the normalised input
// of the block, the step's statistics and its hooks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/engine/model_weights.h"
#include "common/engine/step.h"
#include "common/kernels/backend.h"

namespace tandem::engine {

struct DecoderOverlay;  // common/engine/overlay.h

// What a block keeps per sequence between steps, for one layer.
struct CacheSpec {
  enum class Kind {
    kNone,     // nothing (feed-forward blocks)
    kPagedKv,  // keys and values of every position, in the paged KV pool's blocks
    kState,    // a fixed number of bytes per sequence, whatever its length (recurrent layers)
    // A sliding window's keys and values in a ring of ring_blocks blocks in the sequence's
    // state slot (state_bytes): position p in ring block (p / block_size) % ring_blocks, so the
    // blocks that fall out of the window are written over rather than kept.
    kWindowRing,
  };
  Kind kind = Kind::kNone;
  int kv_heads = 0;         // kPagedKv, kWindowRing
  int head_dim = 0;         // kPagedKv, kWindowRing
  int64_t state_bytes = 0;  // kState, kWindowRing: the layer's share of its sequence's state slot
  bool keys_only = false;   // kPagedKv: values are the keys' first values (latent attention)
  int ring_blocks = 0;      // kWindowRing
};

class StepContext {
 public:
  // Consecutive rows of the step that share always-on weights (the model's or an overlay's).
  struct RowRun {
    int begin;
    int end;
    const DecoderOverlay* overlay;
  };

  explicit StepContext(const ModelWeights* weights) : w(*weights) {}

  // Lays out `batch` (its rows by sequence, runs) for a step on `ops`; `moe` applies to sequences
  // without their own options.
  void Begin(absl::Span<const StepInput> batch, const MoeOptions& moe, const kernels::Backend* ops,
             RouterTrace* trace);

  int tokens() const { return static_cast<int>(ids.size()); }
  // The MoE options sequence `seq` runs with.
  const MoeOptions& Options(int seq) const {
    return batch[seq].moe != nullptr ? *batch[seq].moe : *moe;
  }
  // The always-on tensors (norms, router, shared expert, dense MLP) of layer l for a run.
  const LayerWeights& AlwaysOn(const RowRun& run, int l) const;

  // out (rows, w.rows) = in (rows, w.cols) @ W^T on the backend, counted in stats; `exact`
  // keeps activations float32 (routers and gates).
  void Linear(const float* in, int rows, const kernels::PackedMatrix& w, float* out,
              bool exact = false);
  // The products in one pass over the threads (Backend::linear_group), counted in stats.
  void LinearGroup(absl::Span<const kernels::LinearProduct> products);
  // out (rows, hidden) = the gated MLP `w` (shared expert or dense layer) over rows
  // [row0, row0 + rows) of h: gate and up as one group, then the model's activation (Activate).
  void GatedMlp(const ExpertWeights& w, int row0, int rows, float* out);
  // out (n,) = act(gate) * up, act the model's (model::Activation: SwiGLU's silu, GeGLU's gelu).
  void Activate(const float* gate, const float* up, int n, float* out) const;

  const ModelWeights& w;
  const kernels::Backend* ops = nullptr;
  absl::Span<const StepInput> batch;
  const MoeOptions* moe = nullptr;
  // The step's tokens (rows), in batch order: each one's sequence (an index into the batch),
  // id and absolute position.
  std::vector<int> seqs;
  std::vector<int32_t> ids, positions;
  // Sequence s is rows [row_begin[s], row_begin[s + 1]); the last entry is tokens().
  std::vector<int> row_begin;
  std::vector<RowRun> runs;
  std::vector<float> h;  // (tokens, hidden): the current block's input, normalised
  // (tokens, hidden): the residual stream, the current block's input before its norm (Gemma 4's
  // router and experts read it through norms of their own).
  const float* x = nullptr;
  StepStats stats;
  RouterTrace* trace = nullptr;  // null: not traced
  // Hooks (forward.h): not owned, null when unset.
  const RouterOverride* router = nullptr;
  ExpertObserver* observer = nullptr;
  ExpertProvider* provider = nullptr;

 private:
  // A product's weight bytes and multiply-adds into stats.
  void Count(int rows, const kernels::PackedMatrix& m);

  std::vector<float> gate_, up_, act_;
};

class Block {
 public:
  virtual ~Block() = default;
  // out (tokens, hidden) = this block of layer `layer` over ctx.h. INVALID_ARGUMENT for
  // controls it cannot run (a width policy's width out of range); an expert provider's error.
  virtual absl::Status Forward(int layer, StepContext& ctx, float* out) = 0;
  // What layer `layer` (one this block runs) keeps per sequence.
  virtual CacheSpec cache(int layer) const {
    (void)layer;
    return {};
  }
};

// Sizes a (rows, cols) buffer; its capacity only grows, so steady-state steps do not allocate.
inline void Resize(std::vector<float>& buffer, int64_t rows, int64_t cols) {
  buffer.resize(static_cast<size_t>(rows * cols));
}
inline float* Row(std::vector<float>& buffer, int64_t row, int64_t cols) {
  return buffer.data() + row * cols;
}

}  // namespace tandem::engine
