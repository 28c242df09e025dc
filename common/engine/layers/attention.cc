#include "common/engine/layers/attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "common/kernels/cpu/kernels.h"
#include "common/kernels/cpu/thread_pool.h"
#include "common/kernels/kv_format.h"

namespace tandem::engine {
namespace {

namespace k = kernels::cpu;

constexpr int64_t kMinAttentionWork = int64_t{1} << 16;
// Positions in a part of a context split over threads.
constexpr int64_t kMinAttentionPart = 512;
// Queries of one sequence attended together (Backend::causal_attention).
constexpr int kQueryBlock = 16;

// x (rows, n) += bias (n,) on every row; nothing for an empty bias.
void AddBias(const kernels::Backend& ops, const std::vector<float>& bias, int rows, float* x) {
  if (!bias.empty()) ops.add_bias(bias.data(), rows, static_cast<int>(bias.size()), x);
}

}  // namespace

kernels::PagedKv LayerKv::View(const BlockTable& table) const {
  if (ring_blocks > 0) {
    return pool->RingView(table.state_slot(), ring_offset, ring_blocks, kv_heads, head_dim,
                          ring_table);
  }
  return pool->View(kv_layer, table.blocks().data());
}

kernels::PagedKvOut LayerKv::Writer(const BlockTable& table) const {
  if (ring_blocks > 0) {
    return pool->RingWriter(table.state_slot(), ring_offset, ring_blocks, kv_heads, head_dim,
                            ring_table);
  }
  return pool->Writer(kv_layer, table.blocks().data());
}

void CachedAttention::Run(StepContext& ctx, const LayerKv& layer_kv, const float* q_all, int heads,
                          int window, float scale, const float* sinks, float* attn,
                          const std::vector<char>* rows) {
  const KvCacheConfig& kv_config = layer_kv.pool->config();
  const int kv_heads = layer_kv.kv_heads;
  const int head_dim = layer_kv.head_dim;
  const int q_dim = heads * head_dim;
  const int T = ctx.tokens();
  const auto attention_start = std::chrono::steady_clock::now();
  const int threads = k::DefaultThreadPool().num_threads();
  // Bytes one position of one KV head occupies in K (or V): values, and int8's scale.
  const int64_t kv_position_bytes =
      static_cast<int64_t>(kernels::KvBlockBytes(kv_config.dtype, 1, 1, head_dim));
  auto selected = [&](int t) { return rows == nullptr || (*rows)[t] != 0; };
  units_.clear();
  for (int t = 0; t < T;) {
    if (!selected(t)) {
      ++t;
      continue;
    }
    int m = 1;
    while (m < kQueryBlock && t + m < T && selected(t + m) && ctx.seqs[t + m] == ctx.seqs[t] &&
           ctx.positions[t + m] == ctx.positions[t] + m) {
      ++m;
    }
    units_.push_back({t, m, 0});
    t += m;
  }
  const int U = static_cast<int>(units_.size());
  attention_parts_.resize(U + 1);
  attention_parts_[0] = 0;
  int64_t attention_work = 0;  // multiply-adds of the layer's attention
  int64_t part_rows = 0;       // rows of part outputs, when contexts split
  for (int u = 0; u < U; ++u) {
    AttentionUnit& unit = units_[u];
    // The positions the unit's queries read: to the last one's, from the first one's window.
    const int context = ctx.positions[unit.first + unit.count - 1] + 1 -
                        kernels::CausalQueryBegin(ctx.positions[unit.first], 0, 0, window);
    int parts = 1;
    if (U < 2 * threads) {
      parts = static_cast<int>(std::min<int64_t>(
          (context + kMinAttentionPart - 1) / kMinAttentionPart, (2 * threads + U - 1) / U));
      // One sequence alone (a batch of one): a whole number of parts a thread, or the threads
      // with one part fewer wait for the rest (1,025 positions on 2 threads made 3 parts: the
      // busier thread had two thirds of the work). Rounded down, not up: each call has a fixed
      // cost and an unprefetched first tile, so 2 parts of 512 ran 1.11x faster than 4 of 256
      // (bf16; int8 1.07x; medians of 12 and 6 interleaved rounds on an Intel Xeon with AMX).
      if (U == 1 && parts > 1) parts = std::max(threads, parts / threads * threads);
    }
    attention_parts_[u + 1] = attention_parts_[u] + parts;
    if (parts > 1) {
      unit.part_row = part_rows;
      part_rows += int64_t{parts} * unit.count;
    }
    attention_work += int64_t{2} * context * q_dim * unit.count;
    ctx.stats.kv_bytes +=
        int64_t{kv_config.pools_per_layer()} * context * kv_heads * kv_position_bytes;
  }
  const int64_t items = attention_parts_[U];
  part_out_.resize(static_cast<size_t>(part_rows) * q_dim);
  part_lse_.resize(static_cast<size_t>(part_rows) * heads);
  if (sinks != nullptr) lse_.resize(static_cast<size_t>(T) * heads);
  const int64_t grain =
      std::max<int64_t>(1, kMinAttentionWork * items / std::max<int64_t>(1, attention_work));
  k::DefaultThreadPool().ParallelFor(items, grain, [&](int64_t begin, int64_t end) {
    int u = 0;
    for (int64_t item = begin; item < end; ++item) {  // item = (unit, part), in unit order
      while (attention_parts_[u + 1] <= item) ++u;
      const AttentionUnit& unit = units_[u];
      const int parts = static_cast<int>(attention_parts_[u + 1] - attention_parts_[u]);
      const int part = static_cast<int>(item - attention_parts_[u]);
      const int first_position = ctx.positions[unit.first];
      const int window_begin = kernels::CausalQueryBegin(first_position, 0, 0, window);
      const int context = first_position + unit.count - window_begin;
      const kernels::PagedKv kv = layer_kv.View(*ctx.batch[ctx.seqs[unit.first]].block_table);
      const float* q = q_all + static_cast<int64_t>(unit.first) * q_dim;
      // The whole context into attn, or this part's outputs and log-sum-exps into its rows.
      const int64_t row = unit.part_row + int64_t{part} * unit.count;
      float* out =
          parts == 1 ? attn + static_cast<int64_t>(unit.first) * q_dim : Row(part_out_, row, q_dim);
      float* lse = parts > 1          ? Row(part_lse_, row, heads)
                   : sinks != nullptr ? Row(lse_, unit.first, heads)
                                      : nullptr;
      const int begin = window_begin + static_cast<int>(int64_t{context} * part / parts);
      const int end = window_begin + static_cast<int>(int64_t{context} * (part + 1) / parts);
      if (unit.count == 1) {
        ctx.ops->paged_attention(q, heads, kv, begin, end, scale, 0, kv_heads, out, lse);
      } else {
        ctx.ops->causal_attention(q, unit.count, heads, kv, first_position, begin, end, window,
                                  scale, out, lse);
      }
    }
  });
  for (int u = 0; u < U; ++u) {
    const AttentionUnit& unit = units_[u];
    const int parts = static_cast<int>(attention_parts_[u + 1] - attention_parts_[u]);
    merge_out_.resize(parts);
    merge_lse_.resize(parts);
    for (int i = 0; i < unit.count && parts > 1; ++i) {
      for (int h = 0; h < heads; ++h) {
        for (int p = 0; p < parts; ++p) {
          const int64_t row = unit.part_row + int64_t{p} * unit.count + i;
          merge_out_[p] = Row(part_out_, row, q_dim) + h * head_dim;
          merge_lse_[p] = part_lse_[row * heads + h];
        }
        ctx.ops->merge_attention(
            merge_out_.data(), merge_lse_.data(), parts, head_dim,
            attn + static_cast<int64_t>(unit.first + i) * q_dim + h * head_dim);
        if (sinks != nullptr) {
          lse_[static_cast<size_t>(unit.first + i) * heads + h] =
              static_cast<float>(ctx.ops->log_sum_exp(merge_lse_.data(), parts));
        }
      }
    }
    if (sinks != nullptr) {
      ctx.ops->attention_sinks(attn + static_cast<int64_t>(unit.first) * q_dim,
                               Row(lse_, unit.first, heads), sinks, unit.count, heads, head_dim);
    }
  }
  ctx.stats.attention_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - attention_start).count();
}

namespace {

std::vector<model::AttentionShape> Shapes(const model::ModelConfig& config) {
  std::vector<model::AttentionShape> shapes;
  for (int l = 0; l < config.num_hidden_layers; ++l) shapes.push_back(config.LayerAttention(l));
  return shapes;
}

std::vector<std::vector<float>> RopeTables(const model::ModelConfig& config) {
  std::vector<std::vector<float>> tables;
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    tables.push_back(config.Mixer(l) == model::MixerKind::kAttention ? config.RopeFrequencies(l)
                                                                     : std::vector<float>());
  }
  return tables;
}

}  // namespace

AttentionBlock::AttentionBlock(const model::ModelConfig& config, KvBlockPool* pool,
                               const CacheLayout& layout)
    : pool_(pool),
      layout_(layout),
      shapes_(Shapes(config)),
      rope_freq_(RopeTables(config)),
      ones_(static_cast<size_t>(std::max(config.head_dim, config.global_attention.head_dim)),
            1.0f) {}

CacheSpec AttentionBlock::cache(int layer) const {
  const model::AttentionShape& shape = shapes_[layer];
  CacheSpec spec{.kind = CacheSpec::Kind::kPagedKv,
                 .kv_heads = static_cast<int>(shape.kv_heads),
                 .head_dim = static_cast<int>(shape.head_dim)};
  if (layout_.ring_blocks[layer] > 0) {
    spec.kind = CacheSpec::Kind::kWindowRing;
    spec.ring_blocks = layout_.ring_blocks[layer];
    spec.state_bytes = 2 * int64_t{spec.ring_blocks} * layout_.ring_block_bytes[layer];
  }
  return spec;
}

LayerKv AttentionBlock::Kv(int layer) const {
  const int ring_blocks = layout_.ring_blocks[layer];
  const auto table = ring_tables_.find(ring_blocks);
  return {.pool = pool_,
          .kv_heads = static_cast<int>(shapes_[layer].kv_heads),
          .head_dim = static_cast<int>(shapes_[layer].head_dim),
          .kv_layer = layout_.kv_layers[layer],
          .ring_offset = layout_.state_offsets[layer],
          .ring_blocks = ring_blocks,
          .ring_table = table == ring_tables_.end() ? nullptr : table->second.data()};
}

absl::Status AttentionBlock::Forward(int l, StepContext& ctx, float* out) {
  const model::ModelConfig& c = ctx.w.config;
  const AttentionWeights& L = ctx.w.layers[l].attention;
  const int T = ctx.tokens();
  const model::AttentionShape& shape = shapes_[l];
  const int heads = static_cast<int>(c.num_attention_heads);
  const int kv_heads = static_cast<int>(shape.kv_heads);
  const int head_dim = static_cast<int>(shape.head_dim);
  const int q_dim = heads * head_dim;
  const int kv_dim = kv_heads * head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = c.AttentionScale(l);
  const bool gated = c.attention_output_gate;
  const int q_rows = gated ? 2 * q_dim : q_dim;  // [q | gate] per head when gated
  const kernels::RopeSpec rope{rope_freq_[l].data(), static_cast<int>(shape.rotary_dim),
                               c.rope_interleaved};
  Resize(q_raw_, T, q_rows);
  Resize(q_, T, q_dim);
  Resize(k_, T, kv_dim);
  Resize(v_, T, kv_dim);
  Resize(attn_, T, q_dim);

  float* const q_out = gated ? q_raw_.data() : q_.data();
  // q, k and v in one pass over the threads, the input rounded once; values from the keys'
  // projection where the layer has no v_proj.
  kernels::LinearProduct qkv[3] = {{.x = ctx.h.data(), .b = T, .w = L.q.view(), .y = q_out},
                                   {.x = ctx.h.data(), .b = T, .w = L.k.view(), .y = k_.data()}};
  int products = 2;
  if (!shape.values_from_keys) {
    qkv[products++] = {.x = ctx.h.data(), .b = T, .w = L.v.view(), .y = v_.data()};
  }
  ctx.LinearGroup(absl::MakeConstSpan(qkv, products));
  if (shape.values_from_keys) std::memcpy(v_.data(), k_.data(), sizeof(float) * T * kv_dim);
  AddBias(*ctx.ops, L.q_bias, T, q_out);
  AddBias(*ctx.ops, L.k_bias, T, k_.data());
  AddBias(*ctx.ops, L.v_bias, T, v_.data());
  if (gated) {  // each head's q, then its gate
    Resize(gate_, T, q_dim);
    ctx.ops->gather_rows(q_raw_.data(), 2 * head_dim, nullptr, T * heads, head_dim, q_.data(),
                         head_dim);
    ctx.ops->gather_rows(q_raw_.data() + head_dim, 2 * head_dim, nullptr, T * heads, head_dim,
                         gate_.data(), head_dim);
  }
  if (!L.q_norm.empty()) {  // Qwen3-MoE: RMSNorm of every head of q and k, before RoPE
    ctx.ops->rms_norm(q_.data(), T * heads, head_dim, L.q_norm.data(), eps, q_.data());
    ctx.ops->rms_norm(k_.data(), T * kv_heads, head_dim, L.k_norm.data(), eps, k_.data());
  }
  if (c.value_norm) {  // Gemma 4: each value head RMS-normed, without weight
    ctx.ops->rms_norm(v_.data(), T * kv_heads, head_dim, ones_.data(), eps, v_.data());
  }
  ctx.ops->rope(q_.data(), T, heads, head_dim, rope, ctx.positions.data());
  ctx.ops->rope(k_.data(), T, kv_heads, head_dim, rope, ctx.positions.data());
  const int window = static_cast<int>(c.LayerWindow(l));
  const float* sinks = L.sinks.empty() ? nullptr : L.sinks.data();
  const int ring_blocks = layout_.ring_blocks[l];
  // Each sequence's keys and values are stored before its queries read them (causal within a
  // chunk): all at once into paged blocks; into a ring of ring_blocks * block_size positions, in
  // rounds of up to that less the window (plus its own), each stored then attended before the
  // next writes over the positions that fell out of every query's window.
  int round = std::numeric_limits<int>::max();
  if (ring_blocks > 0) {
    const int block_size = pool_->config().block_size;
    round = ring_blocks * block_size - window + 1;
    int last_position = 0;
    for (int t = 0; t < T; ++t) last_position = std::max(last_position, ctx.positions[t]);
    std::vector<int32_t>& table = ring_tables_[ring_blocks];
    for (size_t b = table.size(); b <= static_cast<size_t>(last_position / block_size); ++b) {
      table.push_back(static_cast<int32_t>(b % static_cast<size_t>(ring_blocks)));
    }
  }
  int rounds = 0;
  for (size_t seq = 0; seq < ctx.batch.size(); ++seq) {
    const int n = ctx.row_begin[seq + 1] - ctx.row_begin[seq];
    rounds = std::max(rounds, n / round + (n % round != 0));
  }
  const LayerKv kv = Kv(l);
  for (int r = 0; r < rounds; ++r) {
    if (rounds > 1) round_rows_.assign(T, 0);
    for (size_t seq = 0; seq < ctx.batch.size(); ++seq) {
      const int first = ctx.row_begin[seq] + r * (rounds > 1 ? round : 0);
      const int end = std::min(ctx.row_begin[seq + 1], rounds > 1 ? first + round : T);
      if (first >= end) continue;
      ctx.ops->kv_store(kv.Writer(*ctx.batch[seq].block_table), end - first,
                        ctx.positions.data() + first, Row(k_, first, kv_dim),
                        Row(v_, first, kv_dim));
      if (rounds > 1) std::fill(round_rows_.begin() + first, round_rows_.begin() + end, 1);
    }
    attend_.Run(ctx, kv, q_.data(), heads, window, scale, sinks, attn_.data(),
                rounds > 1 ? &round_rows_ : nullptr);
  }
  if (gated) {
    ctx.ops->sigmoid(gate_.data(), T * q_dim);
    ctx.ops->mul(gate_.data(), T * q_dim, attn_.data());
  }
  ctx.Linear(attn_.data(), T, L.o.view(), out);
  AddBias(*ctx.ops, L.o_bias, T, out);
  return absl::OkStatus();
}

}  // namespace tandem::engine
