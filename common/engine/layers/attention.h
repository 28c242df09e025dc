// Grouped-query attention over the paged KV cache, with the options the architectures' recipes
// set from the config: q/k/v and output biases, per-head q/k RMSNorm before RoPE (Qwen3-MoE),
// RoPE over the first rotary_dim of each head, an output gate (Qwen3.5: q_proj emits [q | gate]
// per head; the attention output is scaled by sigmoid(gate) before o_proj), attention sinks
// (gpt-oss: a learned logit per head in every softmax), and Gemma 4's: a shape per layer
// (ModelConfig::LayerAttention: the whole-context layers' head dim, KV heads and RoPE), values
// from the keys' projection (no v_proj) and RMS-normed without weight, a softmax scale of 1.
// A step's tokens project to q, k and v (one group of products), get RoPE at their positions,
// store K and V into their sequences' blocks, then attend over the cache (CachedAttention: a
// prompt's chunk in blocks of queries, other tokens alone, long contexts split over threads and
// merged by their log-sum-exps).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "common/engine/kv_cache.h"
#include "common/engine/layers/block.h"

namespace tandem::engine {

// Where one layer's keys and values are for each sequence of a step: a layer of the paged pool,
// or a sliding-window layer's ring in the sequences' state slots (CacheSpec::kWindowRing).
struct LayerKv {
  KvBlockPool* pool = nullptr;
  int kv_heads = 0;  // the layer's geometry: the pool's, or a ring's own
  int head_dim = 0;
  int kv_layer = -1;                    // paged: the pool's layer
  int64_t ring_offset = -1;             // a ring: its offset in the state slot
  int ring_blocks = 0;                  // a ring: its blocks
  const int32_t* ring_table = nullptr;  // a ring: block b -> b % ring_blocks
  kernels::PagedKv View(const BlockTable& table) const;
  kernels::PagedKvOut Writer(const BlockTable& table) const;
};

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
  // out (tokens, heads, head_dim) = attention of q (tokens, heads, head_dim) over `kv` (its
  // kv_heads heads of head_dim), every token's keys and values already stored, each
  // query over its whole context or, with a sliding window (window > 0), its last `window`
  // positions, and with `sinks` (heads,; null: none) a sink logit in each head's softmax
  // (Backend::attention_sinks, from each query's log-sum-exp); only the rows `rows` marks where
  // it is not null (a round of a ring's tokens). Counts its time and KV bytes in ctx.stats.
  void Run(StepContext& ctx, const LayerKv& kv, const float* q, int heads, int window, float scale,
           const float* sinks, float* out, const std::vector<char>* rows = nullptr);

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
  // `pool` must outlive the block; `layout` says where each attention layer keeps its keys and
  // values: a layer of the pool, or a windowed layer's ring in the state slots. A ring's layer
  // stores and attends a sequence's tokens in rounds of at most its ring's positions less its
  // window (at least kRingRoundTokens), so no round writes over a position its queries read.
  AttentionBlock(const model::ModelConfig& config, KvBlockPool* pool, const CacheLayout& layout);

  absl::Status Forward(int layer, StepContext& ctx, float* out) override;
  CacheSpec cache(int layer) const override;

 private:
  LayerKv Kv(int layer) const;

  KvBlockPool* const pool_;
  const CacheLayout layout_;
  const std::vector<model::AttentionShape> shapes_;  // (layers,)
  // By ring size (blocks): block b -> b % that size, grown with the positions; the windowed
  // layers of one size share it.
  std::map<int, std::vector<int32_t>> ring_tables_;
  std::vector<char> round_rows_;                     // the rows of a ring's round
  const std::vector<std::vector<float>> rope_freq_;  // (layers,) x (rotary_dim / 2,)
  const std::vector<float> ones_;                    // (largest head dim,): v_norm's weight
  // Buffers reused across steps (sized by the largest step so far); q_raw_ holds q_proj's
  // [q | gate] rows where the attention has an output gate.
  std::vector<float> q_raw_, q_, gate_, k_, v_, attn_;
  CachedAttention attend_;
};

}  // namespace tandem::engine
