// AVX-512 kernels (F, BW, VL, DQ) other than the matrix products (linear_avx512.cc).
// Compiled for those instructions with a target pragma, so the rest of the library needs no
// -mavx512 flags; kernels.cc calls into this file only after checking the CPU. Every function
// compiled under the pragma has internal linkage, so the linker cannot pick a copy built here
// for code that runs on older CPUs.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/kernels/cpu/intrinsics.h"
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

// Gemma's GeGLU, gelu's tanh form as g * sigmoid(2 sqrt(2 / pi) (g + 0.044715 g^3)).
void VectorGeluTanhMul(const float* gate, const float* up, int n, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 minus_k = _mm512_set1_ps(-1.5957691216057308f);
  const __m512 cubic = _mm512_set1_ps(0.044715f);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = LowLanes16(std::min(16, n - i));
    const __m512 g = _mm512_maskz_loadu_ps(lanes, gate + i);
    const __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(cubic, g), _mm512_mul_ps(g, g), g);
    const __m512 gelu = _mm512_div_ps(g, _mm512_add_ps(one, Exp(_mm512_mul_ps(minus_k, inner))));
    _mm512_mask_storeu_ps(out + i, lanes,
                          _mm512_mul_ps(gelu, _mm512_maskz_loadu_ps(lanes, up + i)));
  }
}

// cap * tanh(x / cap), tanh(y) as 1 - 2 / (exp(2y) + 1) (1 and -1 where exp saturates).
void VectorSoftCap(float* x, int n, float cap) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 two = _mm512_set1_ps(2.0f);
  const __m512 twice_inverse = _mm512_set1_ps(2.0f / cap);
  const __m512 cap_v = _mm512_set1_ps(cap);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = LowLanes16(std::min(16, n - i));
    const __m512 e = Exp(_mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, x + i), twice_inverse));
    const __m512 t = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(e, one)));
    _mm512_mask_storeu_ps(x + i, lanes, _mm512_mul_ps(cap_v, t));
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

// The vector interface attention_impl.h is written over: 16 float lanes.
struct Simd512 {
  using Vec = __m512;
  static constexpr int kLanes = 16;
  static Vec Zero() { return _mm512_setzero_ps(); }
  static Vec Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec Set1(float x) { return _mm512_set1_ps(x); }
  static Vec Mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec Sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static float ReduceAdd(Vec v) { return _mm512_reduce_add_ps(v); }
  // Per 128-bit block L: the block-L sums of x[0], x[1], x[2], x[3] (pairs of vectors
  // interleaved and added within the blocks).
  static Vec BlockSums4(const Vec* x) {
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1]));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3]));
    const __m512d a = _mm512_castps_pd(t0), b = _mm512_castps_pd(t1);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // Lane j of the result = the sum of v[j]'s 16 lanes: BlockSums4 of each four vectors, then the
  // 128-bit blocks transposed and added.
  static Vec ReduceLanes(const Vec* v) {
    __m512 quads[4];
    for (int k = 0; k < 4; ++k) quads[k] = BlockSums4(v + 4 * k);
    const __m512 y0 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88),
                                    _mm512_shuffle_f32x4(quads[0], quads[1], 0xdd));
    const __m512 y1 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88),
                                    _mm512_shuffle_f32x4(quads[2], quads[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(y0, y1, 0x88), _mm512_shuffle_f32x4(y0, y1, 0xdd));
  }
  static Vec Exp(Vec v) { return internal::Exp(v); }
  // out (padded,) = the n stored values at `row` times `scale`, then zeros.
  template <KvDtype D>
  static __m512 Convert16(const std::byte* row, int i, __mmask16 lanes, float scale) {
    if constexpr (D == KvDtype::kF32) {
      return _mm512_maskz_loadu_ps(lanes, reinterpret_cast<const float*>(row) + i);
    } else if constexpr (D == KvDtype::kBf16) {
      const __m256i bits =
          _mm256_maskz_loadu_epi16(lanes, reinterpret_cast<const uint16_t*>(row) + i);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    } else {
      const __m128i bytes = _mm_maskz_loadu_epi8(lanes, reinterpret_cast<const int8_t*>(row) + i);
      return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), _mm512_set1_ps(scale));
    }
  }
  template <KvDtype D>
  static void ConvertRow(const std::byte* row, float scale, int n, int padded, float* out) {
    if (n == padded) {  // whole vectors: no masks to compute
      for (int i = 0; i < n; i += 16)
        _mm512_storeu_ps(out + i, Convert16<D>(row, i, 0xffff, scale));
      return;
    }
    for (int i = 0; i < padded; i += 16) {
      const __mmask16 lanes = LowLanes16(std::clamp(n - i, 0, 16));
      __m512 v;
      if constexpr (D == KvDtype::kF32) {
        v = _mm512_maskz_loadu_ps(lanes, reinterpret_cast<const float*>(row) + i);
      } else if constexpr (D == KvDtype::kBf16) {
        const __m256i bits =
            _mm256_maskz_loadu_epi16(lanes, reinterpret_cast<const uint16_t*>(row) + i);
        v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
      } else {
        const __m128i bytes = _mm_maskz_loadu_epi8(lanes, reinterpret_cast<const int8_t*>(row) + i);
        v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), _mm512_set1_ps(scale));
      }
      _mm512_storeu_ps(out + i, v);
    }
  }
};

#include "common/kernels/cpu/attention_impl.h"

void PagedAttention(const float* q, int num_heads, const PagedKv& kv, int context_begin,
                    int context_end, float scale, int kv_head_begin, int kv_head_end, float* out,
                    float* lse) {
  PagedAttentionTiles<Simd512>(q, num_heads, kv, context_begin, context_end, scale, kv_head_begin,
                               kv_head_end, out, lse);
}

}  // namespace

// ---- avx512bf16: attention over a bf16 cache with vdpbf16ps ----
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(                                                                \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,fma"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,fma")
#endif

namespace {

// Decode attention over a bf16 or int8 cache at the avx512bf16 level, with two-element dot
// products. A bf16 cache's keys and values stay bf16 and meet the query (times the scale) and
// the softmax weights rounded to bf16 in vdpbf16ps, with float32 sums; nothing is converted or
// copied. An int8 cache's levels are widened to int16 (one vpmovsxbw per 32) and meet the query
// quantized to int16 per head and each tile's weights (softmax weight times the value's scale)
// quantized to int16 per head and tile in vpdpwssd, with int32 sums that are exact; the key
// scales multiply the scores, and each tile's value sums join the float32 output with their
// tile's scale. The walk is AttendTiles' (tiles of kDecodeDotTile positions, every KV head of
// the range per tile, online softmax); values are taken two positions at a time, interleaved
// (vpunpcklwd / vpunpckhwd) so that each dot-product pair is (position j, position j + 1) of one
// element, and the accumulators hold the elements in that interleaved order until the end.
// C = head_dim / 32.
// 32C int8 values -> bf16 (exact: |q| <= 127 has 7 significant bits).
template <int C>
TANDEM_INLINE void Int8RowToBf16(const std::byte* row, uint16_t* out) {
  for (int c = 0; c < C; ++c) {
    const __m512 lo = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 32 * c))));
    const __m512 hi = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 32 * c + 16))));
    _mm512_storeu_si512(out + 32 * c, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

// 32C int8 values -> int16.
template <int C>
TANDEM_INLINE void Int8RowToInt16(const std::byte* row, uint16_t* out) {
  for (int c = 0; c < C; ++c) {
    _mm512_storeu_si512(
        out + 32 * c,
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * c))));
  }
}

// The largest int16 level of the int8 path's query and weights.
constexpr float kInt16Levels = 32767.0f;

// Positions a tile of the decode kernel below: twice kAttentionTile, so that each head's
// softmax bookkeeping (its maximum and sum reduced across lanes, the rescaling, the
// accumulators loaded and stored) is paid once per 64 positions and the next tile's prefetches
// run further ahead (measured on Zen 4, one thread, five interleaved rounds against 32: 1.09x
// faster over bf16 in cache, 1.03x from DRAM, 1.40x over int8 from DRAM; the float32 tile
// kernels of the other levels, whose tiles are converted rows, ran 5-24% slower at 64, so they
// keep 32). An int8 tile's int32 value sums stay exact: 64 x 32767 x 127 < 2^31.
constexpr int kDecodeDotTile = 64;

// A tile's key and value rows of one KV head for the dot-product kernels, into krow / vrow: a
// bf16 cache's where they lie; an int8 cache's widened by `Widen` into k_tile / v_tile (hd
// 16-bit values a position), with their scales, its values left where they lie (and v_tile
// unused) unless kWidenValues. Positions [n, kTile) read `zero_row` (and scales 0).
template <int kTile, int C, KvDtype D, void (*Widen)(const std::byte*, uint16_t*),
          bool kWidenValues = true>
TANDEM_INLINE void GatherTileRows(const PagedKv& kv, const TileSlots& slots, int n, int kv_head,
                                  size_t row_bytes, size_t scales_offset, const std::byte* zero_row,
                                  uint16_t* k_tile, uint16_t* v_tile, float* k_scales,
                                  float* v_scales, const std::byte** krow, const std::byte** vrow) {
  constexpr int hd = 32 * C;
  const size_t within = static_cast<size_t>(kv_head) * hd * (D == KvDtype::kBf16 ? 2 : 1);
  for (int j = 0; j < n; ++j) {
    if constexpr (D == KvDtype::kBf16) {
      krow[j] = kv.k + slots.at[j] + within;
      vrow[j] = kv.v + slots.at[j] + within;
    } else {
      const size_t scale_at =
          Int8ScaleAt(kv, slots.at[j], slots.offset[j], row_bytes, scales_offset, kv_head);
      std::memcpy(&k_scales[j], kv.k + scale_at, sizeof(float));
      std::memcpy(&v_scales[j], kv.v + scale_at, sizeof(float));
      uint16_t* kb = k_tile + static_cast<size_t>(j) * hd;
      Widen(kv.k + slots.at[j] + within, kb);
      krow[j] = reinterpret_cast<const std::byte*>(kb);
      if constexpr (kWidenValues) {
        uint16_t* vb = v_tile + static_cast<size_t>(j) * hd;
        Widen(kv.v + slots.at[j] + within, vb);
        vrow[j] = reinterpret_cast<const std::byte*>(vb);
      } else {
        vrow[j] = kv.v + slots.at[j] + within;
      }
    }
  }
  for (int j = n; j < kTile; ++j) {
    krow[j] = vrow[j] = zero_row;
    if constexpr (D == KvDtype::kInt8) k_scales[j] = v_scales[j] = 0;
  }
}

template <int C, KvDtype D>
void AttendBf16Dot(const float* q, int num_heads, const PagedKv& kv, int context_begin,
                   int context_end, float scale, int kv_head_begin, int kv_head_end, float* out,
                   float* lse) {
  static_assert(D == KvDtype::kBf16 || D == KvDtype::kInt8);
  constexpr int hd = 32 * C;
  constexpr size_t kValueBytes = D == KvDtype::kBf16 ? 2 : 1;
  constexpr int kHeadBlock = 8 / C > 0 ? 8 / C : 1;  // heads whose 2C accumulators fit at once
  constexpr int kTile = kDecodeDotTile;
  static_assert(kTile <= kMaxAttentionTile, "TileSlots holds kMaxAttentionTile positions");
  const int group = num_heads / kv.num_kv_heads;
  const int first_head = kv_head_begin * group;
  const int heads = (kv_head_end - kv_head_begin) * group;
  const size_t row_bytes = static_cast<size_t>(kv.num_kv_heads) * hd * kValueBytes;
  const size_t scales_offset =
      D == KvDtype::kInt8 ? Int8ScalesOffset(kv.block_size, kv.num_kv_heads, hd) : 0;
  float* o = out + static_cast<size_t>(first_head) * hd;
  if (context_begin >= context_end) {
    std::fill(o, o + static_cast<size_t>(heads) * hd, 0.0f);
    if (lse != nullptr) std::fill(lse + first_head, lse + first_head + heads, -INFINITY);
    return;
  }
  thread_local std::vector<float> scratch;
  // qb (heads, hd) bf16 | acc (heads + kHeadBlock, hd) | scores (group, tile) | pairs (group +
  // kHeadBlock, tile / 2) | max, sum, alpha (heads + kHeadBlock) | a zero row (hd bf16) | int8:
  // the tile's keys as int16 (tile, hd; its values are widened as the value products read
  // them), the keys' and the values' scales (tile) each, the query and
  // weight levels (heads + kHeadBlock) each | four heads a KV head: the interleaved queries
  // (heads, hd) 16-bit
  const size_t need =
      static_cast<size_t>(kTile) * (hd / 2 + 2) + static_cast<size_t>(heads) * hd / 2 +
      static_cast<size_t>(heads + kHeadBlock) * hd + static_cast<size_t>(group) * kTile +
      static_cast<size_t>(group + kHeadBlock) * kTile / 2 +
      5 * static_cast<size_t>(heads + kHeadBlock) + hd / 2 + 16 +
      static_cast<size_t>(heads) * hd / 2;
  if (scratch.size() < need) scratch.resize(need);
  auto* qb = reinterpret_cast<uint16_t*>(scratch.data());  // bf16, or int16 for int8 caches
  float* acc = scratch.data() + static_cast<size_t>(heads) * hd / 2;
  float* scores = acc + static_cast<size_t>(heads + kHeadBlock) * hd;
  auto* pairs = reinterpret_cast<uint32_t*>(scores + static_cast<size_t>(group) * kTile);
  float* running_max =
      reinterpret_cast<float*>(pairs + static_cast<size_t>(group + kHeadBlock) * kTile / 2);
  float* running_sum = running_max + heads + kHeadBlock;
  float* alphas = running_sum + heads + kHeadBlock;
  auto* zero_row = reinterpret_cast<const std::byte*>(alphas + heads + kHeadBlock);
  std::fill(reinterpret_cast<float*>(alphas + heads + kHeadBlock),
            reinterpret_cast<float*>(alphas + heads + kHeadBlock) + hd / 2, 0.0f);
  auto* k_tile = reinterpret_cast<uint16_t*>(alphas + heads + kHeadBlock + hd / 2);  // int8 only
  float* k_scales = reinterpret_cast<float*>(k_tile + static_cast<size_t>(kTile) * hd);
  float* v_scales = k_scales + kTile;
  // int8: each head's query level (times the scale) and this tile's weight level.
  float* q_levels = v_scales + kTile;
  float* w_levels = q_levels + heads + kHeadBlock;
  // Four query heads a KV head (Mixtral, the dummy-3b layouts): their queries interleaved by 8
  // elements (the 128-bit block h of chunk c holds head h's elements [8c, 8c + 8)), so that a
  // vdpbf16ps of the chunk against the key's 8 elements broadcast to the four blocks scores the
  // key for the four heads at once, and 16 keys' scores of the four heads take one transposing
  // reduction of 44 instructions rather than four of 45 (measured on Zen 4, one thread, five
  // interleaved rounds: 1.33x faster over bf16 in cache, 1.29x over int8).
  const bool packed = group == 4;
  auto* qp = reinterpret_cast<uint16_t*>(w_levels + heads + kHeadBlock);
  for (int h = 0; h < heads; ++h) {
    const float* qh = q + static_cast<size_t>(first_head + h) * hd;
    uint16_t* qbh = qb + static_cast<size_t>(h) * hd;
    if constexpr (D == KvDtype::kBf16) {
      for (int i = 0; i < hd; ++i) qbh[i] = F32ToBf16Bits(qh[i] * scale);
    } else {
      float amax = 0;
      for (int i = 0; i < hd; ++i) amax = std::max(amax, std::fabs(qh[i] * scale));
      q_levels[h] = amax / kInt16Levels;
      const float inverse = amax > 0 ? kInt16Levels / amax : 0.0f;
      for (int i = 0; i < hd; ++i) {
        qbh[i] =
            static_cast<uint16_t>(static_cast<int16_t>(std::nearbyint(qh[i] * scale * inverse)));
      }
    }
    running_max[h] = -INFINITY;
    running_sum[h] = 0;
  }
  if (packed) {
    for (int h = 0; h < heads; ++h) {
      for (int c = 0; c < 4 * C; ++c) {
        std::memcpy(qp + static_cast<size_t>(h / 4) * 4 * hd + 32 * c + 8 * (h % 4),
                    qb + static_cast<size_t>(h) * hd + 8 * c, 8 * sizeof(uint16_t));
      }
    }
  }
  for (int h = heads; h < heads + kHeadBlock; ++h) w_levels[h] = 0;
  std::fill(acc, acc + static_cast<size_t>(heads + kHeadBlock) * hd, 0.0f);
  // Padding heads of a partial head block: weights 0, so they add nothing, and never read back.
  std::fill(pairs + static_cast<size_t>(group) * kTile / 2,
            pairs + static_cast<size_t>(group + kHeadBlock) * kTile / 2, 0u);
  for (int h = heads; h < heads + kHeadBlock; ++h) alphas[h] = 1;

  const std::byte* krow[kTile];
  const std::byte* vrow[kTile];
  for (int j = 0; j < kTile; ++j) krow[j] = vrow[j] = zero_row;
  TileSlots slots(kv, row_bytes, context_begin);
  for (int t0 = context_begin; t0 < context_end; t0 += kTile) {
    const int n = std::min(kTile, context_end - t0);
    const int n_next = std::clamp(context_end - t0 - kTile, 0, kTile);
    slots.Advance(n, n_next);
    const size_t first = static_cast<size_t>(kv_head_begin) * hd * kValueBytes;
    const size_t bytes = static_cast<size_t>(kv_head_end - kv_head_begin) * hd * kValueBytes;
    // bf16: nothing prefetched the first tile, so its rows of every KV head of the range are
    // asked for at once, before any is scored (a part of a split context is often 4-8 tiles:
    // the engine's attention at 1,025 positions on 2 threads, bf16, ran 1.13x faster with it,
    // medians of six interleaved rounds; over int8 the tile's widening sets the pace).
    if (D == KvDtype::kBf16 && t0 == context_begin) {
      // All key rows before any value row (not K and V a position at a time): the keys are
      // scored first (four interleaved rounds at 1k: 0.95x with K and V a position at a time).
      for (int j = 0; j < n; ++j) PrefetchPoolSlot(kv.k, slots.at[j], first, bytes);
      for (int j = 0; j < n; ++j) PrefetchPoolSlot(kv.v, slots.at[j], first, bytes);
    }
    // The next tile's rows, a K and V line pair at a time in address order (NextTileLines):
    // bf16 half a pair a key line as the keys are scored (spread over the chunks of each 16)
    // and a pair a value line as the values are summed; int8 all of them as the values are
    // summed (the tile's widening sets its pace).
    NextTileLines<D == KvDtype::kInt8> ahead(kv, slots, n_next, first, bytes, row_bytes,
                                             scales_offset, kv_head_begin);
    for (int kv_head = kv_head_begin; kv_head < kv_head_end; ++kv_head) {
      const int h0 = (kv_head - kv_head_begin) * group;
      // bf16: the next tile's lines are asked for as the scores run as well as the value
      // products, at an even pace through the tile (measured on Zen 4, one thread, from DRAM,
      // two runs of five interleaved rounds: 1.32x and 1.33x faster than only during the value
      // products, at the time a bare walk of the same bytes takes). int8: only as the value
      // products run (its widening sets the pace; the split gained nothing).
      constexpr bool kKeysAhead = D == KvDtype::kBf16;
      constexpr int kKeyLines = static_cast<int>((hd * kValueBytes + 63) / 64);  // lines a key row
      // Line pairs asked for while 16 keys are scored, spread over their chunks: half a pair a
      // key line.
      constexpr int kScoreAsks = 16 * ((kKeyLines + 1) / 2);
      // int8: key levels widened to int16; the scales multiply scores and weights.
      GatherTileRows<kTile, C, D, Int8RowToInt16<C>, false>(
          kv, slots, n, kv_head, row_bytes, scales_offset, zero_row, k_tile,
          /*v_tile=*/nullptr, k_scales, v_scales, krow, vrow);
      if (packed) {
        const uint16_t* qk = qp + static_cast<size_t>(h0) * hd;
        for (int j0 = 0; j0 < n; j0 += 16) {
          __m512 a[16];
          if constexpr (D == KvDtype::kBf16) {
            for (int j = 0; j < 16; ++j) a[j] = _mm512_setzero_ps();
            for (int c = 0; c < 4 * C; ++c) {
              const __m512bh qc = (__m512bh)_mm512_loadu_si512(qk + 32 * c);
              for (int l = 0; l < kScoreAsks / (4 * C); ++l) ahead.One();
              for (int j = 0; j < 16; ++j) {
                a[j] = _mm512_dpbf16_ps(
                    a[j], qc,
                    (__m512bh)_mm512_broadcast_i32x4(
                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(krow[j0 + j] + 16 * c))));
              }
            }
          } else {
            __m512i sums[16];
            for (int j = 0; j < 16; ++j) sums[j] = _mm512_setzero_si512();
            for (int c = 0; c < 4 * C; ++c) {
              const __m512i qc = _mm512_loadu_si512(qk + 32 * c);
              for (int j = 0; j < 16; ++j) {
                sums[j] = _mm512_dpwssd_epi32(
                    sums[j], qc,
                    _mm512_broadcast_i32x4(
                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(krow[j0 + j] + 16 * c))));
              }
            }
            for (int j = 0; j < 16; ++j) a[j] = _mm512_cvtepi32_ps(sums[j]);
          }
          // Block h of a[j]: head h's four partial sums for key j0 + j. Per block, four keys'
          // sums side by side, then the blocks transposed: head h's 16 scores.
          __m512 quads[4];
          for (int k = 0; k < 4; ++k) quads[k] = Simd512::BlockSums4(a + 4 * k);
          const __m512 y0 = _mm512_shuffle_f32x4(quads[0], quads[1], 0x44);
          const __m512 y1 = _mm512_shuffle_f32x4(quads[0], quads[1], 0xee);
          const __m512 y2 = _mm512_shuffle_f32x4(quads[2], quads[3], 0x44);
          const __m512 y3 = _mm512_shuffle_f32x4(quads[2], quads[3], 0xee);
          const __m512 per_head[4] = {
              _mm512_shuffle_f32x4(y0, y2, 0x88), _mm512_shuffle_f32x4(y0, y2, 0xdd),
              _mm512_shuffle_f32x4(y1, y3, 0x88), _mm512_shuffle_f32x4(y1, y3, 0xdd)};
          for (int g = 0; g < 4; ++g) {
            __m512 scores16 = per_head[g];
            if constexpr (D == KvDtype::kInt8) {
              scores16 = _mm512_mul_ps(scores16, _mm512_mul_ps(_mm512_loadu_ps(k_scales + j0),
                                                               _mm512_set1_ps(q_levels[h0 + g])));
            }
            _mm512_storeu_ps(scores + static_cast<size_t>(g) * kTile + j0, scores16);
          }
        }
      }
      for (int g = 0; g < group; ++g) {
        const int h = h0 + g;
        const uint16_t* qh = qb + static_cast<size_t>(h) * hd;
        float* s = scores + static_cast<size_t>(g) * kTile;
        // Four heads a KV head were scored together above.
        for (int j0 = 0; j0 < (packed ? 0 : n); j0 += 16) {
          __m512 a[16];
          if constexpr (D == KvDtype::kBf16) {
            for (int j = 0; j < 16; ++j) a[j] = _mm512_setzero_ps();
            for (int c = 0; c < C; ++c) {
              const __m512bh qc = (__m512bh)_mm512_loadu_si512(qh + 32 * c);
              if (g == 0) {
                for (int l = 0; l < kScoreAsks / C; ++l) ahead.One();
              }
              for (int j = 0; j < 16; ++j) {
                a[j] =
                    _mm512_dpbf16_ps(a[j], qc, (__m512bh)_mm512_loadu_si512(krow[j0 + j] + 64 * c));
              }
            }
          } else {
            __m512i sums[16];
            for (int j = 0; j < 16; ++j) sums[j] = _mm512_setzero_si512();
            for (int c = 0; c < C; ++c) {
              const __m512i qc = _mm512_loadu_si512(qh + 32 * c);
              for (int j = 0; j < 16; ++j) {
                sums[j] =
                    _mm512_dpwssd_epi32(sums[j], qc, _mm512_loadu_si512(krow[j0 + j] + 64 * c));
              }
            }
            for (int j = 0; j < 16; ++j) a[j] = _mm512_cvtepi32_ps(sums[j]);
          }
          __m512 scores16 = Simd512::ReduceLanes(a);
          if constexpr (D == KvDtype::kInt8) {
            scores16 = _mm512_mul_ps(scores16, _mm512_mul_ps(_mm512_loadu_ps(k_scales + j0),
                                                             _mm512_set1_ps(q_levels[h])));
          }
          _mm512_storeu_ps(s + j0, scores16);
        }
        constexpr int kVecs = kTile / 16;  // a tile's scores in vectors
        if (n < kTile) std::fill(s + n, s + kTile, -INFINITY);
        __m512 maxes = _mm512_loadu_ps(s);
        for (int k = 1; k < kVecs; ++k) maxes = _mm512_max_ps(maxes, _mm512_loadu_ps(s + 16 * k));
        const float tile_max = _mm512_reduce_max_ps(maxes);
        const float new_max = std::max(running_max[h], tile_max);
        uint32_t* pg = pairs + static_cast<size_t>(g) * kTile / 2;
        if (new_max == -INFINITY) {
          std::fill(pg, pg + kTile / 2, 0u);
          alphas[h] = 1;
          w_levels[h] = 0;
          continue;
        }
        // Once the largest score has been seen, tiles rarely raise it: no rescaling to compute.
        alphas[h] = new_max == running_max[h] ? 1.0f : std::exp(running_max[h] - new_max);
        if constexpr (D == KvDtype::kInt8) {
          // Weights times the values' scales, quantized to int16 over the tile's largest.
          __m512 p[kVecs], w_max = _mm512_setzero_ps(), p_sums = _mm512_setzero_ps();
          for (int k = 0; k < kVecs; ++k) {
            p[k] = Exp(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * k), _mm512_set1_ps(new_max)));
            p_sums = _mm512_add_ps(p_sums, p[k]);
            p[k] = _mm512_mul_ps(p[k], _mm512_loadu_ps(v_scales + 16 * k));
            w_max = _mm512_max_ps(w_max, p[k]);
          }
          const float largest = _mm512_reduce_max_ps(w_max);
          w_levels[h] = largest / kInt16Levels;
          const __m512 to_levels = _mm512_set1_ps(largest > 0 ? kInt16Levels / largest : 0.0f);
          for (int k = 0; k < kVecs; ++k) {
            const __m256i levels =
                _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(p[k], to_levels)));
            // (w_j, w_j+1) pairs: consecutive int16 values are already pairs in memory.
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(pg + 8 * k), levels);
          }
          running_sum[h] = running_sum[h] * alphas[h] + _mm512_reduce_add_ps(p_sums);
          running_max[h] = new_max;
          continue;
        }
        __m512 tile_sums = _mm512_setzero_ps();
        for (int j = 0; j < kTile; j += 16) {
          const __m512 p = Exp(_mm512_sub_ps(_mm512_loadu_ps(s + j), _mm512_set1_ps(new_max)));
          // Rounded to bf16 as the products use them, and summed as rounded.
          __m256bh rounded = _mm512_cvtneps_pbh(p);
          tile_sums = _mm512_add_ps(tile_sums, _mm512_cvtpbh_ps(rounded));
          // (p_j, p_j+1) pairs: consecutive bf16 values are already pairs in memory.
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(pg + j / 2), (__m256i)rounded);
        }
        running_sum[h] = running_sum[h] * alphas[h] + _mm512_reduce_add_ps(tile_sums);
        running_max[h] = new_max;
      }
      // acc = acc * alpha + p @ V, kHeadBlock heads at a time (2C accumulators each): bf16
      // products into the float32 output; int8's into int32 sums over the tile, which join
      // the output at the end with the tile's weight level.
      for (int g0 = 0; g0 < group; g0 += kHeadBlock) {
        __m512 a[kHeadBlock][2 * C];
        __m512i sums[kHeadBlock][2 * C];
        const uint32_t* pw[kHeadBlock];
        float* ah[kHeadBlock];
        int hk[kHeadBlock];
        for (int k = 0; k < kHeadBlock; ++k) {
          const bool real = g0 + k < group;
          hk[k] = real ? h0 + g0 + k : heads + k;  // padding heads past the range
          ah[k] = acc + static_cast<size_t>(hk[k]) * hd;
          pw[k] = pairs + static_cast<size_t>(real ? g0 + k : group + k) * kTile / 2;
          if constexpr (D == KvDtype::kBf16) {
            const __m512 alpha = _mm512_set1_ps(alphas[hk[k]]);
            for (int c = 0; c < 2 * C; ++c)
              a[k][c] = _mm512_mul_ps(_mm512_loadu_ps(ah[k] + 16 * c), alpha);
          } else {
            for (int c = 0; c < 2 * C; ++c) sums[k][c] = _mm512_setzero_si512();
          }
        }
        for (int j = 0; j < n; j += 2) {
          // As many line pairs of the next tile as a value row of this KV head has lines (int8:
          // twice as many), spread over the arithmetic.
          if (g0 == 0) {
            for (int l = 0; l < (kKeysAhead ? 1 : 2) * kKeyLines; ++l) ahead.One();
          }
          for (int c = 0; c < C; ++c) {
            // int8: widened as read (not into the tile with the keys).
            const auto row = [&](int i) {
              if constexpr (D == KvDtype::kInt8) {
                return _mm512_cvtepi8_epi16(
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vrow[i] + 32 * c)));
              } else {
                return _mm512_loadu_si512(vrow[i] + 64 * c);
              }
            };
            const __m512i x = row(j);
            const __m512i y = row(j + 1);
            const __m512i lo = _mm512_unpacklo_epi16(x, y);
            const __m512i hi = _mm512_unpackhi_epi16(x, y);
            for (int k = 0; k < kHeadBlock; ++k) {
              const __m512i w = _mm512_set1_epi32(static_cast<int>(pw[k][j / 2]));
              if constexpr (D == KvDtype::kBf16) {
                a[k][2 * c] = _mm512_dpbf16_ps(a[k][2 * c], (__m512bh)lo, (__m512bh)w);
                a[k][2 * c + 1] = _mm512_dpbf16_ps(a[k][2 * c + 1], (__m512bh)hi, (__m512bh)w);
              } else {
                sums[k][2 * c] = _mm512_dpwssd_epi32(sums[k][2 * c], lo, w);
                sums[k][2 * c + 1] = _mm512_dpwssd_epi32(sums[k][2 * c + 1], hi, w);
              }
            }
          }
        }
        for (int k = 0; k < kHeadBlock; ++k) {
          if constexpr (D == KvDtype::kBf16) {
            for (int c = 0; c < 2 * C; ++c) _mm512_storeu_ps(ah[k] + 16 * c, a[k][c]);
          } else {
            const __m512 alpha = _mm512_set1_ps(alphas[hk[k]]);
            const __m512 level = _mm512_set1_ps(w_levels[hk[k]]);
            for (int c = 0; c < 2 * C; ++c) {
              _mm512_storeu_ps(
                  ah[k] + 16 * c,
                  _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[k][c]), level,
                                  _mm512_mul_ps(_mm512_loadu_ps(ah[k] + 16 * c), alpha)));
            }
          }
        }
      }
    }
  }
  // Accumulator lane m of chunk c's low half holds element 32c + 8(m / 4) + m % 4; of its high
  // half, that + 4.
  for (int h = 0; h < heads; ++h) {
    const float* ahh = acc + static_cast<size_t>(h) * hd;
    const float inverse = 1.0f / running_sum[h];
    float* oh = o + static_cast<size_t>(h) * hd;
    for (int c = 0; c < C; ++c) {
      for (int m = 0; m < 16; ++m) {
        const int element = 32 * c + 8 * (m / 4) + m % 4;
        oh[element] = ahh[32 * c + m] * inverse;
        oh[element + 4] = ahh[32 * c + 16 + m] * inverse;
      }
    }
    if (lse != nullptr) lse[first_head + h] = running_max[h] + std::log(running_sum[h]);
  }
}

// The cache row of DeepSeek's latent attention (kv_lora_rank 512 + qk_rope_head_dim 64): one
// KV head read by every query head, which the query-block kernel below takes as its rows.
constexpr int kLatentRow = 576;
// Query heads a KV head from which decode runs them as the rows of the query-block kernel
// (measured: 1.37x faster attention at 8 heads of 64 dims, 32k positions; slower at 4, where
// three quarters of the lanes idle; Gemma 4's global layers: 8 heads of 512).
constexpr int kRowHeads = 8;
template <int C, KvDtype D>
void AttendCausalBf16Dot(const float* q, int m, int num_heads, const PagedKv& kv,
                         int first_position, int context_begin, int context_end, int window,
                         float scale, float* out, float* lse);

void PagedAttentionBf16Dot(const float* q, int num_heads, const PagedKv& kv, int context_begin,
                           int context_end, float scale, int kv_head_begin, int kv_head_end,
                           float* out, float* lse) {
  const auto run = [&](auto attend) {
    attend(q, num_heads, kv, context_begin, context_end, scale, kv_head_begin, kv_head_end, out,
           lse);
  };
  if (kv.dtype == KvDtype::kBf16 || kv.dtype == KvDtype::kInt8) {
    const bool int8 = kv.dtype == KvDtype::kInt8;
    // Eight or more query heads a KV head over every KV head (gpt-oss: 8 of 64 dims): the
    // heads are the rows of the query-block kernel, as latent attention's below, one query at
    // the context's last position: a score is a vdpbf16ps per row vector with the key's pair
    // broadcast, rather than a dot product reduced across lanes per head.
    const bool grouped = kv.num_kv_heads > 0 && num_heads / kv.num_kv_heads >= kRowHeads &&
                         kv_head_begin == 0 && kv_head_end == kv.num_kv_heads;
    const auto rows = [&](auto attend) {
      return attend(q, 1, num_heads, kv, context_end - 1, context_begin, context_end,
                    /*window=*/0, scale, out, lse);
    };
    if (grouped) {
      switch (kv.head_dim) {
        case 64:
          return rows(int8 ? AttendCausalBf16Dot<2, KvDtype::kInt8>
                           : AttendCausalBf16Dot<2, KvDtype::kBf16>);
        case 128:
          return rows(int8 ? AttendCausalBf16Dot<4, KvDtype::kInt8>
                           : AttendCausalBf16Dot<4, KvDtype::kBf16>);
        case 256:
          return rows(int8 ? AttendCausalBf16Dot<8, KvDtype::kInt8>
                           : AttendCausalBf16Dot<8, KvDtype::kBf16>);
        case 512:
          return rows(int8 ? AttendCausalBf16Dot<16, KvDtype::kInt8>
                           : AttendCausalBf16Dot<16, KvDtype::kBf16>);
        default:
          break;
      }
    }
    switch (kv.head_dim) {
      case 32:
        return run(int8 ? AttendBf16Dot<1, KvDtype::kInt8> : AttendBf16Dot<1, KvDtype::kBf16>);
      case 64:
        return run(int8 ? AttendBf16Dot<2, KvDtype::kInt8> : AttendBf16Dot<2, KvDtype::kBf16>);
      case 128:
        return run(int8 ? AttendBf16Dot<4, KvDtype::kInt8> : AttendBf16Dot<4, KvDtype::kBf16>);
      case 256:  // Gemma 4's sliding layers (2 query heads a KV head)
        return run(int8 ? AttendBf16Dot<8, KvDtype::kInt8> : AttendBf16Dot<8, KvDtype::kBf16>);
      case 512:
        return run(int8 ? AttendBf16Dot<16, KvDtype::kInt8> : AttendBf16Dot<16, KvDtype::kBf16>);
      case kLatentRow:
        // Latent attention's cache (one KV head of the latent and the rotary key, every query
        // head reading it): the heads are the rows of the query-block kernel, 16 to a vector,
        // one query at the context's last position.
        if (kv.num_kv_heads == 1 && kv_head_begin == 0 && kv_head_end == 1) {
          const auto latent = int8 ? AttendCausalBf16Dot<kLatentRow / 32, KvDtype::kInt8>
                                   : AttendCausalBf16Dot<kLatentRow / 32, KvDtype::kBf16>;
          return latent(q, 1, num_heads, kv, context_end - 1, context_begin, context_end,
                        /*window=*/0, scale, out, lse);
        }
        break;
      default:
        break;
    }
  }
  PagedAttention(q, num_heads, kv, context_begin, context_end, scale, kv_head_begin, kv_head_end,
                 out, lse);
}

// Prefill attention over a bf16 or int8 cache at the avx512bf16 level, for a block of m
// consecutive queries of one sequence (Backend::causal_attention). For each KV head, the block's
// (query, head) rows lie in vector lanes, 16 rows a vector: a score is one vdpbf16ps per row
// vector and dimension pair, with the key's pair broadcast; the online softmax's max, sum and
// rescaling are lane-wise (no horizontal reductions); and each key and value is read once for the
// block rather than once per query. Rounding is AttendBf16Dot's: the query times the scale and the
// softmax weights in bf16, float32 sums, int8 scales on scores and weights. A row's result does
// not depend on the other rows of its block.
template <int C, KvDtype D>
void AttendCausalBf16Dot(const float* q, int m, int num_heads, const PagedKv& kv,
                         int first_position, int context_begin, int context_end, int window,
                         float scale, float* out, float* lse) {
  static_assert(D == KvDtype::kBf16 || D == KvDtype::kInt8);
  constexpr int hd = 32 * C;
  constexpr int kPairs = hd / 2;  // dimension pairs of a row
  constexpr size_t kValueBytes = D == KvDtype::kBf16 ? 2 : 1;
  constexpr int kRowBlock = 8 / C > 0 ? 8 / C : 1;  // rows whose 2C accumulators fit at once
  // A row's accumulators a pass: all 2C, or where they are more than 16 the most up to 16 that
  // divide them (12 of latent attention's 36, 16 of a 512-wide head's 32).
  constexpr int kPass = [] {
    int pass = std::min(2 * C, 16);
    while ((2 * C) % pass != 0) --pass;
    return pass;
  }();
  constexpr int kTile = kAttentionTile;
  const int group = num_heads / kv.num_kv_heads;
  const int rows = m * group;  // row r = (query r / group, head r % group of the KV head)
  const int vecs = (rows + 15) / 16;
  const int padded = vecs * 16 + kRowBlock;  // lanes, and rows past the end for a row block
  const size_t q_dim = static_cast<size_t>(num_heads) * hd;
  const size_t row_bytes = static_cast<size_t>(kv.num_kv_heads) * hd * kValueBytes;
  const size_t scales_offset =
      D == KvDtype::kInt8 ? Int8ScalesOffset(kv.block_size, kv.num_kv_heads, hd) : 0;
  const int walk_end = std::min(context_end, first_position + m);  // the last query's end

  // qt (vecs, kPairs, 16) bf16 pairs | acc (padded, hd) | s (tile, padded) | w (tile / 2,
  // padded) pairs | vt (tile / 2, 2C, 16) pairs | max, sum, alpha (padded) | ends, begins
  // (padded) | k and v scales (tile) | int8: the tile's keys and values as bf16 (tile, hd) | a
  // zero row
  thread_local std::vector<float> scratch;
  const size_t need =
      static_cast<size_t>(vecs) * kPairs * 16 + static_cast<size_t>(padded) * hd +
      static_cast<size_t>(kTile) * padded + static_cast<size_t>(kTile) / 2 * padded +
      static_cast<size_t>(kTile) / 2 * 2 * C * 16 + 5 * static_cast<size_t>(padded) + 2 * kTile +
      static_cast<size_t>(kTile) * hd + hd / 2 + 16;
  if (scratch.size() < need) scratch.resize(need);
  auto* qt = reinterpret_cast<uint32_t*>(scratch.data());
  float* acc = scratch.data() + static_cast<size_t>(vecs) * kPairs * 16;
  float* s = acc + static_cast<size_t>(padded) * hd;
  auto* w = reinterpret_cast<uint32_t*>(s + static_cast<size_t>(kTile) * padded);
  auto* vt = reinterpret_cast<__m512i*>(w + static_cast<size_t>(kTile) / 2 * padded);
  float* running_max = reinterpret_cast<float*>(vt + kTile / 2 * 2 * C);
  float* running_sum = running_max + padded;
  float* alphas = running_sum + padded;
  auto* ends = reinterpret_cast<int32_t*>(alphas + padded);
  int32_t* begins = ends + padded;
  float* k_scales = reinterpret_cast<float*>(begins + padded);
  float* v_scales = k_scales + kTile;
  auto* k_tile = reinterpret_cast<uint16_t*>(v_scales + kTile);  // int8 only
  uint16_t* v_tile = k_tile + static_cast<size_t>(kTile) * hd;
  auto* zero_row = reinterpret_cast<std::byte*>(v_tile + static_cast<size_t>(kTile) * hd);
  std::memset(zero_row, 0, hd * sizeof(uint16_t));
  const std::byte* krow[kTile];
  const std::byte* vrow[kTile];
  // The query for every KV head's rows: each output row belongs to exactly one.
  for (int kv_head = 0; kv_head < kv.num_kv_heads; ++kv_head) {
    const int h0 = kv_head * group;
    for (int r = 0; r < vecs * 16; ++r) {
      const bool real = r < rows;
      const int i = real ? r / group : 0;
      const float* qr = q + i * q_dim + static_cast<size_t>(h0 + r % group) * hd;
      for (int d = 0; d < kPairs; ++d) {
        const uint32_t lo = real ? F32ToBf16Bits(qr[2 * d] * scale) : 0;
        const uint32_t hi = real ? F32ToBf16Bits(qr[2 * d + 1] * scale) : 0;
        qt[(static_cast<size_t>(r / 16) * kPairs + d) * 16 + r % 16] = lo | hi << 16;
      }
      ends[r] =
          real ? CausalQueryEnd(first_position, i, context_begin, context_end) : context_begin;
      begins[r] = real ? CausalQueryBegin(first_position, i, context_begin, window) : context_begin;
    }
    for (int r = 0; r < padded; ++r) {
      running_max[r] = -INFINITY;
      running_sum[r] = 0;
      alphas[r] = 1;
    }
    std::fill(acc, acc + static_cast<size_t>(padded) * hd, 0.0f);
    // Rows past the last real one: weights 0 for every tile (never written below).
    std::fill(w, w + static_cast<size_t>(kTile) / 2 * padded, 0u);
    int min_end = walk_end, min_begin = walk_end, max_begin = context_begin;
    for (int r = 0; r < rows; ++r) {
      min_end = std::min(min_end, ends[r]);
      min_begin = std::min(min_begin, begins[r]);  // a sliding window's first position
      max_begin = std::max(max_begin, begins[r]);
    }
    // Tiles on the grid from context_begin, whatever the block: a row's sums do not depend on
    // the rows beside it (the tiles before its window are all -inf for it).
    const int walk_begin =
        context_begin + (std::max(min_begin, context_begin) - context_begin) / kTile * kTile;
    const size_t within = static_cast<size_t>(kv_head) * hd * kValueBytes;
    TileSlots slots(kv, row_bytes, walk_begin);
    for (int t0 = walk_begin; t0 < walk_end; t0 += kTile) {
      const int n = std::min(kTile, walk_end - t0);
      const int n_next = std::clamp(walk_end - t0 - kTile, 0, kTile);
      slots.Advance(n, n_next);
      PrefetchRows(kv, slots.next, n_next, within, hd * kValueBytes);
      // int8: levels widened to bf16 once, shared by the block's rows.
      GatherTileRows<kTile, C, D, Int8RowToBf16<C>>(kv, slots, n, kv_head, row_bytes, scales_offset,
                                                    zero_row, k_tile, v_tile, k_scales, v_scales,
                                                    krow, vrow);
      // Scores, 8 positions of 16 rows at a time.
      for (int v = 0; v < vecs; ++v) {
        const uint32_t* qv = qt + static_cast<size_t>(v) * kPairs * 16;
        for (int j0 = 0; j0 < n; j0 += 8) {
          __m512 a[8];
          for (int j = 0; j < 8; ++j) a[j] = _mm512_setzero_ps();
          for (int d = 0; d < kPairs; ++d) {
            const __m512bh qd = (__m512bh)_mm512_loadu_si512(qv + 16 * d);
            for (int j = 0; j < 8; ++j) {
              uint32_t key;
              std::memcpy(&key, krow[j0 + j] + 4 * d, sizeof(key));
              a[j] = _mm512_dpbf16_ps(a[j], qd, (__m512bh)_mm512_set1_epi32(static_cast<int>(key)));
            }
          }
          for (int j = 0; j < 8; ++j) {
            if constexpr (D == KvDtype::kInt8) {
              a[j] = _mm512_mul_ps(a[j], _mm512_set1_ps(k_scales[j0 + j]));
            }
            _mm512_storeu_ps(s + static_cast<size_t>(j0 + j) * padded + 16 * v, a[j]);
          }
        }
      }
      // Positions at or past a row's end (and past the tile), and before its window, score -inf.
      const bool masked = t0 + kTile > min_end || t0 < max_begin;
      for (int v = 0; v < vecs; ++v) {
        const __m512i row_ends = _mm512_loadu_si512(ends + 16 * v);
        const __m512i row_begins = _mm512_loadu_si512(begins + 16 * v);
        __m512 tile_max = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < kTile; ++j) {
          float* sj = s + static_cast<size_t>(j) * padded + 16 * v;
          __m512 x = _mm512_loadu_ps(sj);
          if (masked) {
            const __m512i t = _mm512_set1_epi32(t0 + j);
            const __mmask16 live =
                _mm512_cmpgt_epi32_mask(row_ends, t) & _mm512_cmple_epi32_mask(row_begins, t);
            x = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), live, x);
            _mm512_storeu_ps(sj, x);
          }
          tile_max = _mm512_max_ps(tile_max, x);
        }
        const __m512 old_max = _mm512_loadu_ps(running_max + 16 * v);
        const __m512 new_max = _mm512_max_ps(old_max, tile_max);
        // Rows with nothing yet subtract 0: their weights are exp(-inf) = 0, their alpha 0.
        const __m512 base = _mm512_mask_mov_ps(
            new_max, _mm512_cmp_ps_mask(new_max, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
            _mm512_setzero_ps());
        const __m512 alpha = Exp(_mm512_sub_ps(old_max, base));
        __m512 tile_sum = _mm512_setzero_ps();
        // (p_j, p_j+1) of each row as one bf16 pair: rows' p_j in the low 16 halves of the
        // rounded pair of vectors, p_j+1 in the high 16, interleaved by a permutation.
        const __m512i interleave =
            _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                             22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        for (int j = 0; j < n; j += 2) {
          const __m512 p0 = Exp(
              _mm512_sub_ps(_mm512_loadu_ps(s + static_cast<size_t>(j) * padded + 16 * v), base));
          const __m512 p1 = Exp(_mm512_sub_ps(
              _mm512_loadu_ps(s + static_cast<size_t>(j + 1) * padded + 16 * v), base));
          __m512bh rounded = _mm512_cvtne2ps_pbh(p1, p0);  // p0 low, p1 high
          tile_sum = _mm512_add_ps(
              tile_sum,
              _mm512_add_ps(
                  _mm512_cvtpbh_ps((__m256bh)_mm512_castsi512_si256((__m512i)rounded)),
                  _mm512_cvtpbh_ps((__m256bh)_mm512_extracti64x4_epi64((__m512i)rounded, 1))));
          if constexpr (D == KvDtype::kInt8) {
            rounded = _mm512_cvtne2ps_pbh(_mm512_mul_ps(p1, _mm512_set1_ps(v_scales[j + 1])),
                                          _mm512_mul_ps(p0, _mm512_set1_ps(v_scales[j])));
          }
          _mm512_storeu_si512(w + static_cast<size_t>(j / 2) * padded + 16 * v,
                              _mm512_permutexvar_epi16(interleave, (__m512i)rounded));
        }
        _mm512_storeu_ps(running_sum + 16 * v,
                         _mm512_fmadd_ps(_mm512_loadu_ps(running_sum + 16 * v), alpha, tile_sum));
        _mm512_storeu_ps(running_max + 16 * v, new_max);
        _mm512_storeu_ps(alphas + 16 * v, alpha);
      }
      // The tile's values, two positions interleaved per dimension pair (AttendBf16Dot's order).
      for (int j = 0; j < n; j += 2) {
        for (int c = 0; c < C; ++c) {
          const __m512i x = _mm512_loadu_si512(vrow[j] + 64 * c);
          const __m512i y = _mm512_loadu_si512(vrow[j + 1] + 64 * c);
          _mm512_storeu_si512(vt + (j / 2) * 2 * C + 2 * c, _mm512_unpacklo_epi16(x, y));
          _mm512_storeu_si512(vt + (j / 2) * 2 * C + 2 * c + 1, _mm512_unpackhi_epi16(x, y));
        }
      }
      // acc = acc * alpha + p @ V, kRowBlock rows at a time, in passes of kPass of a row's 2C
      // accumulators so that they stay in registers (a latent row's 36 would not).
      for (int r0 = 0; r0 < rows; r0 += kRowBlock) {
        for (int c0 = 0; c0 < 2 * C; c0 += kPass) {
          __m512 a[kRowBlock][kPass];
          for (int k = 0; k < kRowBlock; ++k) {
            const __m512 alpha = _mm512_set1_ps(alphas[r0 + k]);
            for (int c = 0; c < kPass; ++c) {
              a[k][c] = _mm512_mul_ps(
                  _mm512_loadu_ps(acc + static_cast<size_t>(r0 + k) * hd + 16 * (c0 + c)), alpha);
            }
          }
          for (int jp = 0; jp < (n + 1) / 2; ++jp) {
            const uint32_t* wj = w + static_cast<size_t>(jp) * padded + r0;
            for (int c = 0; c < kPass; ++c) {
              const __m512bh values = (__m512bh)_mm512_loadu_si512(vt + jp * 2 * C + c0 + c);
              for (int k = 0; k < kRowBlock; ++k) {
                a[k][c] = _mm512_dpbf16_ps(a[k][c], values,
                                           (__m512bh)_mm512_set1_epi32(static_cast<int>(wj[k])));
              }
            }
          }
          for (int k = 0; k < kRowBlock; ++k) {
            for (int c = 0; c < kPass; ++c)
              _mm512_storeu_ps(acc + static_cast<size_t>(r0 + k) * hd + 16 * (c0 + c), a[k][c]);
          }
        }
      }
    }
    // Accumulator lane m of chunk c's low half holds element 32c + 8(m / 4) + m % 4; of its
    // high half, that + 4 (AttendBf16Dot's order).
    for (int r = 0; r < rows; ++r) {
      const int i = r / group;
      const int h = h0 + r % group;
      float* o = out + i * q_dim + static_cast<size_t>(h) * hd;
      const float* ar = acc + static_cast<size_t>(r) * hd;
      const float inverse = running_sum[r] > 0 ? 1.0f / running_sum[r] : 0.0f;
      for (int c = 0; c < C; ++c) {
        for (int e = 0; e < 16; ++e) {
          const int element = 32 * c + 8 * (e / 4) + e % 4;
          o[element] = ar[32 * c + e] * inverse;
          o[element + 4] = ar[32 * c + 16 + e] * inverse;
        }
      }
      if (lse != nullptr) {
        lse[static_cast<size_t>(i) * num_heads + h] =
            running_sum[r] > 0 ? running_max[r] + std::log(running_sum[r]) : -INFINITY;
      }
    }
  }
}

void CausalAttentionBf16Dot(const float* q, int m, int num_heads, const PagedKv& kv,
                            int first_position, int context_begin, int context_end, int window,
                            float scale, float* out, float* lse) {
  const auto run = [&](auto attend) {
    attend(q, m, num_heads, kv, first_position, context_begin, context_end, window, scale, out,
           lse);
  };
  if (kv.dtype == KvDtype::kBf16 || kv.dtype == KvDtype::kInt8) {
    const bool int8 = kv.dtype == KvDtype::kInt8;
    switch (kv.head_dim) {
      case 32:
        return run(int8 ? AttendCausalBf16Dot<1, KvDtype::kInt8>
                        : AttendCausalBf16Dot<1, KvDtype::kBf16>);
      case 64:
        return run(int8 ? AttendCausalBf16Dot<2, KvDtype::kInt8>
                        : AttendCausalBf16Dot<2, KvDtype::kBf16>);
      case 128:
        return run(int8 ? AttendCausalBf16Dot<4, KvDtype::kInt8>
                        : AttendCausalBf16Dot<4, KvDtype::kBf16>);
      case 256:
        return run(int8 ? AttendCausalBf16Dot<8, KvDtype::kInt8>
                        : AttendCausalBf16Dot<8, KvDtype::kBf16>);
      case 512:
        return run(int8 ? AttendCausalBf16Dot<16, KvDtype::kInt8>
                        : AttendCausalBf16Dot<16, KvDtype::kBf16>);
      case kLatentRow:
        return run(int8 ? AttendCausalBf16Dot<kLatentRow / 32, KvDtype::kInt8>
                        : AttendCausalBf16Dot<kLatentRow / 32, KvDtype::kBf16>);
      default:
        break;
    }
  }
  CausalByQuery<PagedAttentionBf16Dot>(q, m, num_heads, kv, first_position, context_begin,
                                       context_end, window, scale, out, lse);
}

using DeltaSimd = Simd512;
#include "common/kernels/cpu/delta_net_impl.h"

#undef TANDEM_INLINE

}  // namespace

const PagedAttentionFn kAvx512Bf16Attention = PagedAttentionBf16Dot;
const CausalAttentionFn kAvx512Bf16CausalAttention = CausalAttentionBf16Dot;

const Backend kAvx512Elementwise = WithStepOps<Softmax, TopK, Axpy>({
    .name = "avx512",
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
#pragma clang attribute pop  // avx512bf16 (clang's regions replace, not nest)
#else
#pragma GCC pop_options  // avx512bf16
#pragma GCC pop_options  // avx512
#endif
