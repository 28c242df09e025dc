// Gated DeltaNet (Qwen3.5's linear attention), a token mixer with a fixed-size state per
// sequence instead of a KV cache. For each token: [Q | K | V] = in_proj_qkv(x) through a causal
// depthwise convolution (kernel K, SiLU) whose last K - 1 inputs are kept; q and k L2-normed per
// key head (q also scaled by 1/sqrt(key head dim)); per value head, beta = sigmoid(b(x)),
// decay = exp(g), g = -exp(A_log) * softplus(a(x) + dt_bias), and the recurrent state
// S (key head dim x value head dim), float32:
//   S <- decay * S;  S <- S + k (beta * (v - S^T k))^T;  o = S^T q
// each key head serving linear_num_value_heads / linear_num_key_heads consecutive value heads;
// then out_proj(RMSNorm(o) * silu(z(x))), the norm per value head. The convolution tail and S
// live in the sequence's state slot of the pool (KvBlockPool::state), zeroed when a sequence
// (re)starts at position 0. The convolution and the recurrence are the backend's
// (causal_conv, gated_delta): a step runs each sequence's tokens in order, value heads in
// parallel, a decoded token by the recurrence and a prompt's tokens in chunks of 64 (matrix
// products per chunk, kernels::kGatedDeltaChunk).
#pragma once

#include <cstdint>
#include <vector>

#include "common/engine/kv_cache.h"
#include "common/engine/layers/block.h"

namespace tandem::engine {

class GatedDeltaNetBlock : public Block {
 public:
  // `pool` must outlive the block; `state_offsets` (model layers) gives where each DeltaNet
  // layer's state starts in a sequence's state slot (-1 for other layers).
  GatedDeltaNetBlock(const model::ModelConfig& config, KvBlockPool* pool,
                     std::vector<int64_t> state_offsets);

  absl::Status Forward(int layer, StepContext& ctx, float* out) override;
  CacheSpec cache(int) const override { return cache_; }

 private:
  KvBlockPool* const pool_;
  const CacheSpec cache_;
  const std::vector<int64_t> state_offsets_;
  // Buffers reused across steps: the projections (tokens, conv_dim / value_dim / value heads)
  // and the heads' outputs (tokens, value_dim).
  std::vector<float> mixed_, z_, b_, a_, core_;
};

}  // namespace tandem::engine
