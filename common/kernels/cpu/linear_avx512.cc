// The matrix products over packed weights (common/kernels/packed_matrix.h) on AVX-512, at three
// levels, each compiled for its instructions with a target pragma (kernels.cc calls into this
// file only after checking the CPU; every function here has internal linkage, so the linker
// cannot pick a copy built here for code that runs on older CPUs):
//   avx512      (F, BW, VL, DQ) activations stay float32: bf16 weights are widened and int8 /
//               int4 weights dequantized in registers, then multiplied by float32 FMAs.
//   avx512vnni  int8 / int4 weights meet activations quantized to int8 per group in vpdpbusd
//               (4 byte products per lane); bf16 weights as at avx512.
//   avx512bf16  bf16 weights meet activations rounded to bf16 in vdpbf16ps (2 products per
//               lane, twice the float32 rate); int8 / int4 as at avx512vnni.
// The panel layout puts 16 output rows in the lanes of a vector, so every kernel is an outer
// product: a weight chunk is loaded once for a tile of activation rows, each activation value
// is broadcast, and nothing is summed across lanes (the avx512 level's pairs and quads aside).
// Each output accumulates its products in the same lanes in the same order whatever the tile,
// the batch and the split across threads, so a row's result does not depend on the others.

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <utility>

#include "common/kernels/cpu/intrinsics.h"
#include "common/kernels/cpu/kernels_internal.h"

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

// What every tile needs: activations x (b, ldx), outputs y (b, ldy = w.rows), the weights.
struct TileArgs {
  const float* x;
  int64_t ldx;
  float* y;
  int64_t ldy;
  PackedMatrix w;
  // Activations as the reduced-precision kernels read them: bf16 (b, ldh) or int8 (b, ldh)
  // with per-group scales and sums (b, groups).
  const uint16_t* xh = nullptr;
  const int8_t* xq = nullptr;
  int64_t ldh = 0;
  const float* xscale = nullptr;
  const int32_t* xsum = nullptr;
};

// Stores the 16 outputs of panel p0 + q for row m, as many as the matrix has.
TANDEM_INLINE void StorePanel(const TileArgs& a, int m, int panel, __m512 v) {
  const int first = panel * kPanelRows;
  const int count = std::min(kPanelRows, a.w.rows - first);
  _mm512_mask_storeu_ps(a.y + m * a.ldy + first, static_cast<__mmask16>((1u << count) - 1u), v);
}

TANDEM_INLINE const std::byte* Panel(const TileArgs& a, int panel) {
  return a.w.data + panel * a.w.panel_bytes;
}

template <template <int, int> class Tile, int NP, int... I>
constexpr auto MakeTileTable(std::integer_sequence<int, I...>) {
  return std::array<void (*)(const TileArgs&, int, int), sizeof...(I)>{
      &Tile<I / NP + 1, I % NP + 1>::Run...};
}

// Runs Tile<M, Q> over rows [0, b) in blocks of up to MB rows and panels [p_begin, p_end) in
// blocks of up to NP panels. The row loop is inside the panel loop: a panel block stays in
// cache while every row block passes over it. Row blocks are as even as they can be (16 rows
// in two blocks of 8, not 12 and 4): a short block loads the same weights for fewer products.
template <template <int, int> class Tile, int MB, int NP>
void ForTiles(const TileArgs& a, int b, int p_begin, int p_end) {
  static constexpr auto kTable =
      MakeTileTable<Tile, NP>(std::make_integer_sequence<int, MB * NP>());
  const int blocks = (b + MB - 1) / MB;
  const int rows = (b + blocks - 1) / blocks;
  for (int p = p_begin; p < p_end; p += NP) {
    const int q = std::min(NP, p_end - p);
    for (int m = 0; m < b; m += rows) kTable[(std::min(rows, b - m) - 1) * NP + (q - 1)](a, m, p);
  }
}

// ---- avx512: float32 activations ----

// 16 bf16 values (8 rows x a column pair) widened to float32.
TANDEM_INLINE __m512 WidenBf16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// A chunk of bf16 column pairs; with `first_only`, the second column of each pair zeroed (an odd
// column prefix: the column after it may hold anything, even NaN).
TANDEM_INLINE __m512i LoadChunk(const std::byte* chunk, bool first_only) {
  const __m512i v = _mm512_loadu_si512(chunk);
  return first_only ? _mm512_and_si512(v, _mm512_set1_epi32(0xffff)) : v;
}

// x[c], x[c + 1] in every pair of lanes (x[c + 1] = 0 when `last_odd`: x may end at x[c]).
TANDEM_INLINE __m512 BroadcastPair(const float* x, bool last_odd) {
  if (last_odd)
    return _mm512_castpd_ps(
        _mm512_set1_pd(std::bit_cast<double>(uint64_t{std::bit_cast<uint32_t>(x[0])})));
  double pair;
  std::memcpy(&pair, x, sizeof(pair));
  return _mm512_castpd_ps(_mm512_set1_pd(pair));
}

// Lanes 2i and 2i + 1 of lo (rows 0-7) and hi (rows 8-15) summed: the panel's 16 outputs.
TANDEM_INLINE __m512 SumPairs(__m512 lo, __m512 hi) {
  const __m512 l = _mm512_add_ps(lo, _mm512_permute_ps(lo, 0xB1));
  const __m512 h = _mm512_add_ps(hi, _mm512_permute_ps(hi, 0xB1));
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  return _mm512_permutex2var_ps(l, even, h);
}

// One column pair j of Q panels against M rows: lo/hi += widened weights * (x[2j], x[2j+1]).
template <int M, int Q>
TANDEM_INLINE void Bf16F32Pair(const TileArgs& a, const float* x, int p0, int j, bool last_odd,
                               __m512 (&lo)[M][Q], __m512 (&hi)[M][Q]) {
  __m512 wl[Q], wh[Q];
#pragma GCC unroll 4
  for (int q = 0; q < Q; ++q) {
    const std::byte* chunk = Panel(a, p0 + q) + static_cast<int64_t>(j) * kChunkBytes;
    const __m512i v = LoadChunk(chunk, last_odd);
    PrefetchAhead(chunk, kWeightPrefetchAhead);
    wl[q] = WidenBf16(_mm512_castsi512_si256(v));
    wh[q] = WidenBf16(_mm512_extracti64x4_epi64(v, 1));
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
    const __m512 xp = BroadcastPair(x + m * a.ldx + 2 * j, last_odd);
#pragma GCC unroll 4
    for (int q = 0; q < Q; ++q) {
      lo[m][q] = _mm512_fmadd_ps(wl[q], xp, lo[m][q]);
      hi[m][q] = _mm512_fmadd_ps(wh[q], xp, hi[m][q]);
    }
  }
}

template <int M, int Q>
struct Bf16F32Tile {
  static void Run(const TileArgs& a, int m0, int p0) {
    __m512 lo[M][Q], hi[M][Q];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q) lo[m][q] = hi[m][q] = _mm512_setzero_ps();
    }
    const int cols = a.w.cols;
    const float* x = a.x + m0 * a.ldx;
    for (int j = 0; j < cols / 2; ++j) Bf16F32Pair<M, Q>(a, x, p0, j, false, lo, hi);
    if (cols % 2 != 0) Bf16F32Pair<M, Q>(a, x, p0, cols / 2, true, lo, hi);
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q) StorePanel(a, m0 + m, p0 + q, SumPairs(lo[m][q], hi[m][q]));
    }
  }
};

// The four quarters of a 64-byte int8 chunk (rows 4a..4a+3 x 4 columns) as float32 levels.
TANDEM_INLINE __m512 QuarterLevels(__m512i chunk, int quarter, __m512i offset) {
  __m128i bytes;
  switch (quarter) {
    case 0:
      bytes = _mm512_extracti32x4_epi32(chunk, 0);
      break;
    case 1:
      bytes = _mm512_extracti32x4_epi32(chunk, 1);
      break;
    case 2:
      bytes = _mm512_extracti32x4_epi32(chunk, 2);
      break;
    default:
      bytes = _mm512_extracti32x4_epi32(chunk, 3);
      break;
  }
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(bytes), offset));
}

// Sum of each 4 consecutive lanes of v0..v3 (lanes 4r..4r+3 of v_a: row 4a + r): 16 outputs.
// Every lane of each quad of v: the quad's sum.
TANDEM_INLINE __m512 FoldQuads(__m512 v) {
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
  return _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
}

TANDEM_INLINE __m512 SumQuads(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
  const __m512i firsts =
      _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
  const __m512 a01 = _mm512_permutex2var_ps(FoldQuads(v0), firsts, FoldQuads(v1));
  const __m512 a23 = _mm512_permutex2var_ps(FoldQuads(v2), firsts, FoldQuads(v3));
  return _mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(1, 0, 1, 0));
}

// int8 or int4 weights dequantized in registers, float32 activations. A 64-byte chunk of int8
// holds rows 0-15 x 4 columns; lanes of quarter a are (row 4a + l/4, column l%4).
template <int M, int Q, bool kInt4>
struct IntF32TileImpl {
  static void Run(const TileArgs& a, int m0, int p0) {
    __m512 acc[M][Q][4];
    for (int m = 0; m < M; ++m) {
      for (int q = 0; q < Q; ++q) {
        for (int k = 0; k < 4; ++k) acc[m][q][k] = _mm512_setzero_ps();
      }
    }
    const int group = a.w.group;
    const int groups = a.w.cols / group;
    const int64_t group_bytes = int64_t{kPanelRows} * group * (kInt4 ? 4 : 8) / 8;
    const __m512i offset = _mm512_set1_epi32(kInt4 ? 8 : 128);
    const __m512i nibbles = _mm512_set1_epi8(0x0f);
    const float* x = a.x + m0 * a.ldx;
    for (int g = 0; g < groups; ++g) {
      __m512 scale[Q][4];
      for (int q = 0; q < Q; ++q) {
        PrefetchScalesAhead(Panel(a, p0 + q), a.w, g);
        const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(GroupScales(Panel(a, p0 + q), a.w, g))));
        for (int k = 0; k < 4; ++k) {
          const __m512i idx = _mm512_add_epi32(
              _mm512_set1_epi32(4 * k),
              _mm512_srli_epi32(
                  _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2));
          scale[q][k] = _mm512_permutexvar_ps(idx, s);
        }
      }
      const int chunks = kInt4 ? group / 8 : group / 4;
      for (int c = 0; c < chunks; ++c) {
        for (int half = 0; half < (kInt4 ? 2 : 1); ++half) {
          const int col = g * group + (kInt4 ? 8 * c + 4 * half : 4 * c);
          __m512 wq[Q][4];
          for (int q = 0; q < Q; ++q) {
            const std::byte* chunk =
                Panel(a, p0 + q) + g * group_bytes + static_cast<int64_t>(c) * kChunkBytes;
            __m512i v = _mm512_loadu_si512(chunk);
            if (half == 0) PrefetchAhead(chunk, kWeightPrefetchAhead);
            if constexpr (kInt4) {
              v = half == 0 ? _mm512_and_si512(v, nibbles)
                            : _mm512_and_si512(_mm512_srli_epi16(v, 4), nibbles);
            }
            for (int k = 0; k < 4; ++k) {
              wq[q][k] = _mm512_mul_ps(QuarterLevels(v, k, offset), scale[q][k]);
            }
          }
          for (int m = 0; m < M; ++m) {
            const __m512 xv = _mm512_broadcast_f32x4(_mm_loadu_ps(x + m * a.ldx + col));
            for (int q = 0; q < Q; ++q) {
              for (int k = 0; k < 4; ++k)
                acc[m][q][k] = _mm512_fmadd_ps(wq[q][k], xv, acc[m][q][k]);
            }
          }
        }
      }
    }
    for (int m = 0; m < M; ++m) {
      for (int q = 0; q < Q; ++q) {
        StorePanel(a, m0 + m, p0 + q,
                   SumQuads(acc[m][q][0], acc[m][q][1], acc[m][q][2], acc[m][q][3]));
      }
    }
  }
};
template <int M, int Q>
using Int8F32Tile = IntF32TileImpl<M, Q, false>;
template <int M, int Q>
using Int4F32Tile = IntF32TileImpl<M, Q, true>;

// Panels [begin, end) with float32 activations (the avx512 level, and bf16 weights at
// avx512vnni).
void F32Panels(const LinearProduct& p, const ActivationScratch&, int begin, int end) {
  const TileArgs a{.x = p.x, .ldx = p.w.cols, .y = p.y, .ldy = p.w.rows, .w = p.w};
  switch (p.w.format) {
    case WeightFormat::kBf16:
      if (p.b == 1) {
        ForTiles<Bf16F32Tile, 1, 2>(a, p.b, begin, end);
      } else {
        ForTiles<Bf16F32Tile, 4, 2>(a, p.b, begin, end);
      }
      break;
    case WeightFormat::kInt8:
      ForTiles<Int8F32Tile, 4, 1>(a, p.b, begin, end);
      break;
    case WeightFormat::kInt4:
      ForTiles<Int4F32Tile, 4, 1>(a, p.b, begin, end);
      break;
  }
}

// Activations quantized per group of `group` columns, exactly as QuantizeActivations does:
// q (cols,), scales and sums (cols / group,).
void QuantizeRow(const float* x, int cols, int group, int8_t* q, float* scales, int32_t* sums) {
  const __m512 sign_off = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int g = 0; g < cols / group; ++g) {
    const float* v = x + int64_t{g} * group;
    __m512 amax_v = _mm512_setzero_ps();
    for (int i = 0; i < group; i += 16) {
      amax_v = _mm512_max_ps(amax_v, _mm512_and_ps(_mm512_loadu_ps(v + i), sign_off));
    }
    const float amax = _mm512_reduce_max_ps(amax_v);
    const __m512 inv = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    __m512i sum = _mm512_setzero_si512();
    for (int i = 0; i < group; i += 16) {
      // Round to nearest even (the default MXCSR mode), as std::nearbyint does.
      __m512i level = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + i), inv));
      level = _mm512_max_epi32(_mm512_set1_epi32(-127),
                               _mm512_min_epi32(_mm512_set1_epi32(127), level));
      sum = _mm512_add_epi32(sum, level);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + int64_t{g} * group + i),
                       _mm512_cvtepi32_epi8(level));
    }
    scales[g] = amax / 127.0f;
    sums[g] = _mm512_reduce_add_epi32(sum);
  }
}

// ---- avx512vnni: int8 activations for int8 / int4 weights ----
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(                                                     \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")
#endif

TANDEM_INLINE __m512i BroadcastQuad(const int8_t* q) {
  int32_t quad;
  std::memcpy(&quad, q, 4);
  return _mm512_set1_epi32(quad);
}

// Per group: integer sums of (q_w + offset) * q_x in vpdpbusd, started at -offset * sum(q_x) so
// that they end as sum(q_w * q_x); then scaled by (weight scale) * (activation scale) into a
// float32 accumulator.
template <int M, int Q, bool kInt4>
struct VnniTileImpl {
  static void Run(const TileArgs& a, int m0, int p0) {
    __m512 acc[M][Q];
    for (int m = 0; m < M; ++m) {
      for (int q = 0; q < Q; ++q) acc[m][q] = _mm512_setzero_ps();
    }
    const int group = a.w.group;
    const int groups = a.w.cols / group;
    const int64_t group_bytes = int64_t{kPanelRows} * group * (kInt4 ? 4 : 8) / 8;
    const int offset = kInt4 ? 8 : 128;
    const __m512i nibbles = _mm512_set1_epi8(0x0f);
    for (int g = 0; g < groups; ++g) {
      __m512i sums[M][Q];
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) {
        const __m512i start = _mm512_set1_epi32(-offset * a.xsum[(m0 + m) * groups + g]);
#pragma GCC unroll 4
        for (int q = 0; q < Q; ++q) sums[m][q] = start;
      }
      const int8_t* xg = a.xq + m0 * a.ldh + g * group;
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q) {
        PrefetchScalesAhead(Panel(a, p0 + q), a.w, g);
      }
      if constexpr (kInt4) {
        for (int c = 0; c < group / 8; ++c) {
          __m512i lo[Q], hi[Q];
#pragma GCC unroll 4
          for (int q = 0; q < Q; ++q) {
            const std::byte* chunk =
                Panel(a, p0 + q) + g * group_bytes + static_cast<int64_t>(c) * kChunkBytes;
            const __m512i v = _mm512_loadu_si512(chunk);
            PrefetchAhead(chunk, kWeightPrefetchAhead);
            lo[q] = _mm512_and_si512(v, nibbles);
            hi[q] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibbles);
          }
#pragma GCC unroll 16
          for (int m = 0; m < M; ++m) {
            const __m512i xl = BroadcastQuad(xg + m * a.ldh + 8 * c);
            const __m512i xh = BroadcastQuad(xg + m * a.ldh + 8 * c + 4);
#pragma GCC unroll 4
            for (int q = 0; q < Q; ++q) {
              sums[m][q] = _mm512_dpbusd_epi32(sums[m][q], lo[q], xl);
              sums[m][q] = _mm512_dpbusd_epi32(sums[m][q], hi[q], xh);
            }
          }
        }
      } else {
        for (int c = 0; c < group / 4; ++c) {
          __m512i wv[Q];
#pragma GCC unroll 4
          for (int q = 0; q < Q; ++q) {
            const std::byte* chunk =
                Panel(a, p0 + q) + g * group_bytes + static_cast<int64_t>(c) * kChunkBytes;
            wv[q] = _mm512_loadu_si512(chunk);
            PrefetchAhead(chunk, kWeightPrefetchAhead);
          }
#pragma GCC unroll 16
          for (int m = 0; m < M; ++m) {
            const __m512i xv = BroadcastQuad(xg + m * a.ldh + 4 * c);
#pragma GCC unroll 4
            for (int q = 0; q < Q; ++q) sums[m][q] = _mm512_dpbusd_epi32(sums[m][q], wv[q], xv);
          }
        }
      }
      __m512 scale[Q];
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q) {
        scale[q] = _mm512_cvtph_ps(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(GroupScales(Panel(a, p0 + q), a.w, g))));
      }
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) {
        const __m512 xs = _mm512_set1_ps(a.xscale[(m0 + m) * groups + g]);
#pragma GCC unroll 4
        for (int q = 0; q < Q; ++q) {
          acc[m][q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[m][q]), _mm512_mul_ps(scale[q], xs),
                                      acc[m][q]);
        }
      }
    }
    for (int m = 0; m < M; ++m) {
      for (int q = 0; q < Q; ++q) StorePanel(a, m0 + m, p0 + q, acc[m][q]);
    }
  }
};
template <int M, int Q>
using Int8VnniTile = VnniTileImpl<M, Q, false>;
template <int M, int Q>
using Int4VnniTile = VnniTileImpl<M, Q, true>;

// int8 / int4 weights: activation rows quantized per group (bf16 weights: nothing here).
void QuantizeRows(const float* x, int b, const PackedMatrix& w, ActivationScratch& s) {
  QuantizeRowsWith(QuantizeRow, x, b, w, s);
}

// int8 / int4 panels [begin, end) against quantized rows q (b, ldh), their scales and sums.
void QuantizedPanelsOf(const LinearProduct& p, const int8_t* q, int64_t ldh, const float* scales,
                       const int32_t* sums, int begin, int end) {
  const TileArgs a{.x = p.x,
                   .ldx = p.w.cols,
                   .y = p.y,
                   .ldy = p.w.rows,
                   .w = p.w,
                   .xq = q,
                   .ldh = ldh,
                   .xscale = scales,
                   .xsum = sums};
  const bool int4 = p.w.format == WeightFormat::kInt4;
  if (p.b == 1) {
    if (int4) {
      ForTiles<Int4VnniTile, 1, 4>(a, p.b, begin, end);
    } else {
      ForTiles<Int8VnniTile, 1, 4>(a, p.b, begin, end);
    }
  } else if (int4) {
    ForTiles<Int4VnniTile, 4, 2>(a, p.b, begin, end);
  } else {
    ForTiles<Int8VnniTile, 4, 2>(a, p.b, begin, end);
  }
}

void QuantizedPanels(const LinearProduct& p, const ActivationScratch& s, int begin, int end) {
  QuantizedPanelsOf(p, s.q.data(), p.w.cols, s.scales.data(), s.sums.data(), begin, end);
}

void VnniPanels(const LinearProduct& p, const ActivationScratch& s, int begin, int end) {
  if (p.w.format == WeightFormat::kBf16) {
    F32Panels(p, s, begin, end);
  } else {
    QuantizedPanels(p, s, begin, end);
  }
}

// ---- avx512bf16: bf16 activations for bf16 weights ----
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(                                                                \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,fma"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,fma")
#endif

// Column pair j of Q panels against M rows of bf16 activations.
template <int M, int Q>
TANDEM_INLINE void Bf16DpPair(const TileArgs& a, const uint16_t* x, int p0, int j, bool last_odd,
                              __m512 (&acc)[M][Q]) {
  __m512bh wv[Q];
#pragma GCC unroll 4
  for (int q = 0; q < Q; ++q) {
    const std::byte* chunk = Panel(a, p0 + q) + static_cast<int64_t>(j) * kChunkBytes;
    wv[q] = (__m512bh)LoadChunk(chunk, last_odd);
    PrefetchAhead(chunk, kWeightPrefetchAhead);
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
    int32_t pair;
    std::memcpy(&pair, x + m * a.ldh + 2 * j, 4);
    const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
    for (int q = 0; q < Q; ++q) acc[m][q] = _mm512_dpbf16_ps(acc[m][q], wv[q], xv);
  }
}

template <int M, int Q>
struct Bf16DpTile {
  static void Run(const TileArgs& a, int m0, int p0) {
    __m512 acc[M][Q];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q) acc[m][q] = _mm512_setzero_ps();
    }
    const int cols = a.w.cols;
    const uint16_t* x = a.xh + m0 * a.ldh;
    for (int j = 0; j < cols / 2; ++j) Bf16DpPair<M, Q>(a, x, p0, j, false, acc);
    if (cols % 2 != 0) Bf16DpPair<M, Q>(a, x, p0, cols / 2, true, acc);
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q) StorePanel(a, m0 + m, p0 + q, acc[m][q]);
    }
  }
};

// x (cols,) rounded to bf16 into out (ld >= cols rounded up to even), zero-padded.
TANDEM_INLINE void RoundRowToBf16(const float* x, int cols, uint16_t* out) {
  int i = 0;
  for (; i + 32 <= cols; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(out + i, (__m512i)v);
  }
  for (; i < cols; ++i) out[i] = F32ToBf16Bits(x[i]);
  if (cols % 2 != 0) out[cols] = 0;
}

// bf16 weights: activation rows rounded to bf16; int8 / int4: quantized as at avx512vnni.
void RoundRows(const float* x, int b, const PackedMatrix& w, ActivationScratch& s) {
  if (w.format != WeightFormat::kBf16) {
    QuantizeRows(x, b, w, s);
    return;
  }
  const int ldh = (w.cols + 1) / 2 * 2;
  s.bf16.resize(static_cast<size_t>(b) * ldh);
  for (int m = 0; m < b; ++m) {
    RoundRowToBf16(x + int64_t{m} * w.cols, w.cols, s.bf16.data() + int64_t{m} * ldh);
  }
}

void Bf16DpPanels(const LinearProduct& p, const ActivationScratch& s, int begin, int end) {
  if (p.w.format != WeightFormat::kBf16) {
    QuantizedPanels(p, s, begin, end);
    return;
  }
  const TileArgs a{.x = p.x,
                   .ldx = p.w.cols,
                   .y = p.y,
                   .ldy = p.w.rows,
                   .w = p.w,
                   .xh = s.bf16.data(),
                   .ldh = (p.w.cols + 1) / 2 * 2};
  if (p.b == 1) {
    ForTiles<Bf16DpTile, 1, 4>(a, p.b, begin, end);
  } else {
    ForTiles<Bf16DpTile, 12, 2>(a, p.b, begin, end);
  }
}

#undef TANDEM_INLINE

}  // namespace

void Avx512QuantizeRow(const float* x, int cols, int group, int8_t* q, float* scales,
                       int32_t* sums) {
  QuantizeRow(x, cols, group, q, scales, sums);
}
void Avx512Bf16RoundRow(const float* x, int cols, uint16_t* out) { RoundRowToBf16(x, cols, out); }
void Avx512VnniPanels(const LinearProduct& p, const int8_t* q, int64_t ldh, const float* scales,
                      const int32_t* sums, int begin, int end) {
  QuantizedPanelsOf(p, q, ldh, scales, sums, begin, end);
}
int Avx512VnniPanelAlign(int b) { return b == 1 ? 4 : 2; }

const LinearKernel kAvx512Linear{
    .prepare = nullptr,
    .panels = F32Panels,
    .panel_align = [](int, const PackedMatrix&) { return 2; },
};
const LinearKernel kAvx512VnniLinear{
    .prepare = QuantizeRows,
    .panels = VnniPanels,
    .panel_align =
        [](int b, const PackedMatrix& w) {
          return w.format == WeightFormat::kBf16 ? 2 : Avx512VnniPanelAlign(b);
        },
};
const LinearKernel kAvx512Bf16Linear{
    .prepare = RoundRows,
    .panels = Bf16DpPanels,
    .panel_align = [](int b, const PackedMatrix&) { return b == 1 ? 4 : 2; },
};

}  // namespace tandem::kernels::cpu::internal

#if defined(__clang__)
#pragma clang attribute pop  // avx512bf16 (clang's regions replace, not nest)
#else
#pragma GCC pop_options  // avx512bf16
#pragma GCC pop_options  // avx512vnni
#pragma GCC pop_options  // avx512
#endif
