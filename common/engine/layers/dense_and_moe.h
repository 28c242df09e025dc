// Gemma 4's feed-forward block: a dense MLP and an MoE side by side (model::FfnKind::kDenseAndMoe).
// The dense MLP runs on the block's normed input (pre_feedforward_layernorm, ctx.h) and its
// output is RMS-normed (post_feedforward_layernorm_1); the MoE's router reads the residual stream
// (ctx.x) through its own norm, its experts the residual stream normed by
// pre_feedforward_layernorm_2, and its output is normed by post_feedforward_layernorm_2; the block
// returns their sum (the forward pass norms it once more: sandwich norms). A sequence's decoder
// overlay supplies every one of these norms with the dense MLP and the router.
#pragma once

#include <vector>

#include "common/engine/layers/block.h"
#include "common/engine/layers/moe.h"

namespace tandem::engine {

class DenseAndMoeBlock : public Block {
 public:
  explicit DenseAndMoeBlock(const model::ModelConfig& config) : moe_(config) {}

  absl::Status Forward(int layer, StepContext& ctx, float* out) override;

 private:
  MoeBlock moe_;
  std::vector<float> dense_out_;
};

}  // namespace tandem::engine
