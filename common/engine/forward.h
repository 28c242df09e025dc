// The batched forward pass of a Mixtral-style MoE transformer on the CPU kernels. One Step
// runs a batch of sequences, each contributing a span of tokens (a prefill chunk or one decode
// token) at known positions, writes their keys and values into the paged KV cache through
// their block tables, and returns logits.
//
// MoE layer, per the design: router logits -> retained-expert mask (pruned experts get -inf)
// -> softmax -> top-k -> weights renormalised (Mixtral) -> tokens grouped per expert -> expert
// FFN -> weighted sum. Callers may assume Step is deterministic for the same batch, and that
// a sequence's result does not depend on which other sequences share its batch.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/engine/kv_cache.h"
#include "common/engine/model_weights.h"

namespace tandem::engine {

struct StepInput {
  absl::Span<const int32_t> tokens;   // (n,) n >= 1
  int start_position = 0;             // position of tokens[0]; earlier positions are in the cache
  BlockTable* block_table = nullptr;  // capacity for start_position + n tokens, reserved
  bool all_logits = false;            // logits of every token, else of the last one only
};

// Experts each layer keeps; an empty mask keeps every expert.
struct ExpertMask {
  std::vector<std::vector<bool>> retained;  // (layers, experts)
};

// Router decisions of one Step, rows in batch token order, for calibration and tests.
struct RouterTrace {
  std::vector<std::vector<float>> probs;      // (layers) x (tokens, experts), after masking
  std::vector<std::vector<int32_t>> experts;  // (layers) x (tokens, top_k)
  std::vector<std::vector<float>> weights;    // (layers) x (tokens, top_k)
};

class ForwardPass {
 public:
  // `weights` and `pool` must outlive this object; the pool's geometry must match the model.
  static absl::StatusOr<std::unique_ptr<ForwardPass>> Create(const ModelWeights* weights,
                                                             KvBlockPool* pool);

  // Runs one step. `logits` gets one entry per batch element: (rows, vocab) with rows = n when
  // all_logits, else 1. INVALID_ARGUMENT for bad tokens, positions or block tables.
  absl::Status Step(absl::Span<const StepInput> batch, const ExpertMask* mask,
                    std::vector<std::vector<float>>* logits, RouterTrace* trace = nullptr);

 private:
  ForwardPass(const ModelWeights* weights, KvBlockPool* pool) : w_(weights), pool_(pool) {}
  absl::Status Validate(absl::Span<const StepInput> batch, const ExpertMask* mask) const;

  const ModelWeights* w_;
  KvBlockPool* pool_;
};

}  // namespace tandem::engine
