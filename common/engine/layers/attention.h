// Grouped-query attention over the paged KV cache, with the options the architectures' recipes
// set from the config: q/k/v and output biases, per-head q/k RMSNorm before RoPE (Qwen3-MoE),
// RoPE over the first rotary_dim of each head, and an output gate (Qwen3.5: q_proj emits
// [q | gate] per head; the attention output is scaled by sigmoid(gate) before o_proj).
// A step's tokens project to q, k and v (one stacked product where the rows fill panels), get
// RoPE at their positions, store K and V into their sequences' blocks, then attend over the
// cache: a prompt's chunk in blocks of queries (causal_attention), other tokens alone
// (paged_attention), long contexts split over threads and merged by their log-sum-exps.
#pragma once

#include <cstdint>
#include <vector>

#include "common/engine/kv_cache.h"
#include "common/engine/layers/block.h"

namespace tandem::engine {

class AttentionBlock : public Block {
 public:
  // `pool` must outlive the block; `kv_layers` (model layers) gives each attention layer's
  // layer in the pool (-1 for layers that are not attention).
  AttentionBlock(const model::ModelConfig& config, KvBlockPool* pool, std::vector<int> kv_layers);

  absl::Status Forward(int layer, StepContext& ctx, float* out) override;
  CacheSpec cache() const override { return cache_; }

 private:
  // A unit of attention work: `count` consecutive tokens of one sequence from row `first`, and
  // where its parts' rows start in part_out_ when its context is split.
  struct AttentionUnit {
    int first;
    int count;
    int64_t part_row;
  };

  KvBlockPool* const pool_;
  const CacheSpec cache_;
  const std::vector<int> kv_layers_;
  // Buffers reused across steps (sized by the largest step so far); q_raw_ holds q_proj's
  // [q | gate] rows where the attention has an output gate.
  std::vector<float> q_raw_, q_, gate_, k_, v_, attn_;
  std::vector<AttentionUnit> units_;
  // (units + 1) prefix sums of each unit's parts; the parts' outputs (row, heads, head_dim) and
  // log-sum-exps (row, heads).
  std::vector<int64_t> attention_parts_;
  std::vector<float> part_out_, part_lse_;
  std::vector<const float*> merge_out_;
  std::vector<float> merge_lse_;
};

}  // namespace tandem::engine
