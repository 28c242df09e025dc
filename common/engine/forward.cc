#include "common/engine/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/kernels.h"

namespace tandem::engine {
namespace {

namespace k = kernels::cpu;

// Where a token of the batch comes from.
struct TokenRef {
  int seq;       // index into the batch
  int position;  // absolute position in its sequence
};

void Bf16RowToF32(const uint16_t* row, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = k::Bf16ToF32(row[i]);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ForwardPass>> ForwardPass::Create(const ModelWeights* weights,
                                                                 KvBlockPool* pool) {
  const model::ModelConfig& c = weights->config;
  const KvCacheConfig& kv = pool->config();
  if (kv.num_layers != c.num_hidden_layers || kv.num_kv_heads != c.num_key_value_heads ||
      kv.head_dim != c.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool geometry (layers ", kv.num_layers, ", kv heads ", kv.num_kv_heads,
                     ", head dim ", kv.head_dim, ") does not match the model (",
                     c.num_hidden_layers, ", ", c.num_key_value_heads, ", ", c.head_dim, ")"));
  }
  return std::unique_ptr<ForwardPass>(new ForwardPass(weights, pool));
}

absl::Status ForwardPass::Validate(absl::Span<const StepInput> batch,
                                   const ExpertMask* mask) const {
  const model::ModelConfig& c = w_->config;
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
  }
  if (mask != nullptr && !mask->retained.empty()) {
    if (static_cast<int64_t>(mask->retained.size()) != c.num_hidden_layers) {
      return absl::InvalidArgumentError("expert mask must have one entry per layer");
    }
    for (const auto& layer : mask->retained) {
      const int64_t kept = std::count(layer.begin(), layer.end(), true);
      if (static_cast<int64_t>(layer.size()) != c.num_local_experts ||
          kept < c.num_experts_per_tok) {
        return absl::InvalidArgumentError(
            absl::StrCat("expert mask layers need ", c.num_local_experts, " entries with at least ",
                         c.num_experts_per_tok, " retained"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ForwardPass::Step(absl::Span<const StepInput> batch, const ExpertMask* mask,
                               std::vector<std::vector<float>>* logits, RouterTrace* trace) {
  if (absl::Status s = Validate(batch, mask); !s.ok()) return s;
  const model::ModelConfig& c = w_->config;
  const int hidden = static_cast<int>(c.hidden_size);
  const int heads = static_cast<int>(c.num_attention_heads);
  const int kv_heads = static_cast<int>(c.num_key_value_heads);
  const int head_dim = static_cast<int>(c.head_dim);
  const int q_dim = heads * head_dim;
  const int kv_dim = kv_heads * head_dim;
  const int inter = static_cast<int>(c.intermediate_size);
  const int num_experts = static_cast<int>(c.num_local_experts);
  const int top_k = static_cast<int>(c.num_experts_per_tok);
  const int block_size = pool_->config().block_size;
  const float theta = static_cast<float>(c.rope_theta);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const bool use_mask = mask != nullptr && !mask->retained.empty();

  std::vector<TokenRef> refs;
  for (size_t s = 0; s < batch.size(); ++s) {
    for (size_t i = 0; i < batch[s].tokens.size(); ++i) {
      refs.push_back({static_cast<int>(s), batch[s].start_position + static_cast<int>(i)});
    }
  }
  const int T = static_cast<int>(refs.size());

  // x (T, hidden): the residual stream.
  std::vector<float> x(static_cast<size_t>(T) * hidden);
  {
    int t = 0;
    for (const StepInput& in : batch) {
      for (int32_t token : in.tokens) Bf16RowToF32(w_->embed.row(token), hidden, &x[t++ * hidden]);
    }
  }
  std::vector<float> h(x.size()), q(static_cast<size_t>(T) * q_dim),
      kk(static_cast<size_t>(T) * kv_dim), vv(static_cast<size_t>(T) * kv_dim),
      attn(static_cast<size_t>(T) * q_dim), proj(x.size()),
      router(static_cast<size_t>(T) * num_experts), moe(x.size());
  std::vector<int32_t> chosen(static_cast<size_t>(T) * top_k);
  std::vector<float> chosen_w(static_cast<size_t>(T) * top_k);
  if (trace != nullptr) *trace = RouterTrace();

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = w_->layers[l];
    // Attention.
    k::RmsNorm(x.data(), T, hidden, L.attn_norm.data(), eps, h.data());
    k::MatMulBf16(h.data(), T, hidden, L.q.data.data(), q_dim, q.data());
    k::MatMulBf16(h.data(), T, hidden, L.k.data.data(), kv_dim, kk.data());
    k::MatMulBf16(h.data(), T, hidden, L.v.data.data(), kv_dim, vv.data());
    float* k_pool = pool_->k_pool(l);
    float* v_pool = pool_->v_pool(l);
    for (int t = 0; t < T; ++t) {
      const TokenRef& r = refs[t];
      k::Rope(&q[static_cast<size_t>(t) * q_dim], heads, head_dim, r.position, theta);
      k::Rope(&kk[static_cast<size_t>(t) * kv_dim], kv_heads, head_dim, r.position, theta);
      const auto& blocks = batch[r.seq].block_table->blocks();
      const size_t slot = (static_cast<size_t>(blocks[r.position / block_size]) * block_size +
                           r.position % block_size) *
                          kv_dim;
      std::memcpy(k_pool + slot, &kk[static_cast<size_t>(t) * kv_dim], kv_dim * sizeof(float));
      std::memcpy(v_pool + slot, &vv[static_cast<size_t>(t) * kv_dim], kv_dim * sizeof(float));
    }
    // Every token's K/V is in the cache before any query reads it (causal within a chunk).
    for (int t = 0; t < T; ++t) {
      const TokenRef& r = refs[t];
      k::PagedAttention(&q[static_cast<size_t>(t) * q_dim], heads, kv_heads, head_dim, k_pool,
                        v_pool, batch[r.seq].block_table->blocks().data(), block_size,
                        r.position + 1, scale, &attn[static_cast<size_t>(t) * q_dim]);
    }
    k::MatMulBf16(attn.data(), T, q_dim, L.o.data.data(), hidden, proj.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];

    // MoE: route, group tokens per expert, run each expert once on its tokens.
    k::RmsNorm(x.data(), T, hidden, L.ffn_norm.data(), eps, h.data());
    k::MatMulBf16(h.data(), T, hidden, L.router.data.data(), num_experts, router.data());
    std::vector<std::vector<std::pair<int, float>>> routed(num_experts);
    for (int t = 0; t < T; ++t) {
      float* p = &router[static_cast<size_t>(t) * num_experts];
      if (use_mask) {
        for (int e = 0; e < num_experts; ++e) {
          if (!mask->retained[l][e]) p[e] = -std::numeric_limits<float>::infinity();
        }
      }
      k::Softmax(p, num_experts);
      // Top-k by probability; on equal probabilities the lower expert index wins.
      std::vector<int> order(num_experts);
      for (int e = 0; e < num_experts; ++e) order[e] = e;
      std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                        [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
      float mass = 0;
      for (int j = 0; j < top_k; ++j) mass += p[order[j]];
      for (int j = 0; j < top_k; ++j) {
        const float weight = p[order[j]] / mass;
        chosen[static_cast<size_t>(t) * top_k + j] = order[j];
        chosen_w[static_cast<size_t>(t) * top_k + j] = weight;
        routed[order[j]].emplace_back(t, weight);
      }
    }
    if (trace != nullptr) {
      trace->probs.push_back(router);
      trace->experts.push_back(chosen);
      trace->weights.push_back(chosen_w);
    }
    std::fill(moe.begin(), moe.end(), 0.0f);
    std::vector<float> hs, gate, up, act, out;
    for (int e = 0; e < num_experts; ++e) {
      const auto& tokens = routed[e];
      if (tokens.empty()) continue;
      const int m = static_cast<int>(tokens.size());
      hs.resize(static_cast<size_t>(m) * hidden);
      for (int i = 0; i < m; ++i) {
        std::memcpy(&hs[static_cast<size_t>(i) * hidden],
                    &h[static_cast<size_t>(tokens[i].first) * hidden], hidden * sizeof(float));
      }
      const ExpertWeights& E = L.experts[e];
      gate.resize(static_cast<size_t>(m) * inter);
      up.resize(gate.size());
      act.resize(gate.size());
      out.resize(hs.size());
      k::MatMulBf16(hs.data(), m, hidden, E.gate.data.data(), inter, gate.data());
      k::MatMulBf16(hs.data(), m, hidden, E.up.data.data(), inter, up.data());
      k::SiluMul(gate.data(), up.data(), m * inter, act.data());
      k::MatMulBf16(act.data(), m, inter, E.down.data.data(), hidden, out.data());
      for (int i = 0; i < m; ++i) {
        k::Axpy(tokens[i].second, &out[static_cast<size_t>(i) * hidden], hidden,
                &moe[static_cast<size_t>(tokens[i].first) * hidden]);
      }
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] += moe[i];
  }

  // Final norm and lm_head, only for the rows whose logits are wanted.
  logits->assign(batch.size(), {});
  const int vocab = static_cast<int>(c.vocab_size);
  int first = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const int n = static_cast<int>(batch[s].tokens.size());
    const int rows = batch[s].all_logits ? n : 1;
    const int row0 = first + n - rows;
    std::vector<float> normed(static_cast<size_t>(rows) * hidden);
    k::RmsNorm(&x[static_cast<size_t>(row0) * hidden], rows, hidden, w_->final_norm.data(), eps,
               normed.data());
    (*logits)[s].resize(static_cast<size_t>(rows) * vocab);
    k::MatMulBf16(normed.data(), rows, hidden, w_->lm_head.data.data(), vocab, (*logits)[s].data());
    first += n;
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine
