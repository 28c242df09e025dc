// Multi-head latent attention (DeepSeek-V2/V3), in the absorbed form that decodes from the
// latent without making any head's keys or values. Per token: the latent c = RMSNorm(the first
// kv_lora_rank of kv_a_proj(x)) and the rotary key k_pe (the rest, RoPE at its position, one
// for every head) are the cache's one "head" of kv_lora_rank + qk_rope_head_dim values;
// a head's query [q_nope | q_pe] (from q_proj, or q_b_proj(RMSNorm(q_a_proj(x)))) becomes
// [W_uk^T q_nope | RoPE(q_pe)], whose dot product with [c | k_pe] is the head's score
// q_nope . W_uk c + q_pe . k_pe; attention reads the cache as multi-query attention whose values
// are its keys' first kv_lora_rank values, and a head's output W_uv (sum of p c) is what
// softmax(scores) v would be. The scale is 1 / sqrt(qk_head_dim), times YaRN's mscale^2 where
// rope_scaling says so (ModelConfig::LatentAttentionScale).
#pragma once

#include <vector>

#include "common/engine/kv_cache.h"
#include "common/engine/layers/attention.h"
#include "common/engine/layers/block.h"

namespace tandem::engine {

class LatentAttentionBlock : public Block {
 public:
  // `pool` (keys only, one head of the latent and the rotary key) must outlive the block;
  // `kv_layers` gives each layer's layer in the pool.
  LatentAttentionBlock(const model::ModelConfig& config, KvBlockPool* pool,
                       std::vector<int> kv_layers);

  absl::Status Forward(int layer, StepContext& ctx, float* out) override;
  CacheSpec cache(int) const override { return cache_; }

 private:
  // out (tokens, heads, out_head) gets each head's product w[h] (rows, cols) of its slice of in
  // (tokens, heads, in_head), the first cols values of each head: one group over the heads.
  void PerHead(StepContext& ctx, const float* in, int in_head, const std::vector<WeightMatrix>& w,
               float* out, int out_head);

  KvBlockPool* const pool_;
  const CacheSpec cache_;
  const std::vector<int> kv_layers_;
  const std::vector<float> rope_freq_;  // (qk_rope_head_dim / 2,)
  // Buffers reused across steps: q (tokens, heads, qk_head_dim), q_a (tokens, q_lora_rank),
  // latent (tokens, cache dim), the queries against the cache (tokens, heads, cache dim), the
  // attention output (tokens, heads, cache dim), o_proj's input (tokens, heads * v_head_dim), and
  // PerHead's inputs and outputs head by head (heads, tokens, cols | rows).
  std::vector<float> q_, q_a_, latent_, q_cache_, attn_, o_in_, head_in_, head_out_;
  std::vector<kernels::LinearProduct> products_;
  CachedAttention attend_;
};

}  // namespace tandem::engine
