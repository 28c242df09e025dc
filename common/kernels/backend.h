// The operations a forward step is made of, as one target implements them: a table of plain
// functions chosen at run time, as ggml's backends are. The CPU backend has one table per
// instruction-set level (common/kernels/cpu/kernels.h: Backends(), ActiveBackend()); a CUDA
// backend would be another table over the same packed weights (common/kernels/packed_matrix.h).
// The engine's forward pass (common/engine/forward.h) calls nothing else.
//
// Shapes, for every table (row-major, activations float32):
//   linear            Y (b, w.rows) = X (b, w.cols) @ W^T, W packed in any format
//   linear_f32        the same with X kept float32 (routers: their outputs pick experts)
//   linear_group      n products (LinearProduct) as linear runs each, in one pass over the
//                     threads: consecutive products that read the same X (pointer, rows and
//                     columns) round or quantize it once, and a thread moves on from one product's
//                     panels to the next without waiting for the others (an expert's gate and up,
//                     every routed expert of a layer); each result equals linear's bit for bit
//   rms_norm          out (b, n) = x (b, n) / rms(x row) * weight (n,)
//   rope              x (rows, heads, head_dim) rotated in place, row r at positions[r]: the
//                     first rotary_dim of each head, pair i by positions[r] * inv_freq[i]
//                     (RopeSpec: rotate_half's pairs or interleaved ones); the rest of each head
//                     passes through
//   softmax           x (n,) <- softmax(x)
//   log_sum_exp       log(sum(exp(x (n,))))
//   top_k             out (k,) = indices of the k largest of x (n,), largest first
//   silu_mul          out (n,) = silu(gate) * up
//   axpy              y (n,) += alpha * x (n,)
//   paged_attention   out (heads, head_dim) for the query heads of KV heads [begin, end), over
//                     positions [context_begin, context_end) of a paged KV cache in any
//                     KvDtype, and optionally their log-sum-exp, so that parts of a long
//                     context can run apart and merge (common/kernels/cpu/kernels.h,
//                     PagedAttentionRange)
//   causal_attention  out (m, heads, head_dim) for m consecutive query tokens of one sequence at
//                     positions first_position .. first_position + m - 1, every KV head: query i
//                     attends to positions [context_begin, min(context_end, first_position + i
//                     + 1)), and with a sliding window (window > 0) to its last `window`
//                     positions only (CausalQueryBegin), and its log-sum-exps go to lse (m,
//                     heads) when not null (-inf for an empty range, with out 0). A prompt's
//                     queries run in blocks so that each key and value is read once per block
//                     rather than once per query.
//   causal_conv       x (m rows at `stride`, channels) <- silu(depthwise causal convolution), in
//                     place: weight (channels, kernel), each channel's `kernel - 1` inputs
//                     before x's first row in tail (channels, kernel - 1), oldest first, which
//                     then holds the last ones (a Gated DeltaNet's convolution, decode and
//                     prefill alike)
//   gated_delta       the gated delta rule of one value head over m consecutive tokens of one
//                     sequence, its float32 state S (dk, dv) updated in place
//                     (GatedDeltaHead): per token, S <- exp(g) S; S <- S + k (beta (v - S^T
//                     k))^T; o = S^T q. One token is one pass over S to decay and read it and
//                     one to write it; more run in chunks of kGatedDeltaChunk tokens in the
//                     WY / UT form (matrix products and a triangular solve per chunk), so a
//                     prompt is not a token loop.
// The step's own arithmetic between those, each op over all of a step's rows at once (so that a
// backend whose memory is not the host's can own a whole step, as ggml-backend's buffers do):
//   embed             out (n, cols) = the bf16 rows ids[0..n) of table (vocab, cols), as float32
//   gather_rows       out row i (cols, at out_stride) = x row rows[i] (at x_stride), or row i
//                     when rows is null: a split of columns, or the rows routed to one expert
//   add_rows          y row to[r] (row r when to is null) += scales[r] (1 when null) * x row r,
//                     rows (rows, n): residual adds and the experts' weighted outputs
//   add_bias          x (rows, n) += bias (n,) on every row
//   clamped_swiglu    out (n,) = (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g =
//                     min(gate, limit): gpt-oss's expert activation
//   attention_sinks   out (rows, heads, head_dim) *= 1 / (1 + exp(sinks[h] - lse (rows, heads))):
//                     each head's softmax given one more logit, its sink, whose share is dropped
//   gelu_tanh_mul     out (n,) = gelu(gate) * up, gelu's tanh form: 0.5 g (1 + tanh(sqrt(2 / pi)
//                     (g + 0.044715 g^3))) (Gemma's GeGLU)
//   soft_cap          x (n,) <- cap * tanh(x / cap) (Gemma's final logits)
//   scale             x (n,) *= alpha
//   sigmoid           x (n,) <- 1 / (1 + exp(-x))
//   mul               y (n,) *= x (n,)
//   l2_norm           each of the `heads` (n,) vectors of each of `rows` rows (at `stride`) of x
//                     <- x * scale / sqrt(sum(x^2) + 1e-6) (a DeltaNet's q and k)
//   delta_gates       a DeltaNet's gates, a and b (rows, heads) in place: b <- sigmoid(b),
//                     a <- -exp(a_log[h]) * softplus(a + dt_bias[h]) (the log of the decay)
//   route             a router's logits (rows, n) <- its scores (RouteSpec: softmax or sigmoid of
//                     logits + mask, the mask -inf for experts a plan drops); experts (rows, k)
//                     the k best of each row by score + selection bias, within the best groups
//                     where experts are grouped (Backend::top_k's order), and weights (rows, k)
//                     their scores, divided by their sum when `renormalize`, times `scaling`
//   merge_attention   out (n,) = attention over the union of `parts` disjoint ranges of a
//                     context, from each part's out (n,) and log-sum-exp (paged_attention's
//                     with lse)
//   kv_store          k and v (rows, num_kv_heads * head_dim) written at positions[r] of the
//                     sequence whose blocks `kv` maps, in its dtype; k alone where the cache
//                     keeps keys only (kv.v == kv.k: latent attention, whose values are its
//                     keys' first values)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/kernels/kv_format.h"
#include "common/kernels/packed_matrix.h"

namespace tandem::kernels {

// What `linear` rounds activations to before multiplying: nothing (float32), bf16 for bf16
// weights, int8 per group (QuantizeActivations) for int8 and int4 weights.
enum class ActivationRounding : uint8_t { kNone, kInt8, kBf16AndInt8 };

// The tokens a DeltaNet chunk holds; a prompt's tokens run in chunks of this many.
constexpr int kGatedDeltaChunk = 64;

// One value head of one sequence over m tokens, for Backend::gated_delta. Token t's rows:
// q + t * qk_stride and k + t * qk_stride (dk, L2-normed; q also scaled by 1/sqrt(dk)),
// v + t * v_stride (dv), g[t * gb_stride] (the log of the decay, <= 0) and beta[t * gb_stride];
// its output goes to out + t * out_stride (dv). state (dk, dv) holds S before the first token
// and after the last.
struct GatedDeltaHead {
  const float* q;
  const float* k;
  int qk_stride;
  const float* v;
  int v_stride;
  const float* g;
  const float* beta;
  int gb_stride;
  int m, dk, dv;
  float* state;
  float* out;
  int out_stride;
};

// How Backend::rope turns a head: the first rotary_dim values in rotary_dim / 2 pairs, pair i by
// position * inv_freq[i] (float32 angles, as Hugging Face computes them). The pairs are (i, i +
// rotary_dim / 2) (rotate_half, Llama's convention) or, interleaved, (2i, 2i + 1) (DeepSeek's
// complex form); both give a query and a key rotated alike the same dot product.
struct RopeSpec {
  const float* inv_freq = nullptr;  // (rotary_dim / 2,)
  int rotary_dim = 0;
  bool interleaved = false;
};

// RoPE's default frequencies: theta^(-2i/rotary_dim) for i < rotary_dim / 2, in float32.
inline std::vector<float> DefaultRopeFrequencies(float theta, int rotary_dim) {
  std::vector<float> inv_freq(static_cast<size_t>(rotary_dim / 2));
  for (int i = 0; i < rotary_dim / 2; ++i) {
    inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / rotary_dim);
  }
  return inv_freq;
}

// A router's options for Backend::route (Hugging Face's Mixtral / Qwen routers: softmax, top-k,
// renormalised or not; DeepSeek-V2's group-limited greedy; DeepSeek-V3's sigmoid scores chosen
// by score + e_score_correction_bias within the best groups, scaled).
struct RouteSpec {
  int k = 0;
  bool renormalize = false;
  const float* mask = nullptr;  // (n,): 0, or -inf for an expert never chosen; null: none
  bool sigmoid = false;         // scores: sigmoid(logits) rather than softmax(logits)
  // (n,) added to the scores for choosing experts only; null: none.
  const float* selection_bias = nullptr;
  // Experts in `groups` equal groups, each scored by its best choice value (or, with
  // group_top_two, the sum of its best two); experts of all but the best top_groups groups
  // choose at 0, as Hugging Face masks them.
  int groups = 1;
  int top_groups = 1;
  bool group_top_two = false;
  float scaling = 1.0f;  // the weights' factor (routed_scaling_factor)
};

// One product of Backend::linear_group: y (b, w.rows) = x (b, w.cols) @ W^T.
struct LinearProduct {
  const float* x;
  int b;
  PackedMatrix w;
  float* y;
};

struct Backend {
  const char* name;
  ActivationRounding rounding;
  void (*linear)(const float* x, int b, const PackedMatrix& w, float* y);
  void (*linear_group)(const LinearProduct* products, int n);
  void (*linear_f32)(const float* x, int b, const PackedMatrix& w, float* y);
  void (*rms_norm)(const float* x, int b, int n, const float* weight, float eps, float* out);
  void (*rope)(float* x, int rows, int heads, int head_dim, const RopeSpec& rope,
               const int32_t* positions);
  void (*softmax)(float* x, int n);
  double (*log_sum_exp)(const float* x, int n);
  void (*top_k)(const float* x, int n, int k, int32_t* out);
  void (*silu_mul)(const float* gate, const float* up, int n, float* out);
  void (*axpy)(float alpha, const float* x, int n, float* y);
  void (*paged_attention)(const float* q, int num_heads, const PagedKv& kv, int context_begin,
                          int context_end, float scale, int kv_head_begin, int kv_head_end,
                          float* out, float* lse);
  void (*causal_attention)(const float* q, int m, int num_heads, const PagedKv& kv,
                           int first_position, int context_begin, int context_end, int window,
                           float scale, float* out, float* lse);
  void (*causal_conv)(float* x, int m, int channels, int stride, const float* weight, int kernel,
                      float* tail);
  void (*gated_delta)(const GatedDeltaHead& head);
  // The step's ops (default null: a table may fill them in after its kernels).
  void (*embed)(const uint16_t* table, int cols, const int32_t* ids, int n, float* out) = nullptr;
  void (*gather_rows)(const float* x, int x_stride, const int32_t* rows, int n, int cols,
                      float* out, int out_stride) = nullptr;
  void (*add_rows)(const float* x, int rows, int n, const float* scales, const int32_t* to,
                   float* y) = nullptr;
  void (*add_bias)(const float* bias, int rows, int n, float* x) = nullptr;
  void (*clamped_swiglu)(const float* gate, const float* up, int n, float alpha, float limit,
                         float* out) = nullptr;
  void (*attention_sinks)(float* out, const float* lse, const float* sinks, int rows, int heads,
                          int head_dim) = nullptr;
  void (*gelu_tanh_mul)(const float* gate, const float* up, int n, float* out) = nullptr;
  void (*soft_cap)(float* x, int n, float cap) = nullptr;
  void (*scale)(float* x, int n, float alpha) = nullptr;
  void (*sigmoid)(float* x, int n) = nullptr;
  void (*mul)(const float* x, int n, float* y) = nullptr;
  void (*l2_norm)(float* x, int rows, int heads, int n, int stride, float scale) = nullptr;
  void (*delta_gates)(float* a, float* b, int rows, int heads, const float* a_log,
                      const float* dt_bias) = nullptr;
  void (*route)(float* logits, int rows, int n, const RouteSpec& spec, int32_t* experts,
                float* weights) = nullptr;
  void (*merge_attention)(const float* const* parts_out, const float* parts_lse, int parts, int n,
                          float* out) = nullptr;
  void (*kv_store)(const PagedKvOut& kv, int rows, const int32_t* positions, const float* k,
                   const float* v) = nullptr;
};

// Where query i of a causal_attention block stops attending: its own position + 1, within
// [context_begin, context_end] (context_begin when the range is empty).
inline int CausalQueryEnd(int first_position, int i, int context_begin, int context_end) {
  return std::max(context_begin, std::min(context_end, first_position + i + 1));
}

// Where query i of a causal_attention block starts attending: context_begin, or with a sliding
// window (window > 0) its position + 1 - window where that is later. A range whose begin is at
// or past its end is empty.
inline int CausalQueryBegin(int first_position, int i, int context_begin, int window) {
  return window > 0 ? std::max(context_begin, first_position + i + 1 - window) : context_begin;
}

// Backend::causal_attention by its definition: one `attend` (a table's paged_attention) per
// query, each over its own range. Levels without a kernel for blocks run this.
inline void CausalAttentionByQuery(decltype(Backend::paged_attention) attend, const float* q, int m,
                                   int num_heads, const PagedKv& kv, int first_position,
                                   int context_begin, int context_end, int window, float scale,
                                   float* out, float* lse) {
  const size_t q_dim = static_cast<size_t>(num_heads) * kv.head_dim;
  for (int i = 0; i < m; ++i) {
    const int end = CausalQueryEnd(first_position, i, context_begin, context_end);
    const int begin = std::min(end, CausalQueryBegin(first_position, i, context_begin, window));
    attend(q + i * q_dim, num_heads, kv, begin, end, scale, 0, kv.num_kv_heads, out + i * q_dim,
           lse != nullptr ? lse + static_cast<size_t>(i) * num_heads : nullptr);
  }
}

}  // namespace tandem::kernels
