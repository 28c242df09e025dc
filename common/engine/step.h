// What a forward step takes and gives: the sequences of a batch (StepInput), the per-sequence MoE
// controls (mask, width policy, decoder overlay), the seams calibration and expert streaming
// plug into (RouterOverride, ExpertObserver, ExpertProvider), and what a step reports
// (RouterTrace, StepStats). The forward pass (forward.h) and its blocks (layers/) share them.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/engine/kv_cache.h"
#include "common/engine/model_weights.h"
#include "common/kernels/packed_matrix.h"

namespace tandem::engine {

// Which rows of logits a sequence wants back from a step.
enum class LogitRows {
  kNone,  // an intermediate prefill chunk: only its KV matters
  kLast,  // the next-token distribution
  kAll,   // every position (perplexity, tests)
};

// The width each routed (token, expert) pair runs at: how many of the expert's intermediate
// neurons it uses. Checkpoints for mixed width store neurons in importance order, so width w
// reads the first w gate and up rows and the first w down columns; 0 skips the expert; the
// intermediate size is the whole expert. The policy may also change the router weights the
// pairs are summed with (a tier that skips an expert renormalises over the ones that run);
// otherwise they are applied as routed. Implementations must be deterministic and safe to call
// from the stepping thread.
class ExpertWidthPolicy {
 public:
  virtual ~ExpertWidthPolicy() = default;
  // experts (top_k,): one token's routed experts in descending router weight, with their
  // weights (top_k,), which it may rewrite; fills widths (top_k,) with values in
  // [0, intermediate_size].
  virtual void Widths(int layer, absl::Span<const int32_t> experts, absl::Span<float> weights,
                      absl::Span<int> widths) const = 0;
};

// Replaces the learned router with a stated one (`--load-format dummy`, whose random router
// says nothing about real routing). Deterministic in its arguments, so batching and chunking
// do not change a sequence's routing.
class RouterOverride {
 public:
  virtual ~RouterOverride() = default;
  // Fills logits (experts,) for `token` at `position` in `layer`.
  virtual void Logits(int layer, int32_t token, int position, absl::Span<float> logits) const = 0;
};

// Sees every expert group a step runs, for calibration (`tandem calibrate`): which tokens (rows
// of the step, in batch token order) went to `expert` of `layer` at `width`, their activations
// act (rows, width) = silu(gate) * up and the expert's outputs out (rows, hidden) before the
// router weight. Called on the stepping thread; the pointers are valid during the call only.
class ExpertObserver {
 public:
  virtual ~ExpertObserver() = default;
  virtual void OnExpert(int layer, int expert, int width, absl::Span<const int> tokens,
                        const float* act, const float* out) = 0;
};

// Expert weights that are not all resident (mixed width with host-offloaded experts): the
// forward pass asks for each layer's experts, widest first, and computes each as soon as it
// is in, so that wide experts' compute hides narrow experts' loads.
struct ExpertLoad {
  int expert = 0;
  int width = 0;  // the widest the step runs it at
};
// One expert's first `width` neurons or more, packed as the model's experts are: gate and up
// (>= width, hidden), down (hidden, >= width) with the neurons in the first columns.
struct ExpertView {
  kernels::PackedMatrix gate, up, down;
};
class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  // The step runs `loads` (distinct experts, widest first) of `layer`: start bringing them in,
  // in that order.
  virtual absl::Status BeginLayer(int layer, absl::Span<const ExpertLoad> loads) = 0;
  // The expert, once in; valid until EndLayer.
  virtual absl::StatusOr<ExpertView> Wait(int layer, int expert, int width) = 0;
  virtual void EndLayer(int layer) = 0;
};

struct DecoderOverlay;  // common/engine/overlay.h

// Per-step MoE controls; the defaults run every expert at full width with the model's weights.
struct MoeOptions {
  const ExpertMask* mask = nullptr;
  const ExpertWidthPolicy* widths = nullptr;
  // A distilled decoder's always-on tensors (norms, routers, shared experts, dense MLPs) in
  // place of the model's; attention and routed experts stay the model's. Not owned.
  const DecoderOverlay* overlay = nullptr;
};

struct StepInput {
  absl::Span<const int32_t> tokens;   // (n,) n >= 1
  int start_position = 0;             // position of tokens[0]; earlier positions are in the cache
  BlockTable* block_table = nullptr;  // capacity for start_position + n tokens, reserved
  LogitRows logits = LogitRows::kLast;
  // This sequence's MoE controls, instead of the step's (colocated mode: a prefill chunk runs
  // the full pool while decode tokens in the same step run the pruned one). Not owned.
  const MoeOptions* moe = nullptr;
};

// Router decisions of one Step, rows in batch token order, for calibration and tests.
struct RouterTrace {
  std::vector<std::vector<float>> probs;      // (layers) x (tokens, experts), after masking
  std::vector<std::vector<int32_t>> experts;  // (layers) x (tokens, top_k)
  std::vector<std::vector<float>> weights;    // (layers) x (tokens, top_k)
  std::vector<std::vector<int32_t>> widths;   // (layers) x (tokens, top_k)
};

// What the last Step did, for benchmarks and metrics.
struct StepStats {
  int64_t tokens = 0;               // tokens run
  int64_t weight_bytes = 0;         // bytes of (packed) weight matrices the step read, once each
  int64_t expert_weight_bytes = 0;  // the part of weight_bytes that is expert FFNs
  int64_t expert_runs = 0;          // (expert, width) groups run, over all layers
  int64_t matmul_flops = 0;         // 2 * rows * n * d summed over the weight products
  // Attention over the KV cache (the paged kernels and the merge of split contexts, not the
  // projections): bytes of K and V (and int8 scales) read, once per (token, KV head, position),
  // and wall time over all layers.
  int64_t kv_bytes = 0;
  double attention_seconds = 0;
  // Recurrent layers' per-sequence state (Gated DeltaNet), read and written once per sequence
  // and layer: twice its bytes.
  int64_t state_bytes = 0;
};

// The width an expert of `config` runs at when asked for `width` neurons: quantized experts
// run whole quantization groups (a multiple of the group size, at most the expert's width);
// bf16 experts exactly `width`.
int ExpertRunWidth(const model::ModelConfig& config, int width);

}  // namespace tandem::engine
