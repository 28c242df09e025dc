// Grouped-query attention over the paged KV cache, with the options the architectures' recipes
// set from the config: q/k/v and output biases, per-head q/k RMSNorm before RoPE (Qwen3-MoE),
// RoPE over the first rotary_dim of each head, an output gate (Qwen3.5: q_proj emits [q | gate]
// per head; the attention output is scaled by sigmoid(gate) before o_proj), and attention sinks
// (gpt-oss: a learned logit per head in every softmax).
// A step's tokens project to q, k and v (one group of products), get RoPE at their positions,
// store K and V into their sequences' blocks, then attend over the cache (CachedAttention: a
// prompt's chunk in blocks of queries, other tokens alone, long contexts split over threads and
// merged by their log-sum-exps).
#pragma once

#include <cstdint>
#include <vector>

#include "common/engine/kv_cache.h"
#include "common/engine/layers/block.h"

namespace tandem::engine {

// Attention of a step's queries over their sequences' cached keys and values, scheduled over
// the threads: the part AttentionBlock and LatentAttentionBlock share. The queries form units:
// a run of consecutive tokens of one sequence (a prompt's chunk) in blocks of up to 16, which
// causal_attention computes reading each key and value once per block, and every other token
// alone (paged_attention). Work items are (unit, part of its context), every KV head at once so
// that each slot is read in order: a context splits into parts only when there are fewer units
// than twice the threads, each part at least 512 positions, so that a long context at a small
// batch still spreads over every thread (flash-decoding); parts merge by their log-sum-exps.
class CachedAttention {
 public:
  // out (tokens, heads, head_dim) = attention of q (tokens, heads, head_dim) over layer
  // `kv_layer` of `pool` (kv_heads heads of head_dim), every token's keys and values already
  // stored, each query over its whole context or, with a sliding window (window > 0), its last
  // `window` positions, and with `sinks` (heads,; null: none) a sink logit in each head's
  // softmax (Backend::attention_sinks, from each query's log-sum-exp); counts its time and KV
  // bytes in ctx.stats.
  void Run(StepContext& ctx, const KvBlockPool& pool, int kv_layer, const float* q, int heads,
           int window, float scale, const float* sinks, float* out);

 private:
  // A unit of attention work: `count` consecutive tokens of one sequence from row `first`, and
  // where its parts' rows start in part_out_ when its context is split.
  struct AttentionUnit {
    int first;
    int count;
    int64_t part_row;
  };

  std::vector<AttentionUnit> units_;
  // (units + 1) prefix sums of each unit's parts; the parts' outputs (row, heads, head_dim) and
  // log-sum-exps (row, heads).
  std::vector<int64_t> attention_parts_;
  std::vector<float> part_out_, part_lse_;
  std::vector<float> lse_;  // (tokens, heads): each query's log-sum-exp, where sinks need it
  std::vector<const float*> merge_out_;
  std::vector<float> merge_lse_;
};

class AttentionBlock : public Block {
 public:
  // `pool` must outlive the block; `kv_layers` (model layers) gives each attention layer's
  // layer in the pool (-1 for layers that are not attention).
  AttentionBlock(const model::ModelConfig& config, KvBlockPool* pool, std::vector<int> kv_layers);

  absl::Status Forward(int layer, StepContext& ctx, float* out) override;
  CacheSpec cache() const override { return cache_; }

 private:
  KvBlockPool* const pool_;
  const CacheSpec cache_;
  const std::vector<int> kv_layers_;
  const std::vector<float> rope_freq_;  // (rotary_dim / 2,)
  // Buffers reused across steps (sized by the largest step so far); q_raw_ holds q_proj's
  // [q | gate] rows where the attention has an output gate.
  std::vector<float> q_raw_, q_, gate_, k_, v_, attn_;
  CachedAttention attend_;
};

}  // namespace tandem::engine
