// AVX-512 kernels (F, BW, VL, DQ), and the bf16 dot-product matrix product (AVX512_BF16).
// Compiled for those instructions with a target pragma, so the rest of the library needs no
// -mavx512 flags; kernels.cc calls into this file only after checking the CPU. Every function
// compiled under the pragma has internal linkage, so the linker cannot pick a copy built here
// for code that runs on older CPUs.

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// (and, for _mm512_reduce_max_ps, -Wuninitialized) reports once inlined (GCC bug 105593); the
// warning points into the header, so silence it there.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/kernels/cpu/kernels_internal.h"

// Clang has no target pragma; it applies the same target attribute to every function instead.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
#endif

namespace tandem::kernels::cpu::internal {
namespace {

#define TANDEM_INLINE inline __attribute__((always_inline))

// Lanes [0, count) of a 16-lane mask; count in [0, 16].
TANDEM_INLINE __mmask16 LowLanes16(int64_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}

// Widens 16 bf16 values to float32: the bf16 bits are the high half of the float32 bits.
TANDEM_INLINE __m512 WidenBf16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

TANDEM_INLINE __m512 LoadWeights(const float* w) { return _mm512_loadu_ps(w); }
TANDEM_INLINE __m512 LoadWeights(const uint16_t* w) {
  return WidenBf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
}
TANDEM_INLINE __m512 LoadWeights(const float* w, __mmask16 lanes) {
  return _mm512_maskz_loadu_ps(lanes, w);
}
TANDEM_INLINE __m512 LoadWeights(const uint16_t* w, __mmask16 lanes) {
  return WidenBf16(_mm256_maskz_loadu_epi16(lanes, w));
}

// Weights stream from memory once per call; the hardware prefetcher alone leaves short rows
// (the tiny model's n = 192, 384) well below the memory bandwidth. So each tile also prefetches
// the same lines of the row block `prefetch_ahead` elements further on, at least
// kPrefetchBytes ahead: in whole row blocks, which keeps every target inside W.
constexpr int64_t kPrefetchBytes = 4096;

// Rows ahead to prefetch for blocks of `block` rows of n weights of type T.
template <typename T>
int64_t PrefetchRows(int64_t block, int64_t n) {
  const int64_t block_bytes = block * n * static_cast<int64_t>(sizeof(T));
  return block * ((kPrefetchBytes + block_bytes - 1) / block_bytes);
}

// Y[j][r] = X row j . W row r for R weight rows and B activation rows: each weight vector is
// loaded once for all B rows, and each activation vector once for all R rows. Every output
// sums the same products in the same lanes whatever R and B are, so results do not depend on
// the tiling or on how rows are split across threads.
template <int R, int B, typename T>
TANDEM_INLINE void Tile(const float* x, int64_t n, const T* w, int64_t ldw, float* y, int64_t ldy,
                        int64_t prefetch_ahead) {
  __m512 acc[R][B];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < B; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    __m512 xv[B];
#pragma GCC unroll 16
    for (int j = 0; j < B; ++j) xv[j] = _mm512_loadu_ps(x + j * n + k);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w + r * ldw + k + prefetch_ahead), _MM_HINT_T0);
      const __m512 wv = LoadWeights(w + r * ldw + k);
#pragma GCC unroll 16
      for (int j = 0; j < B; ++j) acc[r][j] = _mm512_fmadd_ps(wv, xv[j], acc[r][j]);
    }
  }
  if (k < n) {
    const __mmask16 lanes = LowLanes16(n - k);
    __m512 xv[B];
#pragma GCC unroll 16
    for (int j = 0; j < B; ++j) xv[j] = _mm512_maskz_loadu_ps(lanes, x + j * n + k);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 wv = LoadWeights(w + r * ldw + k, lanes);
#pragma GCC unroll 16
      for (int j = 0; j < B; ++j) acc[r][j] = _mm512_fmadd_ps(wv, xv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < B; ++j) y[j * ldy + r] = _mm512_reduce_add_ps(acc[r][j]);
  }
}

// R weight rows against activation rows [0, b), b <= kBatchBlock, in tiles of 4.
template <int R, typename T>
TANDEM_INLINE void RowBlock(const float* x, int b, int64_t n, const T* w, int64_t ldw, float* y,
                            int64_t ldy, int64_t prefetch_ahead) {
  int j = 0;
  for (; j + 4 <= b; j += 4) {
    Tile<R, 4>(x + j * n, n, w, ldw, y + j * ldy, ldy, prefetch_ahead);
    prefetch_ahead = 0;  // Later batch tiles find the weights in cache.
  }
  switch (b - j) {
    case 3:
      Tile<R, 3>(x + j * n, n, w, ldw, y + j * ldy, ldy, prefetch_ahead);
      break;
    case 2:
      Tile<R, 2>(x + j * n, n, w, ldw, y + j * ldy, ldy, prefetch_ahead);
      break;
    case 1:
      Tile<R, 1>(x + j * n, n, w, ldw, y + j * ldy, ldy, prefetch_ahead);
      break;
  }
}

// Activation rows per pass over the weights: up to 16 the weights stream from memory once,
// with each 4-row block reused from L1 by all activation rows.
constexpr int kBatchBlock = 16;
// Output features per row block in the single-row (decode) case, and for thread splits.
constexpr int kRowAlign = 8;

// Y (b,d) columns [row_begin, row_end) = X (b,n) @ W^T rows [row_begin, row_end).
template <typename T>
void MatMulSlice(const float* x, int b, int64_t n, const T* w, int64_t ldw, int64_t d,
                 int row_begin, int row_end, float* y) {
  for (int j0 = 0; j0 < b; j0 += kBatchBlock) {
    const int bb = std::min(kBatchBlock, b - j0);
    const float* xb = x + j0 * n;
    float* yb = y + j0 * d;
    int r = row_begin;
    if (bb == 1) {
      // 8 independent accumulators keep enough loads in flight to stream the weights.
      const int64_t ahead = PrefetchRows<T>(8, n);
      for (; r + 8 <= row_end; r += 8) {
        Tile<8, 1>(xb, n, w + r * ldw, ldw, yb + r, d, r + ahead + 8 <= d ? ahead * ldw : 0);
      }
    } else {
      const int64_t ahead = PrefetchRows<T>(4, n);
      for (; r + 4 <= row_end; r += 4) {
        RowBlock<4>(xb, bb, n, w + r * ldw, ldw, yb + r, d, r + ahead + 4 <= d ? ahead * ldw : 0);
      }
    }
    for (; r < row_end; ++r) RowBlock<1>(xb, bb, n, w + r * ldw, ldw, yb + r, d, 0);
  }
}

void MatMulBf16(const float* x, int b, int n, const uint16_t* w, int ldw, int d, float* y) {
  ParallelRows(b, n, d, kRowAlign,
               [&](int begin, int end) { MatMulSlice(x, b, n, w, ldw, d, begin, end, y); });
}

void MatMulF32(const float* x, int b, int n, const float* w, int d, float* y) {
  ParallelRows(b, n, d, kRowAlign,
               [&](int begin, int end) { MatMulSlice(x, b, n, w, n, d, begin, end, y); });
}

// The bf16 dot-product path: activations rounded to bf16, pairs of products summed by
// vdpbf16ps into float32 lanes. Only this part may use AVX512_BF16 instructions.
// Clang's attribute regions do not combine: this one replaces the outer region's.
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(                                                     \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
#endif

template <int R, int B>
TANDEM_INLINE void TileDp(const uint16_t* x, int64_t n, const uint16_t* w, int64_t ldw, float* y,
                          int64_t ldy, int64_t prefetch_ahead) {
  __m512 acc[R][B];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < B; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < n; k += 32) {
    const __mmask32 lanes =
        n - k >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << (n - k)) - 1u);
    __m512bh xv[B];
#pragma GCC unroll 16
    for (int j = 0; j < B; ++j) xv[j] = (__m512bh)_mm512_maskz_loadu_epi16(lanes, x + j * n + k);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w + r * ldw + k + prefetch_ahead), _MM_HINT_T0);
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(lanes, w + r * ldw + k);
#pragma GCC unroll 16
      for (int j = 0; j < B; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv, xv[j]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < B; ++j) y[j * ldy + r] = _mm512_reduce_add_ps(acc[r][j]);
  }
}

template <int R>
TANDEM_INLINE void RowBlockDp(const uint16_t* x, int b, int64_t n, const uint16_t* w, int64_t ldw,
                              float* y, int64_t ldy, int64_t prefetch_ahead) {
  int j = 0;
  for (; j + 4 <= b; j += 4) {
    TileDp<R, 4>(x + j * n, n, w, ldw, y + j * ldy, ldy, prefetch_ahead);
    prefetch_ahead = 0;
  }
  switch (b - j) {
    case 3:
      TileDp<R, 3>(x + j * n, n, w, ldw, y + j * ldy, ldy, prefetch_ahead);
      break;
    case 2:
      TileDp<R, 2>(x + j * n, n, w, ldw, y + j * ldy, ldy, prefetch_ahead);
      break;
    case 1:
      TileDp<R, 1>(x + j * n, n, w, ldw, y + j * ldy, ldy, prefetch_ahead);
      break;
  }
}

void MatMulBf16Dp(const float* x, int b, int n, const uint16_t* w, int ldw, int d, float* y) {
  std::vector<uint16_t> x_bf16(static_cast<size_t>(b) * n);
  for (size_t i = 0; i < x_bf16.size(); ++i) x_bf16[i] = F32ToBf16Bits(x[i]);
  const int64_t n64 = n;
  ParallelRows(b, n, d, kRowAlign, [&](int begin, int end) {
    for (int j0 = 0; j0 < b; j0 += kBatchBlock) {
      const int bb = std::min(kBatchBlock, b - j0);
      const uint16_t* xb = x_bf16.data() + j0 * n64;
      float* yb = y + j0 * int64_t{d};
      int r = begin;
      if (bb == 1) {
        const int64_t ahead = PrefetchRows<uint16_t>(8, n64);
        for (; r + 8 <= end; r += 8) {
          TileDp<8, 1>(xb, n64, w + r * ldw, ldw, yb + r, d, r + ahead + 8 <= d ? ahead * ldw : 0);
        }
      } else {
        const int64_t ahead = PrefetchRows<uint16_t>(4, n64);
        for (; r + 4 <= end; r += 4) {
          RowBlockDp<4>(xb, bb, n64, w + r * ldw, ldw, yb + r, d,
                        r + ahead + 4 <= d ? ahead * ldw : 0);
        }
      }
      for (; r < end; ++r) RowBlockDp<1>(xb, bb, n64, w + r * ldw, ldw, yb + r, d, 0);
    }
  });
}

#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))), \
                             apply_to = function)
#else
#pragma GCC pop_options  // avx512bf16
#endif

// exp(x) for 16 lanes, Cephes' expf: x = k ln2 + f with |f| <= ln2/2, exp(f) by a degree-7
// polynomial (relative error about 2e-7), times 2^k. Below ln(FLT_MIN) the result is 0 rather
// than a subnormal; above ~88.38 it saturates at ~2.4e38; NaN stays NaN.
TANDEM_INLINE __m512 Exp(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f);
  const __m512 hi = _mm512_set1_ps(88.37626f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(x, x), x);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  const __m512i exponent =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(~underflow, _mm512_mul_ps(p, _mm512_castsi512_ps(exponent)));
}

// Adds the 16 lanes of v, widened to double, into two 8-lane double accumulators.
TANDEM_INLINE void AddToDouble(__m512 v, __m512d& lo, __m512d& hi) {
  lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
}

float Dot(const float* a, const float* b, int n) {
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 lanes = LowLanes16(std::min(16, n - i));
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes, a + i), _mm512_maskz_loadu_ps(lanes, b + i),
                           acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

void Axpy(float alpha, const float* x, int n, float* y) {
  const __m512 a = _mm512_set1_ps(alpha);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = LowLanes16(std::min(16, n - i));
    const __m512 yv = _mm512_maskz_loadu_ps(lanes, y + i);
    _mm512_mask_storeu_ps(y + i, lanes,
                          _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(lanes, x + i), yv));
  }
}

double LogSumExp(const float* x, int n) {
  __m512 max_v = _mm512_set1_ps(-INFINITY);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = LowLanes16(std::min(16, n - i));
    max_v = _mm512_max_ps(max_v, _mm512_mask_loadu_ps(max_v, lanes, x + i));
  }
  const float max_scalar = _mm512_reduce_max_ps(max_v);
  if (!std::isfinite(max_scalar)) return max_scalar;  // all -inf (or a +inf)
  const __m512 max_value = _mm512_set1_ps(max_scalar);
  __m512d sum_lo = _mm512_setzero_pd();
  __m512d sum_hi = _mm512_setzero_pd();
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = LowLanes16(std::min(16, n - i));
    AddToDouble(_mm512_maskz_mov_ps(
                    lanes, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + i), max_value))),
                sum_lo, sum_hi);
  }
  return max_scalar + std::log(_mm512_reduce_add_pd(_mm512_add_pd(sum_lo, sum_hi)));
}

// Sixteen values at a time against the k-th so far; the few that beat it go through the
// scalar bookkeeping (the threshold only rises, so most blocks have none).
void TopK(const float* x, int n, int k, int32_t* out) {
  StartTopK(x, k, out);
  float floor = x[out[k - 1]];
  __m512 floor_v = _mm512_set1_ps(floor);
  for (int i = k; i < n; i += 16) {
    const __mmask16 lanes = LowLanes16(std::min(16, n - i));
    const uint32_t above =
        _mm512_mask_cmp_ps_mask(lanes, _mm512_maskz_loadu_ps(lanes, x + i), floor_v, _CMP_GT_OQ);
    if (above == 0) continue;
    floor = InsertAbove(x, out, k, i, above, floor);
    floor_v = _mm512_set1_ps(floor);
  }
}

void Softmax(float* x, int n) {
  if (n <= 0) return;
  __m512 max_v = _mm512_set1_ps(-INFINITY);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = LowLanes16(std::min(16, n - i));
    max_v = _mm512_max_ps(max_v, _mm512_mask_loadu_ps(max_v, lanes, x + i));
  }
  const __m512 max_value = _mm512_set1_ps(_mm512_reduce_max_ps(max_v));
  __m512d sum_lo = _mm512_setzero_pd();
  __m512d sum_hi = _mm512_setzero_pd();
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = LowLanes16(std::min(16, n - i));
    const __m512 e = _mm512_maskz_mov_ps(
        lanes, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + i), max_value)));
    _mm512_mask_storeu_ps(x + i, lanes, e);
    AddToDouble(e, sum_lo, sum_hi);
  }
  const __m512 inv_sum =
      _mm512_set1_ps(static_cast<float>(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(sum_lo, sum_hi))));
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = LowLanes16(std::min(16, n - i));
    _mm512_mask_storeu_ps(x + i, lanes,
                          _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, x + i), inv_sum));
  }
}

void SiluMul(const float* gate, const float* up, int n, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = LowLanes16(std::min(16, n - i));
    const __m512 g = _mm512_maskz_loadu_ps(lanes, gate + i);
    const __m512 silu =
        _mm512_div_ps(g, _mm512_add_ps(one, Exp(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_mask_storeu_ps(out + i, lanes,
                          _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(lanes, up + i)));
  }
}

void RmsNorm(const float* x, int b, int n, const float* weight, float eps, float* out) {
  for (int64_t row = 0; row < b; ++row) {
    const float* xr = x + row * n;
    float* outr = out + row * n;
    __m512d sum_lo = _mm512_setzero_pd();
    __m512d sum_hi = _mm512_setzero_pd();
    for (int i = 0; i < n; i += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(LowLanes16(std::min(16, n - i)), xr + i);
      AddToDouble(_mm512_mul_ps(v, v), sum_lo, sum_hi);
    }
    const double sum_squares = _mm512_reduce_add_pd(_mm512_add_pd(sum_lo, sum_hi));
    const __m512 inv_rms =
        _mm512_set1_ps(static_cast<float>(1.0 / std::sqrt(sum_squares / n + eps)));
    for (int i = 0; i < n; i += 16) {
      const __mmask16 lanes = LowLanes16(std::min(16, n - i));
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, xr + i), inv_rms);
      _mm512_mask_storeu_ps(outr + i, lanes,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, weight + i), v));
    }
  }
}

void PagedAttention(const float* q, int num_heads, int num_kv_heads, int head_dim,
                    const float* k_pool, const float* v_pool, const int32_t* block_table,
                    int block_size, int context_len, float scale, int kv_head_begin,
                    int kv_head_end, float* out) {
  const int group = num_heads / num_kv_heads;
  std::fill(out + int64_t{kv_head_begin} * group * head_dim,
            out + int64_t{kv_head_end} * group * head_dim, 0.0f);
  if (context_len <= 0) return;
  auto offset = [&](int t, int kv_head) {
    const int64_t block = block_table[t / block_size];
    return ((block * block_size + t % block_size) * num_kv_heads + kv_head) * head_dim;
  };
  // Scores of the `group` query heads sharing one KV head, so each K and V row is read once.
  std::vector<float> scores(static_cast<size_t>(group) * context_len);
  for (int kv_head = kv_head_begin; kv_head < kv_head_end; ++kv_head) {
    const int first_head = kv_head * group;
    for (int t = 0; t < context_len; ++t) {
      const float* k = k_pool + offset(t, kv_head);
      for (int g = 0; g < group; ++g) {
        scores[g * context_len + t] = Dot(q + (first_head + g) * head_dim, k, head_dim) * scale;
      }
    }
    for (int g = 0; g < group; ++g) Softmax(scores.data() + g * context_len, context_len);
    for (int t = 0; t < context_len; ++t) {
      const float* v = v_pool + offset(t, kv_head);
      for (int g = 0; g < group; ++g) {
        Axpy(scores[g * context_len + t], v, head_dim, out + (first_head + g) * head_dim);
      }
    }
  }
}

#undef TANDEM_INLINE

}  // namespace

const IsaKernels kAvx512Kernels = {
    .name = "avx512",
    .matmul_bf16 = MatMulBf16,
    .matmul_f32 = MatMulF32,
    .rms_norm = RmsNorm,
    .rope = RopeSharedAngles,
    .softmax = Softmax,
    .log_sum_exp = LogSumExp,
    .top_k = TopK,
    .silu_mul = SiluMul,
    .axpy = Axpy,
    .paged_attention = PagedAttention,
};

const IsaKernels kAvx512Bf16Kernels = {
    .name = "avx512bf16",
    .matmul_bf16 = MatMulBf16Dp,
    .matmul_f32 = MatMulF32,
    .rms_norm = RmsNorm,
    .rope = RopeSharedAngles,
    .softmax = Softmax,
    .log_sum_exp = LogSumExp,
    .top_k = TopK,
    .silu_mul = SiluMul,
    .axpy = Axpy,
    .paged_attention = PagedAttention,
};

}  // namespace tandem::kernels::cpu::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
