// A dense SwiGLU MLP on every token (Qwen's mlp_only_layers / decoder_sparse_step, DeepSeek's
// first_k_dense_replace): no router, so masks, width policies and expert providers pass over
// it; its router trace entry is empty. A sequence's decoder overlay supplies its weights.
#pragma once

#include "common/engine/layers/block.h"

namespace tandem::engine {

class DenseMlpBlock : public Block {
 public:
  absl::Status Forward(int layer, StepContext& ctx, float* out) override;
};

}  // namespace tandem::engine
