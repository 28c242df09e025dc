// AVX2 + FMA kernels, for CPUs without AVX-512. Compiled for those instructions with a target
// pragma; kernels.cc calls into this file only after checking the CPU. Every function compiled
// under the pragma has internal linkage, so the linker cannot pick a copy built here for code
// that runs on older CPUs.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/kernels/cpu/kernels_internal.h"

// Clang has no target pragma; it applies the same target attribute to every function instead.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

namespace tandem::kernels::cpu::internal {
namespace {

#define TANDEM_INLINE inline __attribute__((always_inline))

// All-ones in lanes [0, count), for _mm256_maskload_ps / _mm256_maskstore_ps; count in [0, 8].
TANDEM_INLINE __m256i LowLanes8(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

TANDEM_INLINE float HorizontalSum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

TANDEM_INLINE float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

TANDEM_INLINE double HorizontalSum(__m256d v) {
  __m128d sum = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  sum = _mm_add_sd(sum, _mm_unpackhi_pd(sum, sum));
  return _mm_cvtsd_f64(sum);
}

// Adds the 8 lanes of v, widened to double, into a 4-lane double accumulator.
TANDEM_INLINE void AddToDouble(__m256 v, __m256d& acc) {
  acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

// exp(x) for 8 lanes; the same Cephes expf as kernels_avx512.cc.
TANDEM_INLINE __m256 Exp(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 hi = _mm256_set1_ps(88.37626f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), x);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  const __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(exponent)));
}

void Axpy(float alpha, const float* x, int n, float* y) {
  const __m256 a = _mm256_set1_ps(alpha);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  if (i < n) {
    const __m256i lanes = LowLanes8(n - i);
    const __m256 yv = _mm256_maskload_ps(y + i, lanes);
    _mm256_maskstore_ps(y + i, lanes, _mm256_fmadd_ps(a, _mm256_maskload_ps(x + i, lanes), yv));
  }
}

double LogSumExp(const float* x, int n) {
  __m256 max_v = _mm256_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 8 <= n; i += 8) max_v = _mm256_max_ps(max_v, _mm256_loadu_ps(x + i));
  float max_value = HorizontalMax(max_v);
  for (; i < n; ++i) max_value = std::max(max_value, x[i]);
  if (!std::isfinite(max_value)) return max_value;  // all -inf (or a +inf)
  const __m256 max_b = _mm256_set1_ps(max_value);
  __m256d sum = _mm256_setzero_pd();
  for (i = 0; i < n; i += 8) {
    const __m256i lanes = LowLanes8(std::min(8, n - i));
    // Masked-off lanes load 0 and are cleared after Exp, so they add nothing.
    AddToDouble(_mm256_and_ps(_mm256_castsi256_ps(lanes),
                              Exp(_mm256_sub_ps(_mm256_maskload_ps(x + i, lanes), max_b))),
                sum);
  }
  return max_value + std::log(HorizontalSum(sum));
}

// Eight values at a time against the k-th so far; the few that beat it go through the scalar
// bookkeeping (the threshold only rises, so most blocks have none).
void TopK(const float* x, int n, int k, int32_t* out) {
  StartTopK(x, k, out);
  float floor = x[out[k - 1]];
  __m256 floor_v = _mm256_set1_ps(floor);
  int i = k;
  for (; i + 8 <= n; i += 8) {
    const uint32_t above = static_cast<uint32_t>(
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), floor_v, _CMP_GT_OQ)));
    if (above == 0) continue;
    floor = InsertAbove(x, out, k, i, above, floor);
    floor_v = _mm256_set1_ps(floor);
  }
  for (; i < n; ++i) floor = InsertAbove(x, out, k, i, 1u, floor);
}

void Softmax(float* x, int n) {
  if (n <= 0) return;
  __m256 max_v = _mm256_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 8 <= n; i += 8) max_v = _mm256_max_ps(max_v, _mm256_loadu_ps(x + i));
  float max_value = HorizontalMax(max_v);
  for (; i < n; ++i) max_value = std::max(max_value, x[i]);
  const __m256 max_b = _mm256_set1_ps(max_value);
  __m256d sum = _mm256_setzero_pd();
  for (i = 0; i < n; i += 8) {
    const __m256i lanes = LowLanes8(std::min(8, n - i));
    // Masked-off lanes load 0 and are cleared after Exp, so they add nothing.
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(lanes),
                                   Exp(_mm256_sub_ps(_mm256_maskload_ps(x + i, lanes), max_b)));
    _mm256_maskstore_ps(x + i, lanes, e);
    AddToDouble(e, sum);
  }
  const __m256 inv_sum = _mm256_set1_ps(static_cast<float>(1.0 / HorizontalSum(sum)));
  for (i = 0; i < n; i += 8) {
    const __m256i lanes = LowLanes8(std::min(8, n - i));
    _mm256_maskstore_ps(x + i, lanes, _mm256_mul_ps(_mm256_maskload_ps(x + i, lanes), inv_sum));
  }
}

void SiluMul(const float* gate, const float* up, int n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int i = 0; i < n; i += 8) {
    const __m256i lanes = LowLanes8(std::min(8, n - i));
    const __m256 g = _mm256_maskload_ps(gate + i, lanes);
    const __m256 silu =
        _mm256_div_ps(g, _mm256_add_ps(one, Exp(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_maskstore_ps(out + i, lanes, _mm256_mul_ps(silu, _mm256_maskload_ps(up + i, lanes)));
  }
}

// Gemma's GeGLU, gelu's tanh form as g * sigmoid(2 sqrt(2 / pi) (g + 0.044715 g^3)).
void VectorGeluTanhMul(const float* gate, const float* up, int n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 minus_k = _mm256_set1_ps(-1.5957691216057308f);
  const __m256 cubic = _mm256_set1_ps(0.044715f);
  for (int i = 0; i < n; i += 8) {
    const __m256i lanes = LowLanes8(std::min(8, n - i));
    const __m256 g = _mm256_maskload_ps(gate + i, lanes);
    const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(cubic, g), _mm256_mul_ps(g, g), g);
    const __m256 gelu = _mm256_div_ps(g, _mm256_add_ps(one, Exp(_mm256_mul_ps(minus_k, inner))));
    _mm256_maskstore_ps(out + i, lanes, _mm256_mul_ps(gelu, _mm256_maskload_ps(up + i, lanes)));
  }
}

// cap * tanh(x / cap), tanh(y) as 1 - 2 / (exp(2y) + 1) (1 and -1 where exp saturates).
void VectorSoftCap(float* x, int n, float cap) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 two = _mm256_set1_ps(2.0f);
  const __m256 twice_inverse = _mm256_set1_ps(2.0f / cap);
  const __m256 cap_v = _mm256_set1_ps(cap);
  for (int i = 0; i < n; i += 8) {
    const __m256i lanes = LowLanes8(std::min(8, n - i));
    const __m256 e = Exp(_mm256_mul_ps(_mm256_maskload_ps(x + i, lanes), twice_inverse));
    const __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one)));
    _mm256_maskstore_ps(x + i, lanes, _mm256_mul_ps(cap_v, t));
  }
}

void RmsNorm(const float* x, int b, int n, const float* weight, float eps, float* out) {
  for (int64_t row = 0; row < b; ++row) {
    const float* xr = x + row * n;
    float* outr = out + row * n;
    __m256d sum = _mm256_setzero_pd();
    for (int i = 0; i < n; i += 8) {
      const __m256 v = _mm256_maskload_ps(xr + i, LowLanes8(std::min(8, n - i)));
      AddToDouble(_mm256_mul_ps(v, v), sum);
    }
    const __m256 inv_rms =
        _mm256_set1_ps(static_cast<float>(1.0 / std::sqrt(HorizontalSum(sum) / n + eps)));
    for (int i = 0; i < n; i += 8) {
      const __m256i lanes = LowLanes8(std::min(8, n - i));
      const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(xr + i, lanes), inv_rms);
      _mm256_maskstore_ps(outr + i, lanes, _mm256_mul_ps(_mm256_maskload_ps(weight + i, lanes), v));
    }
  }
}

// The vector interface attention_impl.h is written over: 8 float lanes.
struct Simd256 {
  using Vec = __m256;
  static constexpr int kLanes = 8;
  static Vec Zero() { return _mm256_setzero_ps(); }
  static Vec Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec Set1(float x) { return _mm256_set1_ps(x); }
  static Vec Mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec Sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec Fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static float ReduceAdd(Vec v) { return HorizontalSum(v); }
  // Lane j of the result = the sum of v[j]'s 8 lanes: horizontal adds within 128-bit halves,
  // then the halves added across.
  static Vec ReduceLanes(const Vec* v) {
    const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
  }
  static Vec Exp(Vec v) { return internal::Exp(v); }
  // out (padded,) = the n stored values at `row` times `scale`, then zeros.
  template <KvDtype D>
  static void ConvertRow(const std::byte* row, float scale, int n, int padded, float* out) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      __m256 v;
      if constexpr (D == KvDtype::kF32) {
        v = _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
      } else if constexpr (D == KvDtype::kBf16) {
        const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i));
        v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
      } else {
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i));
        v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), _mm256_set1_ps(scale));
      }
      _mm256_storeu_ps(out + i, v);
    }
    for (; i < n; ++i) {  // the tail, one value at a time
      if constexpr (D == KvDtype::kF32) {
        std::memcpy(out + i, row + 4 * i, sizeof(float));
      } else if constexpr (D == KvDtype::kBf16) {
        uint16_t bits;
        std::memcpy(&bits, row + 2 * i, sizeof(bits));
        out[i] = Bf16BitsToF32(bits);
      } else {
        out[i] = static_cast<float>(static_cast<int8_t>(row[i])) * scale;
      }
    }
    std::fill(out + n, out + padded, 0.0f);
  }
};

#include "common/kernels/cpu/attention_impl.h"

void PagedAttention(const float* q, int num_heads, const PagedKv& kv, int context_begin,
                    int context_end, float scale, int kv_head_begin, int kv_head_end, float* out,
                    float* lse) {
  PagedAttentionTiles<Simd256>(q, num_heads, kv, context_begin, context_end, scale, kv_head_begin,
                               kv_head_end, out, lse);
}

using DeltaSimd = Simd256;
#include "common/kernels/cpu/delta_net_impl.h"

#undef TANDEM_INLINE

}  // namespace

const Backend kAvx2Elementwise = WithStepOps<Softmax, TopK, Axpy>({
    .name = "avx2",
    .rounding = ActivationRounding::kNone,
    .linear = nullptr,
    .linear_group = nullptr,
    .linear_f32 = nullptr,
    .rms_norm = RmsNorm,
    .rope = RopeRows<RopeSharedAngles>,
    .softmax = Softmax,
    .log_sum_exp = LogSumExp,
    .top_k = TopK,
    .silu_mul = SiluMul,
    .axpy = Axpy,
    .paged_attention = PagedAttention,
    .causal_attention = CausalByQuery<PagedAttention>,
    .causal_conv = CausalConv,
    .gated_delta = GatedDelta,
    .gelu_tanh_mul = VectorGeluTanhMul,
    .soft_cap = VectorSoftCap,
});

}  // namespace tandem::kernels::cpu::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
