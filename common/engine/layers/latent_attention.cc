#include "common/engine/layers/latent_attention.h"

#include <utility>

namespace tandem::engine {

LatentAttentionBlock::LatentAttentionBlock(const model::ModelConfig& config, KvBlockPool* pool,
                                           std::vector<int> kv_layers)
    : pool_(pool),
      cache_{.kind = CacheSpec::Kind::kPagedKv,
             .kv_heads = 1,
             .head_dim = static_cast<int>(config.mla.cache_dim()),
             .keys_only = true},
      kv_layers_(std::move(kv_layers)),
      rope_freq_(config.RopeFrequencies()) {}

void LatentAttentionBlock::PerHead(StepContext& ctx, const float* in, int in_head,
                                   const std::vector<WeightMatrix>& w, float* out, int out_head) {
  const int T = ctx.tokens();
  const int heads = static_cast<int>(w.size());
  const int cols = w[0].cols(), rows = w[0].rows();
  Resize(head_in_, heads, static_cast<int64_t>(T) * cols);
  Resize(head_out_, heads, static_cast<int64_t>(T) * rows);
  products_.clear();
  for (int h = 0; h < heads; ++h) {
    float* x = Row(head_in_, h, static_cast<int64_t>(T) * cols);
    ctx.ops->gather_rows(in + static_cast<int64_t>(h) * in_head, heads * in_head, nullptr, T, cols,
                         x, cols);
    products_.push_back(
        {.x = x, .b = T, .w = w[h].view(), .y = Row(head_out_, h, static_cast<int64_t>(T) * rows)});
  }
  ctx.LinearGroup(products_);
  for (int h = 0; h < heads; ++h) {
    ctx.ops->gather_rows(Row(head_out_, h, static_cast<int64_t>(T) * rows), rows, nullptr, T, rows,
                         out + static_cast<int64_t>(h) * out_head, heads * out_head);
  }
}

absl::Status LatentAttentionBlock::Forward(int l, StepContext& ctx, float* out) {
  const model::ModelConfig& c = ctx.w.config;
  const model::LatentAttentionConfig& m = c.mla;
  const LatentAttentionWeights& L = ctx.w.layers[l].latent;
  const kernels::Backend& ops = *ctx.ops;
  const int T = ctx.tokens();
  const int heads = static_cast<int>(c.num_attention_heads);
  const int qk = static_cast<int>(m.qk_head_dim());
  const int nope = static_cast<int>(m.qk_nope_head_dim);
  const int rope_dim = static_cast<int>(m.qk_rope_head_dim);
  const int lora = static_cast<int>(m.kv_lora_rank);
  const int v_dim = static_cast<int>(m.v_head_dim);
  const int D = static_cast<int>(m.cache_dim());
  const float eps = static_cast<float>(c.rms_norm_eps);
  const kernels::RopeSpec rope{rope_freq_.data(), rope_dim, c.rope_interleaved};
  Resize(q_, T, heads * qk);
  Resize(latent_, T, D);

  // The queries and the latent with its rotary key, one group of products.
  if (m.q_lora_rank > 0) {
    const int q_lora = static_cast<int>(m.q_lora_rank);
    Resize(q_a_, T, q_lora);
    const kernels::LinearProduct first[] = {
        {.x = ctx.h.data(), .b = T, .w = L.q_a.view(), .y = q_a_.data()},
        {.x = ctx.h.data(), .b = T, .w = L.kv_a.view(), .y = latent_.data()}};
    ctx.LinearGroup(first);
    ops.rms_norm(q_a_.data(), T, q_lora, L.q_a_norm.data(), eps, q_a_.data());
    ctx.Linear(q_a_.data(), T, L.q_b.view(), q_.data());
  } else {
    const kernels::LinearProduct first[] = {
        {.x = ctx.h.data(), .b = T, .w = L.q.view(), .y = q_.data()},
        {.x = ctx.h.data(), .b = T, .w = L.kv_a.view(), .y = latent_.data()}};
    ctx.LinearGroup(first);
  }
  for (int t = 0; t < T; ++t) {  // the latent's RMSNorm (its rotary key follows it in the row)
    float* row = Row(latent_, t, D);
    ops.rms_norm(row, 1, lora, L.kv_a_norm.data(), eps, row);
  }
  ops.rope(latent_.data() + lora, T, 1, D, rope, ctx.positions.data());
  ops.rope(q_.data() + nope, T, heads, qk, rope, ctx.positions.data());
  for (size_t seq = 0; seq < ctx.batch.size(); ++seq) {
    const int first = ctx.row_begin[seq];
    ops.kv_store(pool_->Writer(kv_layers_[l], ctx.batch[seq].block_table->blocks().data()),
                 ctx.row_begin[seq + 1] - first, ctx.positions.data() + first,
                 Row(latent_, first, D), Row(latent_, first, D));
  }

  // Each head's q_nope through W_uk^T: its query against the cache is [W_uk^T q_nope | q_pe].
  Resize(q_cache_, T, static_cast<int64_t>(heads) * D);
  PerHead(ctx, q_.data(), qk, L.q_absorb, q_cache_.data(), D);
  ops.gather_rows(q_.data() + nope, qk, nullptr, T * heads, rope_dim, q_cache_.data() + lora, D);

  Resize(attn_, T, static_cast<int64_t>(heads) * D);
  const KvCacheConfig& kv = pool_->config();
  attend_.Run(ctx,
              LayerKv{.pool = pool_,
                      .kv_heads = kv.num_kv_heads,
                      .head_dim = kv.head_dim,
                      .kv_layer = kv_layers_[l]},
              q_cache_.data(), heads,
              /*window=*/0, static_cast<float>(c.LatentAttentionScale()), /*sinks=*/nullptr,
              attn_.data());

  // Each head's output leaves the latent through W_uv, then o_proj.
  Resize(o_in_, T, static_cast<int64_t>(heads) * v_dim);
  PerHead(ctx, attn_.data(), D, L.v_up, o_in_.data(), v_dim);
  ctx.Linear(o_in_.data(), T, L.o.view(), out);
  return absl::OkStatus();
}

}  // namespace tandem::engine
