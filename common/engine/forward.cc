#include "common/engine/forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/engine/overlay.h"
#include "common/kernels/cpu/kernels.h"
#include "common/kernels/cpu/thread_pool.h"
#include "common/util/status.h"

namespace tandem::engine {
namespace {

namespace k = kernels::cpu;

constexpr int64_t kMinAttentionWork = int64_t{1} << 16;
// Positions in a part of a context split over threads (ForwardPass::Attention).
constexpr int64_t kMinAttentionPart = 512;
// Queries of one sequence attended together (Backend::causal_attention).
constexpr int kQueryBlock = 16;

// Sizes a (rows, cols) buffer; its capacity only grows, so steady-state steps do not allocate.
void Resize(std::vector<float>& buffer, int rows, int cols) {
  buffer.resize(static_cast<size_t>(rows) * cols);
}

float* Row(std::vector<float>& buffer, int64_t row, int cols) { return buffer.data() + row * cols; }

void Bf16RowToF32(const uint16_t* row, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = k::Bf16ToF32(row[i]);
}

// x (rows, n) += bias (n,) on every row; no-op for an empty bias.
void AddBias(const std::vector<float>& bias, int rows, float* x) {
  if (bias.empty()) return;
  const int n = static_cast<int>(bias.size());
  for (int r = 0; r < rows; ++r) {
    float* row = x + static_cast<int64_t>(r) * n;
    for (int i = 0; i < n; ++i) row[i] += bias[i];
  }
}

}  // namespace

int ExpertRunWidth(const model::ModelConfig& config, int width) {
  const model::QuantizationConfig& q = config.quantization;
  if (!q.experts || width <= 0) return width;
  const int group = q.group_size;
  return std::min(static_cast<int>(config.intermediate_size), (width + group - 1) / group * group);
}

absl::StatusOr<std::unique_ptr<ForwardPass>> ForwardPass::Create(const ModelWeights* weights,
                                                                 KvBlockPool* pool,
                                                                 const kernels::Backend* backend) {
  const model::ModelConfig& c = weights->config;
  const KvCacheConfig& kv = pool->config();
  if (kv.num_layers != c.num_hidden_layers || kv.num_kv_heads != c.num_key_value_heads ||
      kv.head_dim != c.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool geometry (layers ", kv.num_layers, ", kv heads ", kv.num_kv_heads,
                     ", head dim ", kv.head_dim, ") does not match the model (",
                     c.num_hidden_layers, ", ", c.num_key_value_heads, ", ", c.head_dim, ")"));
  }
  return std::unique_ptr<ForwardPass>(new ForwardPass(weights, pool, backend));
}

absl::Status ForwardPass::ValidateMask(const ExpertMask* mask) const {
  const model::ModelConfig& c = w_->config;
  // With a provider, expert weights come from it, whatever the model holds.
  const bool partial = provider_ == nullptr && !w_->resident.retained.empty();
  if (mask == nullptr || mask->retained.empty()) {
    if (!partial) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "this engine holds only some experts' weights (a pruning plan's); its steps need a mask "
        "that retains no others");
  }
  if (static_cast<int64_t>(mask->retained.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError("expert mask must have one entry per layer");
  }
  for (size_t l = 0; l < mask->retained.size(); ++l) {
    const std::vector<bool>& layer = mask->retained[l];
    const int64_t kept = std::count(layer.begin(), layer.end(), true);
    if (static_cast<int64_t>(layer.size()) != c.num_local_experts || kept < c.num_experts_per_tok) {
      return absl::InvalidArgumentError(absl::StrCat("expert mask layers need ",
                                                     c.num_local_experts, " entries with at least ",
                                                     c.num_experts_per_tok, " retained"));
    }
    for (size_t e = 0; partial && e < layer.size(); ++e) {
      if (layer[e] && !w_->HasExpert(static_cast<int>(l), static_cast<int>(e))) {
        return absl::InvalidArgumentError(absl::StrCat("the expert mask retains expert ", e,
                                                       " of layer ", l,
                                                       ", whose weights this engine did not load"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ForwardPass::Validate(absl::Span<const StepInput> batch, const MoeOptions& moe) const {
  const model::ModelConfig& c = w_->config;
  // The step's controls are checked only if some sequence runs them.
  if (std::any_of(batch.begin(), batch.end(), [](const StepInput& in) { return !in.moe; })) {
    RETURN_IF_ERROR(ValidateMask(moe.mask));
  }
  const ExpertMask* checked = nullptr;  // sequences usually share one mask
  const int block_size = pool_->config().block_size;
  for (size_t s = 0; s < batch.size(); ++s) {
    const StepInput& in = batch[s];
    if (in.tokens.empty())
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": no tokens"));
    if (in.block_table == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": no block table"));
    }
    const int64_t end = static_cast<int64_t>(in.start_position) + in.tokens.size();
    if (in.start_position < 0 || end > c.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, ": positions [", in.start_position, ", ", end,
                       ") outside the context length ", c.max_position_embeddings));
    }
    if (static_cast<int64_t>(in.block_table->blocks().size()) * block_size < end) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": block table holds ",
                                                     in.block_table->blocks().size() * block_size,
                                                     " tokens, the step needs ", end));
    }
    for (int32_t token : in.tokens) {
      if (token < 0 || token >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": token id ", token, " outside the vocabulary"));
      }
    }
    const DecoderOverlay* overlay = in.moe != nullptr ? in.moe->overlay : moe.overlay;
    if (overlay != nullptr && static_cast<int64_t>(overlay->layers.size()) != c.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": the decoder overlay has ",
                                                     overlay->layers.size(), " layers, the model ",
                                                     c.num_hidden_layers));
    }
    if (in.moe != nullptr && (in.moe->mask != checked || checked == nullptr)) {
      if (absl::Status status = ValidateMask(in.moe->mask); !status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", status.message()));
      }
      checked = in.moe->mask;
    }
  }
  return absl::OkStatus();
}

absl::Status ForwardPass::Step(absl::Span<const StepInput> batch, const MoeOptions& moe,
                               std::vector<std::vector<float>>* logits, RouterTrace* trace) {
  if (absl::Status s = Validate(batch, moe); !s.ok()) return s;
  ops_ = backend_ != nullptr ? backend_ : &k::ActiveBackend();
  if (trace != nullptr) *trace = RouterTrace();
  Prepare(batch, moe);
  Embed();
  const model::ModelConfig& c = w_->config;
  const int hidden = static_cast<int>(c.hidden_size);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Attention(l, batch);
    for (const RowRun& run : runs_) {
      ops_->rms_norm(Row(x_, run.begin, hidden), run.end - run.begin, hidden,
                     AlwaysOn(run, l).ffn_norm.data(), static_cast<float>(c.rms_norm_eps),
                     Row(h_, run.begin, hidden));
    }
    if (!c.IsSparseLayer(l)) {  // a dense MLP layer: every token, no routing
      DenseMlp(l);
      if (trace != nullptr) {  // the trace keeps one (empty) entry per layer
        trace->probs.emplace_back();
        trace->experts.emplace_back();
        trace->weights.emplace_back();
        trace->widths.emplace_back();
      }
    } else {
      RETURN_IF_ERROR(Route(l, batch, moe, trace));
      RETURN_IF_ERROR(RunExperts(l));
      if (c.HasSharedExpert()) SharedExpert(l);
    }
    for (size_t i = 0; i < x_.size(); ++i) x_[i] += moe_[i];
  }
  Logits(batch, moe, logits);
  return absl::OkStatus();
}

const LayerWeights& ForwardPass::AlwaysOn(const RowRun& run, int l) const {
  return run.overlay != nullptr ? run.overlay->layers[l] : w_->layers[l];
}

void ForwardPass::Linear(const float* in, int rows, const kernels::PackedMatrix& w, float* out,
                         bool exact) {
  (exact ? ops_->linear_f32 : ops_->linear)(in, rows, w, out);
  stats_.weight_bytes += w.bytes_read();
  stats_.matmul_flops += int64_t{2} * rows * w.rows * w.cols;
}

void ForwardPass::Prepare(absl::Span<const StepInput> batch, const MoeOptions& moe) {
  const model::ModelConfig& c = w_->config;
  refs_.clear();
  for (size_t s = 0; s < batch.size(); ++s) {
    for (size_t i = 0; i < batch[s].tokens.size(); ++i) {
      refs_.push_back(
          {static_cast<int>(s), batch[s].start_position + static_cast<int>(i), batch[s].tokens[i]});
    }
  }
  const int T = static_cast<int>(refs_.size());
  // Rows by always-on weights: usually one run; in colocated mode with an overlay, prompts run
  // the model's and generated tokens the overlay's.
  runs_.clear();
  for (size_t s = 0, row = 0; s < batch.size(); ++s) {
    const DecoderOverlay* overlay = (batch[s].moe != nullptr ? *batch[s].moe : moe).overlay;
    const int end = static_cast<int>(row + batch[s].tokens.size());
    if (!runs_.empty() && runs_.back().overlay == overlay) {
      runs_.back().end = end;
    } else {
      runs_.push_back({static_cast<int>(row), end, overlay});
    }
    row = end;
  }
  stats_ = StepStats();
  stats_.tokens = T;
  const int hidden = static_cast<int>(c.hidden_size);
  const int q_dim = static_cast<int>(c.num_attention_heads * c.head_dim);
  const int kv_dim = static_cast<int>(c.num_key_value_heads * c.head_dim);
  const int num_experts = static_cast<int>(c.num_local_experts);
  const int top_k = static_cast<int>(c.num_experts_per_tok);
  Resize(x_, T, hidden);
  Resize(h_, T, hidden);
  Resize(q_, T, q_dim);
  Resize(k_, T, kv_dim);
  Resize(v_, T, kv_dim);
  Resize(attn_, T, q_dim);
  Resize(proj_, T, hidden);
  Resize(router_logits_, T, num_experts);
  Resize(moe_, T, hidden);
  chosen_.resize(static_cast<size_t>(T) * top_k);
  chosen_w_.resize(chosen_.size());
  chosen_width_.resize(chosen_.size());
  routed_.resize(num_experts);
  order_.resize(num_experts);
}

void ForwardPass::Embed() {
  const int hidden = static_cast<int>(w_->config.hidden_size);
  for (size_t t = 0; t < refs_.size(); ++t) {
    Bf16RowToF32(w_->embed.row(refs_[t].token), hidden, Row(x_, static_cast<int64_t>(t), hidden));
  }
}

void ForwardPass::Attention(int l, absl::Span<const StepInput> batch) {
  const model::ModelConfig& c = w_->config;
  const LayerWeights& L = w_->layers[l];
  const int T = static_cast<int>(refs_.size());
  const int hidden = static_cast<int>(c.hidden_size);
  const int heads = static_cast<int>(c.num_attention_heads);
  const int kv_heads = static_cast<int>(c.num_key_value_heads);
  const int head_dim = static_cast<int>(c.head_dim);
  const int q_dim = heads * head_dim;
  const int kv_dim = kv_heads * head_dim;
  const int block_size = pool_->config().block_size;
  const float theta = static_cast<float>(c.rope_theta);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  for (const RowRun& run : runs_) {
    ops_->rms_norm(Row(x_, run.begin, hidden), run.end - run.begin, hidden,
                   AlwaysOn(run, l).attn_norm.data(), eps, Row(h_, run.begin, hidden));
  }
  if (!L.qkv.empty()) {  // one product, then each token's q, k and v apart
    Resize(qkv_, T, q_dim + 2 * kv_dim);
    Linear(h_.data(), T, L.qkv.view(), qkv_.data());
    for (int t = 0; t < T; ++t) {
      const float* row = Row(qkv_, t, q_dim + 2 * kv_dim);
      std::memcpy(Row(q_, t, q_dim), row, q_dim * sizeof(float));
      std::memcpy(Row(k_, t, kv_dim), row + q_dim, kv_dim * sizeof(float));
      std::memcpy(Row(v_, t, kv_dim), row + q_dim + kv_dim, kv_dim * sizeof(float));
    }
  } else {
    Linear(h_.data(), T, L.q.view(), q_.data());
    Linear(h_.data(), T, L.k.view(), k_.data());
    Linear(h_.data(), T, L.v.view(), v_.data());
  }
  AddBias(L.q_bias, T, q_.data());
  AddBias(L.k_bias, T, k_.data());
  AddBias(L.v_bias, T, v_.data());
  if (!L.q_norm.empty()) {  // Qwen3-MoE: RMSNorm of every head of q and k, before RoPE
    ops_->rms_norm(q_.data(), T * heads, head_dim, L.q_norm.data(), eps, q_.data());
    ops_->rms_norm(k_.data(), T * kv_heads, head_dim, L.k_norm.data(), eps, k_.data());
  }
  for (int t = 0; t < T; ++t) {
    const TokenRef& r = refs_[t];
    ops_->rope(Row(q_, t, q_dim), heads, head_dim, r.position, theta);
    ops_->rope(Row(k_, t, kv_dim), kv_heads, head_dim, r.position, theta);
    const auto& blocks = batch[r.seq].block_table->blocks();
    pool_->StoreToken(l, blocks[r.position / block_size], r.position % block_size,
                      Row(k_, t, kv_dim), Row(v_, t, kv_dim));
  }
  // Every token's K/V is in the cache before any query reads it (causal within a chunk). The
  // queries form units: a run of consecutive tokens of one sequence (a prompt's chunk) in blocks
  // of kQueryBlock, which causal_attention computes reading each key and value once per block,
  // and every other token alone. Work items are (unit, part of its context), every KV head at
  // once so that each slot is read in order: a context splits into parts only when there are
  // fewer units than twice the threads, each part at least kMinAttentionPart positions, so that
  // a long context at a small batch still spreads over every thread (flash-decoding); parts
  // merge by their log-sum-exps. Items spread over the kernel threads in shares of at least
  // kMinAttentionWork multiply-adds.
  const auto attention_start = std::chrono::steady_clock::now();
  const int threads = k::DefaultThreadPool().num_threads();
  // Bytes one position of one KV head occupies in K (or V): values, and int8's scale.
  const int64_t kv_position_bytes =
      static_cast<int64_t>(kernels::KvBlockBytes(pool_->dtype(), 1, 1, head_dim));
  units_.clear();
  for (int t = 0; t < T;) {
    int m = 1;
    while (m < kQueryBlock && t + m < T && refs_[t + m].seq == refs_[t].seq &&
           refs_[t + m].position == refs_[t].position + m) {
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
    const int context = refs_[unit.first + unit.count - 1].position + 1;  // the last query's
    int parts = 1;
    if (U < 2 * threads) {
      parts = static_cast<int>(std::min<int64_t>(
          (context + kMinAttentionPart - 1) / kMinAttentionPart, (2 * threads + U - 1) / U));
    }
    attention_parts_[u + 1] = attention_parts_[u] + parts;
    if (parts > 1) {
      unit.part_row = part_rows;
      part_rows += int64_t{parts} * unit.count;
    }
    attention_work += int64_t{2} * context * q_dim * unit.count;
    stats_.kv_bytes += int64_t{2} * context * kv_heads * kv_position_bytes;
  }
  const int64_t items = attention_parts_[U];
  part_out_.resize(static_cast<size_t>(part_rows) * q_dim);
  part_lse_.resize(static_cast<size_t>(part_rows) * heads);
  const int64_t grain =
      std::max<int64_t>(1, kMinAttentionWork * items / std::max<int64_t>(1, attention_work));
  k::DefaultThreadPool().ParallelFor(items, grain, [&](int64_t begin, int64_t end) {
    int u = 0;
    for (int64_t item = begin; item < end; ++item) {  // item = (unit, part), in unit order
      while (attention_parts_[u + 1] <= item) ++u;
      const AttentionUnit& unit = units_[u];
      const int parts = static_cast<int>(attention_parts_[u + 1] - attention_parts_[u]);
      const int part = static_cast<int>(item - attention_parts_[u]);
      const TokenRef& first = refs_[unit.first];
      const int context = first.position + unit.count;
      const kernels::PagedKv kv = pool_->View(l, batch[first.seq].block_table->blocks().data());
      const float* q = Row(q_, unit.first, q_dim);
      // The whole context into attn_, or this part's outputs and log-sum-exps into its rows.
      const int64_t row = unit.part_row + int64_t{part} * unit.count;
      float* out = parts == 1 ? Row(attn_, unit.first, q_dim) : Row(part_out_, row, q_dim);
      float* lse = parts == 1 ? nullptr : Row(part_lse_, row, heads);
      const int begin = static_cast<int>(int64_t{context} * part / parts);
      const int end = static_cast<int>(int64_t{context} * (part + 1) / parts);
      if (unit.count == 1) {
        ops_->paged_attention(q, heads, kv, begin, end, scale, 0, kv_heads, out, lse);
      } else {
        ops_->causal_attention(q, unit.count, heads, kv, first.position, begin, end, scale, out,
                               lse);
      }
    }
  });
  for (int u = 0; u < U; ++u) {
    const AttentionUnit& unit = units_[u];
    const int parts = static_cast<int>(attention_parts_[u + 1] - attention_parts_[u]);
    if (parts == 1) continue;
    merge_out_.resize(parts);
    merge_lse_.resize(parts);
    for (int i = 0; i < unit.count; ++i) {
      for (int h = 0; h < heads; ++h) {
        for (int p = 0; p < parts; ++p) {
          const int64_t row = unit.part_row + int64_t{p} * unit.count + i;
          merge_out_[p] = Row(part_out_, row, q_dim) + h * head_dim;
          merge_lse_[p] = part_lse_[row * heads + h];
        }
        k::MergeAttentionParts(merge_out_.data(), merge_lse_.data(), parts, head_dim,
                               Row(attn_, unit.first + i, q_dim) + h * head_dim);
      }
    }
  }
  stats_.attention_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - attention_start).count();
  Linear(attn_.data(), T, L.o.view(), proj_.data());
  AddBias(L.o_bias, T, proj_.data());
  for (size_t i = 0; i < x_.size(); ++i) x_[i] += proj_[i];
}

absl::Status ForwardPass::Route(int l, absl::Span<const StepInput> batch, const MoeOptions& moe,
                                RouterTrace* trace) {
  const model::ModelConfig& c = w_->config;
  const int T = static_cast<int>(refs_.size());
  const int hidden = static_cast<int>(c.hidden_size);
  const int inter = static_cast<int>(c.intermediate_size);
  const int num_experts = static_cast<int>(c.num_local_experts);
  const int top_k = static_cast<int>(c.num_experts_per_tok);
  if (router_ == nullptr) {
    // Float32 activations at every level: the logits pick experts.
    for (const RowRun& run : runs_) {
      Linear(Row(h_, run.begin, hidden), run.end - run.begin, AlwaysOn(run, l).router.view(),
             Row(router_logits_, run.begin, num_experts), /*exact=*/true);
    }
  } else {
    for (int t = 0; t < T; ++t) {
      router_->Logits(l, refs_[t].token, refs_[t].position,
                      absl::MakeSpan(Row(router_logits_, t, num_experts), num_experts));
    }
  }
  for (auto& pairs : routed_) pairs.clear();
  for (int t = 0; t < T; ++t) {
    float* p = Row(router_logits_, t, num_experts);
    const MoeOptions& options = batch[refs_[t].seq].moe != nullptr ? *batch[refs_[t].seq].moe : moe;
    if (options.mask != nullptr && !options.mask->retained.empty()) {
      for (int e = 0; e < num_experts; ++e) {
        if (!options.mask->retained[l][e]) p[e] = -std::numeric_limits<float>::infinity();
      }
    }
    ops_->softmax(p, num_experts);
    // Top-k by probability; on equal probabilities the lower expert index wins.
    for (int e = 0; e < num_experts; ++e) order_[e] = e;
    std::partial_sort(order_.begin(), order_.begin() + top_k, order_.end(),
                      [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    // norm_topk_prob: the chosen probabilities renormalised to sum to one (Mixtral always;
    // Qwen where the config says so), else the softmax probabilities as they are.
    float mass = 1.0f;
    if (c.norm_topk_prob) {
      mass = 0;
      for (int j = 0; j < top_k; ++j) mass += p[order_[j]];
    }
    int32_t* experts = &chosen_[static_cast<size_t>(t) * top_k];
    float* weights = &chosen_w_[static_cast<size_t>(t) * top_k];
    int* widths = &chosen_width_[static_cast<size_t>(t) * top_k];
    for (int j = 0; j < top_k; ++j) {
      experts[j] = order_[j];
      weights[j] = p[order_[j]] / mass;
      widths[j] = inter;
    }
    if (options.widths != nullptr) {
      options.widths->Widths(l, absl::MakeConstSpan(experts, top_k), absl::MakeSpan(weights, top_k),
                             absl::MakeSpan(widths, top_k));
    }
    for (int j = 0; j < top_k; ++j) {
      if (widths[j] < 0 || widths[j] > inter) {
        return absl::InvalidArgumentError(absl::StrCat("width policy gave width ", widths[j],
                                                       " for expert ", experts[j], " of layer ", l,
                                                       "; widths must lie in [0, ", inter, "]"));
      }
      widths[j] = ExpertRunWidth(c, widths[j]);
      if (widths[j] > 0) routed_[experts[j]].push_back({t, widths[j], weights[j]});
    }
  }
  if (trace != nullptr) {
    trace->probs.push_back(router_logits_);
    trace->experts.push_back(chosen_);
    trace->weights.push_back(chosen_w_);
    trace->widths.emplace_back(chosen_width_.begin(), chosen_width_.end());
  }
  return absl::OkStatus();
}

void ForwardPass::SharedExpert(int l) {
  // Qwen2-MoE's shared expert: every token, scaled by sigmoid(shared_expert_gate . h).
  const int T = static_cast<int>(refs_.size());
  const int hidden = static_cast<int>(w_->config.hidden_size);
  Resize(shared_out_, T, hidden);
  shared_scale_.resize(T);
  for (const RowRun& run : runs_) {
    const LayerWeights& A = AlwaysOn(run, l);
    Mlp(A.shared, run.begin, run.end - run.begin, Row(shared_out_, run.begin, hidden));
    Linear(Row(h_, run.begin, hidden), run.end - run.begin, A.shared_gate.view(),
           shared_scale_.data() + run.begin, /*exact=*/true);
  }
  for (int t = 0; t < T; ++t) {
    const float scale = 1.0f / (1.0f + std::exp(-shared_scale_[t]));
    ops_->axpy(scale, Row(shared_out_, t, hidden), hidden, Row(moe_, t, hidden));
  }
}

void ForwardPass::DenseMlp(int l) {
  const int hidden = static_cast<int>(w_->config.hidden_size);
  for (const RowRun& run : runs_) {
    Mlp(AlwaysOn(run, l).dense, run.begin, run.end - run.begin, Row(moe_, run.begin, hidden));
  }
}

void ForwardPass::Logits(absl::Span<const StepInput> batch, const MoeOptions& moe,
                         std::vector<std::vector<float>>* logits) {
  // Final norm and lm_head, only for the rows whose logits are wanted, gathered into one
  // product: the lm_head is read once per step, not once per sequence.
  const model::ModelConfig& c = w_->config;
  const int hidden = static_cast<int>(c.hidden_size);
  const int vocab = static_cast<int>(c.vocab_size);
  const float eps = static_cast<float>(c.rms_norm_eps);
  logits->resize(batch.size());
  std::vector<int> wanted(batch.size());  // rows of logits per sequence
  int total = 0, only = -1;
  Resize(proj_, static_cast<int>(refs_.size()), hidden);
  for (size_t s = 0, first = 0; s < batch.size(); ++s) {
    const int n = static_cast<int>(batch[s].tokens.size());
    wanted[s] = batch[s].logits == LogitRows::kAll    ? n
                : batch[s].logits == LogitRows::kLast ? 1
                                                      : 0;
    (*logits)[s].resize(static_cast<size_t>(wanted[s]) * vocab);
    if (wanted[s] > 0) {
      std::memcpy(Row(proj_, total, hidden),
                  Row(x_, static_cast<int>(first) + n - wanted[s], hidden),
                  static_cast<size_t>(wanted[s]) * hidden * sizeof(float));
      only = total == 0 ? static_cast<int>(s) : -1;
      total += wanted[s];
    }
    first += n;
  }
  if (total == 0) return;
  for (size_t s = 0, row = 0; s < batch.size(); ++s) {  // each with its final norm
    if (wanted[s] == 0) continue;
    const DecoderOverlay* overlay = (batch[s].moe != nullptr ? *batch[s].moe : moe).overlay;
    const std::vector<float>& norm = overlay != nullptr ? overlay->final_norm : w_->final_norm;
    ops_->rms_norm(Row(proj_, static_cast<int>(row), hidden), wanted[s], hidden, norm.data(), eps,
                   Row(h_, static_cast<int>(row), hidden));
    row += wanted[s];
  }
  if (only >= 0) {  // one sequence wants logits: straight into its output
    Linear(h_.data(), total, w_->lm_head.view(), (*logits)[only].data());
    return;
  }
  Resize(logits_, total, vocab);
  Linear(h_.data(), total, w_->lm_head.view(), logits_.data());
  for (size_t s = 0, row = 0; s < batch.size(); ++s) {
    if (wanted[s] == 0) continue;  // an empty vector's data() may be null, even for memcpy
    std::memcpy((*logits)[s].data(), Row(logits_, static_cast<int>(row), vocab),
                (*logits)[s].size() * sizeof(float));
    row += wanted[s];
  }
}

void ForwardPass::Mlp(const ExpertWeights& w, int row0, int rows, float* out) {
  const int hidden = static_cast<int>(w_->config.hidden_size);
  const int width = w.gate.rows();
  Resize(gate_, rows, width);
  Resize(up_, rows, width);
  Resize(act_, rows, width);
  const float* in = Row(h_, row0, hidden);
  Linear(in, rows, w.gate.view(), gate_.data());
  Linear(in, rows, w.up.view(), up_.data());
  ops_->silu_mul(gate_.data(), up_.data(), rows * width, act_.data());
  Linear(act_.data(), rows, w.down.view(), out);
}

absl::Status ForwardPass::RunExperts(int l) {
  const model::ModelConfig& c = w_->config;
  const int hidden = static_cast<int>(c.hidden_size);
  std::fill(moe_.begin(), moe_.end(), 0.0f);
  // The experts the step runs, widest first (ties by index). A token's two outputs (top-2) add
  // to the same float in either order, so the order does not change results; with more experts
  // per token it changes them by rounding only.
  loads_.clear();
  for (size_t e = 0; e < routed_.size(); ++e) {
    std::vector<Routed>& pairs = routed_[e];
    if (pairs.empty()) continue;
    // Widest first; token order within a width, so results do not depend on the batch.
    std::stable_sort(pairs.begin(), pairs.end(),
                     [](const Routed& a, const Routed& b) { return a.width > b.width; });
    loads_.push_back({static_cast<int>(e), pairs.front().width});
  }
  std::stable_sort(loads_.begin(), loads_.end(),
                   [](const ExpertLoad& a, const ExpertLoad& b) { return a.width > b.width; });
  if (provider_ != nullptr) RETURN_IF_ERROR(provider_->BeginLayer(l, loads_));
  absl::Status status;
  for (const ExpertLoad& load : loads_) {
    const int e = load.expert;
    std::vector<Routed>& pairs = routed_[e];
    ExpertView E;
    if (provider_ != nullptr) {
      absl::StatusOr<ExpertView> view = provider_->Wait(l, e, load.width);
      if (!view.ok()) {
        status = view.status();
        break;
      }
      E = *view;
    } else {
      const ExpertWeights& W = w_->layers[l].experts[e];
      E = {W.gate.view(), W.up.view(), W.down.view()};
    }
    for (size_t begin = 0; begin < pairs.size();) {
      const int width = pairs[begin].width;
      size_t end = begin;
      while (end < pairs.size() && pairs[end].width == width) ++end;
      const int m = static_cast<int>(end - begin);
      Resize(expert_in_, m, hidden);
      Resize(gate_, m, width);
      Resize(up_, m, width);
      Resize(act_, m, width);
      Resize(expert_out_, m, hidden);
      for (int i = 0; i < m; ++i) {
        std::memcpy(Row(expert_in_, i, hidden), Row(h_, pairs[begin + i].token, hidden),
                    hidden * sizeof(float));
      }
      // gate and up: the first `width` rows; down: the first `width` columns of each row.
      kernels::PackedMatrix gate = E.gate, up = E.up, down = E.down;
      gate.rows = up.rows = down.cols = width;
      const int64_t before = stats_.weight_bytes;
      Linear(expert_in_.data(), m, gate, gate_.data());
      Linear(expert_in_.data(), m, up, up_.data());
      ops_->silu_mul(gate_.data(), up_.data(), m * width, act_.data());
      Linear(act_.data(), m, down, expert_out_.data());
      stats_.expert_weight_bytes += stats_.weight_bytes - before;
      ++stats_.expert_runs;
      if (observer_ != nullptr) {
        observer_tokens_.resize(m);
        for (int i = 0; i < m; ++i) observer_tokens_[i] = pairs[begin + i].token;
        observer_->OnExpert(l, e, width, observer_tokens_, act_.data(), expert_out_.data());
      }
      for (int i = 0; i < m; ++i) {
        ops_->axpy(pairs[begin + i].weight, Row(expert_out_, i, hidden), hidden,
                   Row(moe_, pairs[begin + i].token, hidden));
      }
      begin = end;
    }
  }
  if (provider_ != nullptr) provider_->EndLayer(l);
  return status;
}

}  // namespace tandem::engine
