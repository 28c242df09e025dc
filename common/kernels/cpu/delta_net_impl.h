// A Gated DeltaNet's kernels (Backend::causal_conv, Backend::gated_delta), written once in plain
// loops whose innermost runs along contiguous floats, and compiled for each instruction set:
// kernels_avx2.cc and kernels_avx512.cc include this file inside their target region and
// anonymous namespace, where the compiler vectorizes those loops for the level. Not a standalone
// header: the includer has already included <algorithm>, <cmath>, <cstring>, <vector> and
// common/kernels/backend.h (this file is read inside its namespace).
//
// gated_delta in chunks (Hugging Face's torch_chunk_gated_delta_rule, fla's
// chunk_gated_delta_rule): with G_i the decay's log summed over the chunk's tokens up to i, and L
// the strictly lower (c, c) matrix L_ij = beta_i (k_i . k_j) exp(G_i - G_j),
//   U = (I + L)^-1 diag(beta) V,  W = (I + L)^-1 diag(beta exp(G)) K     (forward substitution)
//   V' = U - W S                                   (what each token writes, after the chunk's
//                                                   earlier tokens)
//   o_i = exp(G_i) q_i S + sum_{j <= i} (q_i . k_j) exp(G_i - G_j) V'_j
//   S <- exp(G_last) S + sum_j exp(G_last - G_j) k_j V'_j^T
// Every exponent is <= 0, so nothing overflows however fast the state decays. The includer
// names its vector interface DeltaSimd (as attention_impl.h's S: Vec, kLanes, Zero, Load,
// Store, Set1, Fma).
#pragma once

// The scratch of one thread's chunk (DeltaChunk names each) and of the convolution (its window
// and transposed weights).
struct DeltaScratch {
  std::vector<float> keys_t, lower, scores, inverse, vb, kb, qg, u, w, window, weight_t;
};

inline DeltaScratch& ThreadDeltaScratch() {
  thread_local DeltaScratch scratch;
  return scratch;
}

inline float DeltaSilu(float x) { return x / (1.0f + std::exp(-x)); }

// Backend::causal_conv. The window holds the tail then x's rows (row-major, so the sums run
// along channels); the weights are transposed to (kernel, channels) for the same reason.
void CausalConv(float* x, int m, int channels, int stride, const float* weight, int kernel,
                float* tail) {
  if (m <= 0) return;
  const int keep = kernel - 1;
  DeltaScratch& s = ThreadDeltaScratch();
  s.window.resize(static_cast<size_t>(keep + m) * channels);
  s.weight_t.resize(static_cast<size_t>(kernel) * channels);
  float* window = s.window.data();
  for (int ch = 0; ch < channels; ++ch) {
    for (int j = 0; j < kernel; ++j)
      s.weight_t[static_cast<size_t>(j) * channels + ch] =
          weight[static_cast<size_t>(ch) * kernel + j];
    for (int j = 0; j < keep; ++j)
      window[static_cast<size_t>(j) * channels + ch] = tail[static_cast<size_t>(ch) * keep + j];
  }
  for (int t = 0; t < m; ++t) {
    std::memcpy(window + static_cast<size_t>(keep + t) * channels,
                x + static_cast<size_t>(t) * stride, channels * sizeof(float));
  }
  for (int t = 0; t < m; ++t) {
    float* __restrict row = x + static_cast<size_t>(t) * stride;
    std::fill(row, row + channels, 0.0f);
    for (int j = 0; j < kernel; ++j) {
      const float* __restrict in = window + static_cast<size_t>(t + j) * channels;
      const float* __restrict w = s.weight_t.data() + static_cast<size_t>(j) * channels;
      for (int ch = 0; ch < channels; ++ch) row[ch] += w[ch] * in[ch];
    }
    for (int ch = 0; ch < channels; ++ch) row[ch] = DeltaSilu(row[ch]);
  }
  for (int ch = 0; ch < channels; ++ch) {
    for (int j = 0; j < keep; ++j)
      tail[static_cast<size_t>(ch) * keep + j] = window[static_cast<size_t>(m + j) * channels + ch];
  }
}

// One token: a pass over S that decays it and reads S^T k, and one that adds k delta^T and
// reads S^T q.
inline void DeltaToken(const GatedDeltaHead& h, int t, float* __restrict kv) {
  const float* q = h.q + static_cast<size_t>(t) * h.qk_stride;
  const float* k = h.k + static_cast<size_t>(t) * h.qk_stride;
  const float* v = h.v + static_cast<size_t>(t) * h.v_stride;
  float* __restrict o = h.out + static_cast<size_t>(t) * h.out_stride;
  const float decay = std::exp(h.g[static_cast<size_t>(t) * h.gb_stride]);
  const float beta = h.beta[static_cast<size_t>(t) * h.gb_stride];
  const int dv = h.dv;
  std::fill(kv, kv + dv, 0.0f);
  for (int i = 0; i < h.dk; ++i) {
    float* __restrict s = h.state + static_cast<size_t>(i) * dv;
    const float ki = k[i];
    for (int j = 0; j < dv; ++j) {
      s[j] *= decay;
      kv[j] += s[j] * ki;
    }
  }
  for (int j = 0; j < dv; ++j) kv[j] = (v[j] - kv[j]) * beta;
  std::fill(o, o + dv, 0.0f);
  for (int i = 0; i < h.dk; ++i) {
    float* __restrict s = h.state + static_cast<size_t>(i) * dv;
    const float ki = k[i], qi = q[i];
    for (int j = 0; j < dv; ++j) {
      s[j] += ki * kv[j];
      o[j] += s[j] * qi;
    }
  }
}

// C (m, n; row stride ldc) += A (m, k; lda) @ B (k, n; ldb), in register tiles of kTileRows
// rows by two vectors: each step of the k loop loads two vectors of B's row and broadcasts one
// element of A per tile row, so the sums stay in registers.
constexpr int kTileRows = 6;
constexpr int kDeltaTileCols = 2 * DeltaSimd::kLanes;

template <int kRows>
inline void GemmTile(int k, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
  using S = DeltaSimd;
  typename S::Vec low[kRows], high[kRows];
  for (int r = 0; r < kRows; ++r) low[r] = high[r] = S::Zero();
  for (int d = 0; d < k; ++d) {
    const float* b = B + static_cast<size_t>(d) * ldb;
    const typename S::Vec b0 = S::Load(b), b1 = S::Load(b + S::kLanes);
    for (int r = 0; r < kRows; ++r) {
      const typename S::Vec a = S::Set1(A[static_cast<size_t>(r) * lda + d]);
      low[r] = S::Fma(a, b0, low[r]);
      high[r] = S::Fma(a, b1, high[r]);
    }
  }
  const typename S::Vec one = S::Set1(1.0f);
  for (int r = 0; r < kRows; ++r) {
    float* c = C + static_cast<size_t>(r) * ldc;
    S::Store(c, S::Fma(low[r], one, S::Load(c)));
    S::Store(c + S::kLanes, S::Fma(high[r], one, S::Load(c + S::kLanes)));
  }
}

inline void Gemm(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C,
                 int ldc) {
  int e0 = 0;
  for (; e0 + kDeltaTileCols <= n; e0 += kDeltaTileCols) {
    int r0 = 0;
    for (; r0 + kTileRows <= m; r0 += kTileRows) {
      GemmTile<kTileRows>(k, A + static_cast<size_t>(r0) * lda, lda, B + e0, ldb,
                          C + static_cast<size_t>(r0) * ldc + e0, ldc);
    }
    for (; r0 < m; ++r0) {
      GemmTile<1>(k, A + static_cast<size_t>(r0) * lda, lda, B + e0, ldb,
                  C + static_cast<size_t>(r0) * ldc + e0, ldc);
    }
  }
  if (e0 == n) return;
  for (int r = 0; r < m; ++r) {  // the last columns, fewer than a tile's
    float* __restrict c = C + static_cast<size_t>(r) * ldc + e0;
    for (int d = 0; d < k; ++d) {
      const float a = A[static_cast<size_t>(r) * lda + d];
      const float* __restrict b = B + static_cast<size_t>(d) * ldb + e0;
      for (int e = 0; e < n - e0; ++e) c[e] += a * b[e];
    }
  }
}

// Tokens [t0, t0 + c) as one chunk, c <= kGatedDeltaChunk: the products above, and (I + L)^-1
// by forward substitution (c^3 / 6 multiply-adds, small beside the products).
inline void DeltaChunk(const GatedDeltaHead& h, int t0, int c, DeltaScratch& x) {
  const int dk = h.dk, dv = h.dv;
  constexpr int kC = kGatedDeltaChunk;
  float cum[kC] = {}, beta[kC] = {};
  float sum = 0;
  for (int i = 0; i < c; ++i) {
    sum += h.g[static_cast<size_t>(t0 + i) * h.gb_stride];
    cum[i] = sum;
    beta[i] = h.beta[static_cast<size_t>(t0 + i) * h.gb_stride];
  }
  const float* q = h.q + static_cast<size_t>(t0) * h.qk_stride;
  const float* k = h.k + static_cast<size_t>(t0) * h.qk_stride;
  const float* v = h.v + static_cast<size_t>(t0) * h.v_stride;
  float* out = h.out + static_cast<size_t>(t0) * h.out_stride;
  float* keys_t = x.keys_t.data();    // (dk, c)
  float* lower = x.lower.data();      // (c, c), then L
  float* scores = x.scores.data();    // (c, c)
  float* inverse = x.inverse.data();  // (c, c): (I + L)^-1
  float* vb = x.vb.data();            // (c, dv): beta V
  float* kb = x.kb.data();            // (c, dk): -beta exp(G) K, then -W
  float* qg = x.qg.data();            // (c, dk): exp(G) Q
  float* u = x.u.data();              // (c, dv): U, then V'
  float* w = x.w.data();              // (c, dk): -W
  for (int i = 0; i < c; ++i) {
    const float* ki = k + static_cast<size_t>(i) * h.qk_stride;
    const float* qi = q + static_cast<size_t>(i) * h.qk_stride;
    const float* vi = v + static_cast<size_t>(i) * h.v_stride;
    const float decay = std::exp(cum[i]);
    for (int d = 0; d < dk; ++d) {
      keys_t[static_cast<size_t>(d) * c + i] = ki[d];
      kb[static_cast<size_t>(i) * dk + d] = -beta[i] * decay * ki[d];
      qg[static_cast<size_t>(i) * dk + d] = decay * qi[d];
    }
    for (int e = 0; e < dv; ++e) vb[static_cast<size_t>(i) * dv + e] = beta[i] * vi[e];
  }
  std::fill(lower, lower + c * c, 0.0f);
  std::fill(scores, scores + c * c, 0.0f);
  Gemm(c, c, dk, k, h.qk_stride, keys_t, c, lower, c);
  Gemm(c, c, dk, q, h.qk_stride, keys_t, c, scores, c);
  for (int i = 0; i < c; ++i) {
    for (int j = 0; j < c; ++j) {
      const float decay = j <= i ? std::exp(cum[i] - cum[j]) : 0.0f;
      lower[i * c + j] = j < i ? lower[i * c + j] * beta[i] * decay : 0.0f;
      scores[i * c + j] *= decay;
    }
  }
  // Row i of (I + L)^-1: e_i - sum_{p < i} L_ip row p.
  std::fill(inverse, inverse + c * c, 0.0f);
  for (int i = 0; i < c; ++i) {
    float* __restrict row = inverse + i * c;
    for (int p = 0; p < i; ++p) {
      const float l = lower[i * c + p];
      const float* __restrict above = inverse + p * c;
      for (int j = 0; j <= p; ++j) row[j] -= l * above[j];
    }
    row[i] = 1.0f;
  }
  std::fill(u, u + c * dv, 0.0f);
  std::fill(w, w + c * dk, 0.0f);
  Gemm(c, dv, c, inverse, c, vb, dv, u, dv);   // U
  Gemm(c, dk, c, inverse, c, kb, dk, w, dk);   // -W
  Gemm(c, dv, dk, w, dk, h.state, dv, u, dv);  // V' = U - W S
  for (int i = 0; i < c; ++i) {
    std::fill(out + static_cast<size_t>(i) * h.out_stride,
              out + static_cast<size_t>(i) * h.out_stride + dv, 0.0f);
  }
  Gemm(c, dv, dk, qg, dk, h.state, dv, out, h.out_stride);  // from the state before the chunk
  Gemm(c, dv, c, scores, c, u, dv, out, h.out_stride);      // from the chunk's own tokens
  // S <- exp(G_last) S + (K exp(G_last - G))^T V'.
  float tail[kC] = {};
  for (int j = 0; j < c; ++j) tail[j] = std::exp(cum[c - 1] - cum[j]);
  for (int d = 0; d < dk; ++d) {
    for (int j = 0; j < c; ++j) keys_t[static_cast<size_t>(d) * c + j] *= tail[j];
  }
  const float decay = std::exp(cum[c - 1]);
  for (int i = 0; i < dk * dv; ++i) h.state[i] *= decay;
  Gemm(dk, dv, c, keys_t, c, u, dv, h.state, dv);
}

// Backend::gated_delta: one token by the recurrence, more in chunks.
void GatedDelta(const GatedDeltaHead& h) {
  if (h.m <= 0) return;
  DeltaScratch& x = ThreadDeltaScratch();
  if (h.m == 1) {
    x.u.resize(h.dv);
    DeltaToken(h, 0, x.u.data());
    return;
  }
  constexpr size_t kC = kGatedDeltaChunk;
  for (auto* buffer : {&x.lower, &x.scores, &x.inverse}) buffer->resize(kC * kC);
  for (auto* buffer : {&x.keys_t, &x.kb, &x.qg, &x.w}) buffer->resize(kC * h.dk);
  for (auto* buffer : {&x.vb, &x.u}) buffer->resize(kC * h.dv);
  for (int t0 = 0; t0 < h.m; t0 += kGatedDeltaChunk) {
    DeltaChunk(h, t0, std::min(kGatedDeltaChunk, h.m - t0), x);
  }
}
