// The matrix products over packed weights (common/kernels/packed_matrix.h) on AVX2 + FMA, for
// CPUs without AVX-512: at the avx2 level activations stay float32, bf16 weights are widened
// and int8 / int4 weights dequantized in registers; at avx2int8, int8 / int4 weights meet
// activations quantized to int8 per group in vpmaddubsw, as avx512vnni's meet them in vpdpbusd.
// Compiled for those instructions with a target pragma; kernels.cc calls into this file only after
// checking the CPU, and every function here has internal linkage. As on AVX-512, each output sums
// its products in the same lanes in the same order whatever the batch, the tile and the split
// across threads.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <utility>

#include "common/kernels/cpu/kernels_internal.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace tandem::kernels::cpu::internal {
namespace {

#define TANDEM_INLINE inline __attribute__((always_inline))

struct TileArgs {
  const float* x;
  int64_t ldx;
  float* y;
  int64_t ldy;
  PackedMatrix w;
  // avx2int8: the activations quantized per group (QuantizeRow), rows ldq apart, and
  // their scales and level sums (rows, groups).
  const int8_t* xq = nullptr;
  int64_t ldq = 0;
  const float* xscale = nullptr;
  const int32_t* xsum = nullptr;
};

TANDEM_INLINE const std::byte* Panel(const TileArgs& a, int panel) {
  return a.w.data + panel * a.w.panel_bytes;
}

// Stores 8 outputs of panel `panel` starting at its row `first` (0 or 8), as many as exist.
TANDEM_INLINE void StoreHalf(const TileArgs& a, int m, int panel, int first, __m256 v) {
  const int row = panel * kPanelRows + first;
  const int count = std::clamp(a.w.rows - row, 0, 8);
  if (count == 0) return;
  const __m256i lanes =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  _mm256_maskstore_ps(a.y + m * a.ldy + row, lanes, v);
}

template <template <int> class Tile, int... I>
constexpr auto MakeTileTable(std::integer_sequence<int, I...>) {
  return std::array<void (*)(const TileArgs&, int, int), sizeof...(I)>{&Tile<I + 1>::Run...};
}

// Runs Tile<M> over rows [0, b) in blocks of up to MB and panels [p_begin, p_end) one by one.
template <template <int> class Tile, int MB>
void ForTiles(const TileArgs& a, int b, int p_begin, int p_end) {
  static constexpr auto kTable = MakeTileTable<Tile>(std::make_integer_sequence<int, MB>());
  for (int p = p_begin; p < p_end; ++p) {
    for (int m = 0; m < b; m += MB) kTable[std::min(MB, b - m) - 1](a, m, p);
  }
}

TANDEM_INLINE __m256 WidenBf16(__m128i bits) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// Adjacent lanes of a (rows r..r+3 as pairs) and b (rows r+4..r+7) summed: 8 outputs.
TANDEM_INLINE __m256 SumPairs(__m256 a, __m256 b) {
  return _mm256_castpd_ps(
      _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_hadd_ps(a, b)), _MM_SHUFFLE(3, 1, 2, 0)));
}

// One column pair j of a panel against M rows: a chunk is rows 0-15 x the pair; quarter k
// holds rows 4k..4k+3. With `last_odd` (an odd column prefix) the pair's second column is
// zero, whatever the matrix holds there (even NaN), and x ends at x[2j].
template <int M>
TANDEM_INLINE void Bf16Pair(const TileArgs& a, const std::byte* panel, const float* x, int j,
                            bool last_odd, __m256 (&acc)[M][4]) {
  const __m128i keep = last_odd ? _mm_set1_epi32(0xffff) : _mm_set1_epi32(-1);
  PrefetchAhead(panel + static_cast<int64_t>(j) * kChunkBytes, kWeightPrefetchAhead);
  __m256 wv[4];
  for (int k = 0; k < 4; ++k) {
    wv[k] = WidenBf16(_mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                        panel + static_cast<int64_t>(j) * kChunkBytes + 16 * k)),
                                    keep));
  }
  for (int m = 0; m < M; ++m) {
    double pair;
    if (last_odd) {
      pair = std::bit_cast<double>(uint64_t{std::bit_cast<uint32_t>(x[m * a.ldx + 2 * j])});
    } else {
      std::memcpy(&pair, x + m * a.ldx + 2 * j, sizeof(pair));
    }
    const __m256 xp = _mm256_castpd_ps(_mm256_set1_pd(pair));
    for (int k = 0; k < 4; ++k) acc[m][k] = _mm256_fmadd_ps(wv[k], xp, acc[m][k]);
  }
}

template <int M>
struct Bf16Tile {
  static void Run(const TileArgs& a, int m0, int p) {
    __m256 acc[M][4];
    for (int m = 0; m < M; ++m) {
      for (int k = 0; k < 4; ++k) acc[m][k] = _mm256_setzero_ps();
    }
    const int cols = a.w.cols;
    const std::byte* panel = Panel(a, p);
    const float* x = a.x + m0 * a.ldx;
    for (int j = 0; j < cols / 2; ++j) Bf16Pair<M>(a, panel, x, j, false, acc);
    if (cols % 2 != 0) Bf16Pair<M>(a, panel, x, cols / 2, true, acc);
    for (int m = 0; m < M; ++m) {
      StoreHalf(a, m0 + m, p, 0, SumPairs(acc[m][0], acc[m][1]));
      StoreHalf(a, m0 + m, p, 8, SumPairs(acc[m][2], acc[m][3]));
    }
  }
};

// Quads of lanes summed: a..d hold rows (2i, 2i+1) x 4 columns for i = 0..3; 8 outputs.
TANDEM_INLINE __m256 SumQuads(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// int8 / int4 weights, one activation row: each 8 bytes of a chunk's levels are rows
// (2i, 2i+1) x 4 columns.
template <bool kInt4>
struct IntTileImpl {
  template <int M>
  struct Tile {
    static void Run(const TileArgs& a, int m0, int p) {
      static_assert(M == 1);
      __m256 acc[8];
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
      const int group = a.w.group;
      const int groups = a.w.cols / group;
      const int64_t group_bytes = int64_t{kPanelRows} * group * (kInt4 ? 4 : 8) / 8;
      const std::byte* panel = Panel(a, p);
      const float* x = a.x + m0 * a.ldx;
      const __m256i offset = _mm256_set1_epi32(kInt4 ? 8 : 128);
      alignas(32) uint8_t levels[2][kChunkBytes];
      for (int g = 0; g < groups; ++g) {
        PrefetchScalesAhead(panel, a.w, g);
        alignas(32) float scales[kPanelRows];
        _mm256_store_ps(scales, _mm256_cvtph_ps(_mm_loadu_si128(
                                    reinterpret_cast<const __m128i*>(GroupScales(panel, a.w, g)))));
        _mm256_store_ps(scales + 8,
                        _mm256_cvtph_ps(_mm_loadu_si128(
                            reinterpret_cast<const __m128i*>(GroupScales(panel, a.w, g) + 16))));
        __m256 scale[8];
        for (int i = 0; i < 8; ++i) {
          scale[i] = _mm256_setr_m128(_mm_set1_ps(scales[2 * i]), _mm_set1_ps(scales[2 * i + 1]));
        }
        const int chunks = kInt4 ? group / 8 : group / 4;
        for (int c = 0; c < chunks; ++c) {
          const std::byte* chunk = panel + g * group_bytes + static_cast<int64_t>(c) * kChunkBytes;
          PrefetchAhead(chunk, kWeightPrefetchAhead);
          if constexpr (kInt4) {
            const __m256i mask = _mm256_set1_epi8(0x0f);
            for (int h = 0; h < 2; ++h) {
              const __m256i v =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * h));
              _mm256_store_si256(reinterpret_cast<__m256i*>(levels[0] + 32 * h),
                                 _mm256_and_si256(v, mask));
              _mm256_store_si256(reinterpret_cast<__m256i*>(levels[1] + 32 * h),
                                 _mm256_and_si256(_mm256_srli_epi16(v, 4), mask));
            }
          } else {
            std::memcpy(levels[0], chunk, kChunkBytes);
          }
          for (int half = 0; half < (kInt4 ? 2 : 1); ++half) {
            const int col = g * group + (kInt4 ? 8 * c + 4 * half : 4 * c);
            const __m256 xv = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x + col));
            for (int i = 0; i < 8; ++i) {
              const __m256i q = _mm256_sub_epi32(
                  _mm256_cvtepu8_epi32(
                      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(levels[half] + 8 * i))),
                  offset);
              acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), scale[i]), xv, acc[i]);
            }
          }
        }
      }
      StoreHalf(a, m0, p, 0, SumQuads(acc[0], acc[1], acc[2], acc[3]));
      StoreHalf(a, m0, p, 8, SumQuads(acc[4], acc[5], acc[6], acc[7]));
    }
  };
};
template <int M>
using Int8Tile = IntTileImpl<false>::Tile<M>;
template <int M>
using Int4Tile = IntTileImpl<true>::Tile<M>;

// Panels [begin, end) with float32 activations.
void Panels(const LinearProduct& p, const ActivationScratch&, int begin, int end) {
  const TileArgs a{.x = p.x, .ldx = p.w.cols, .y = p.y, .ldy = p.w.rows, .w = p.w};
  switch (p.w.format) {
    case WeightFormat::kBf16:
      ForTiles<Bf16Tile, 2>(a, p.b, begin, end);
      break;
    case WeightFormat::kInt8:
      ForTiles<Int8Tile, 1>(a, p.b, begin, end);
      break;
    case WeightFormat::kInt4:
      ForTiles<Int4Tile, 1>(a, p.b, begin, end);
      break;
  }
}

// ---- avx2int8: int8 activations for int8 / int4 weights (vpmaddubsw) ----
// Per group and panel, the integer sums of q_w * q_x for the panel's 16 rows in two registers
// (rows 0-7 and 8-15: a chunk's 32-bit lane is one row's 4 columns), then scaled by (weight
// scale) x (activation scale) into float32. vpmaddubsw multiplies unsigned by signed bytes and
// adds pairs into 16 bits with saturation, so: int4 levels (q + 8, 0..15) meet q_x as they are
// (a pair at most 2 x 15 x 127), the offset taken out by starting at -8 sum(q_x); int8 levels
// (q + 128) become q, and |q| meets q_x with q's sign (a pair at most 2 x 127 x 127 < 2^15).
// The sums are exact, so an output does not depend on the batch, the tile or the threads.

TANDEM_INLINE __m256i BroadcastQuad(const int8_t* q) {
  int32_t quad;
  std::memcpy(&quad, q, 4);
  return _mm256_set1_epi32(quad);
}

// M activation rows against Q consecutive panels.
template <int M, int Q, bool kInt4>
struct QuantizedTile {
  static void Run(const TileArgs& a, int m0, int p0) {
    __m256 acc[M][Q][2];
    for (int m = 0; m < M; ++m) {
      for (int q = 0; q < Q; ++q) acc[m][q][0] = acc[m][q][1] = _mm256_setzero_ps();
    }
    const int group = a.w.group;
    const int groups = a.w.cols / group;
    const int64_t group_bytes = int64_t{kPanelRows} * group * (kInt4 ? 4 : 8) / 8;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i nibbles = _mm256_set1_epi8(0x0f);
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int g = 0; g < groups; ++g) {
      __m256i sums[M][Q][2];
      for (int m = 0; m < M; ++m) {
        const __m256i start =
            _mm256_set1_epi32(kInt4 ? -8 * a.xsum[int64_t{m0 + m} * groups + g] : 0);
        for (int q = 0; q < Q; ++q) sums[m][q][0] = sums[m][q][1] = start;
      }
      const int8_t* xg = a.xq + int64_t{m0} * a.ldq + int64_t{g} * group;
      for (int q = 0; q < Q; ++q) {
        PrefetchScalesAhead(Panel(a, p0 + q), a.w, g);
      }
      if constexpr (kInt4) {
        for (int c = 0; c < group / 8; ++c) {
          __m256i lo[Q][2], hi[Q][2];
          for (int q = 0; q < Q; ++q) {
            const std::byte* chunk =
                Panel(a, p0 + q) + g * group_bytes + static_cast<int64_t>(c) * kChunkBytes;
            PrefetchAhead(chunk, kWeightPrefetchAhead);
            for (int h = 0; h < 2; ++h) {
              const __m256i v =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * h));
              lo[q][h] = _mm256_and_si256(v, nibbles);
              hi[q][h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibbles);
            }
          }
          for (int m = 0; m < M; ++m) {
            const __m256i xl = BroadcastQuad(xg + m * a.ldq + 8 * c);
            const __m256i xh = BroadcastQuad(xg + m * a.ldq + 8 * c + 4);
            for (int q = 0; q < Q; ++q) {
              for (int h = 0; h < 2; ++h) {
                const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo[q][h], xl),
                                                       _mm256_maddubs_epi16(hi[q][h], xh));
                sums[m][q][h] = _mm256_add_epi32(sums[m][q][h], _mm256_madd_epi16(pairs, ones));
              }
            }
          }
        }
      } else {
        for (int c = 0; c < group / 4; ++c) {
          __m256i level[Q][2], magnitude[Q][2];
          for (int q = 0; q < Q; ++q) {
            const std::byte* chunk =
                Panel(a, p0 + q) + g * group_bytes + static_cast<int64_t>(c) * kChunkBytes;
            PrefetchAhead(chunk, kWeightPrefetchAhead);
            for (int h = 0; h < 2; ++h) {
              level[q][h] = _mm256_xor_si256(
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * h)), flip);
              magnitude[q][h] = _mm256_abs_epi8(level[q][h]);
            }
          }
          for (int m = 0; m < M; ++m) {
            const __m256i xv = BroadcastQuad(xg + m * a.ldq + 4 * c);
            for (int q = 0; q < Q; ++q) {
              for (int h = 0; h < 2; ++h) {
                const __m256i pairs =
                    _mm256_maddubs_epi16(magnitude[q][h], _mm256_sign_epi8(xv, level[q][h]));
                sums[m][q][h] = _mm256_add_epi32(sums[m][q][h], _mm256_madd_epi16(pairs, ones));
              }
            }
          }
        }
      }
      for (int q = 0; q < Q; ++q) {
        const std::byte* scales = GroupScales(Panel(a, p0 + q), a.w, g);
        __m256 scale[2];
        for (int h = 0; h < 2; ++h) {
          scale[h] =
              _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 16 * h)));
        }
        for (int m = 0; m < M; ++m) {
          const __m256 xs = _mm256_set1_ps(a.xscale[int64_t{m0 + m} * groups + g]);
          for (int h = 0; h < 2; ++h) {
            acc[m][q][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[m][q][h]),
                                           _mm256_mul_ps(scale[h], xs), acc[m][q][h]);
          }
        }
      }
    }
    for (int m = 0; m < M; ++m) {
      for (int q = 0; q < Q; ++q) {
        StoreHalf(a, m0 + m, p0 + q, 0, acc[m][q][0]);
        StoreHalf(a, m0 + m, p0 + q, 8, acc[m][q][1]);
      }
    }
  }
};

template <bool kInt4, int Q>
struct QuantizedPanels {
  template <int M>
  using Tile = QuantizedTile<M, Q, kInt4>;
};

// Panels [begin, end) two at a time (the last alone), activation rows two at a time.
template <bool kInt4>
void QuantizedTiles(const TileArgs& a, int b, int begin, int end) {
  static constexpr auto kPairs =
      MakeTileTable<QuantizedPanels<kInt4, 2>::template Tile>(std::make_integer_sequence<int, 2>());
  static constexpr auto kSingles =
      MakeTileTable<QuantizedPanels<kInt4, 1>::template Tile>(std::make_integer_sequence<int, 2>());
  int p = begin;
  for (; p + 2 <= end; p += 2) {
    for (int m = 0; m < b; m += 2) kPairs[std::min(2, b - m) - 1](a, m, p);
  }
  for (; p < end; ++p) {
    for (int m = 0; m < b; m += 2) kSingles[std::min(2, b - m) - 1](a, m, p);
  }
}

// One activation row quantized per group of `group` columns (a multiple of 8), exactly as
// QuantizeActivations does: q (cols,), scales and sums (cols / group,).
void QuantizeRow(const float* x, int cols, int group, int8_t* q, float* scales, int32_t* sums) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int g = 0; g < cols / group; ++g) {
    const float* v = x + int64_t{g} * group;
    __m256 amax8 = _mm256_setzero_ps();
    for (int i = 0; i < group; i += 8) {
      amax8 = _mm256_max_ps(amax8, _mm256_and_ps(_mm256_loadu_ps(v + i), magnitude));
    }
    __m128 amax4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    amax4 = _mm_max_ps(amax4, _mm_movehl_ps(amax4, amax4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(amax4, _mm_movehdup_ps(amax4)));
    const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    __m256i sum = _mm256_setzero_si256();
    for (int i = 0; i < group; i += 8) {
      // Round to nearest even (the default MXCSR mode), as std::nearbyint does.
      __m256i level = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), inv));
      level = _mm256_max_epi32(_mm256_set1_epi32(-127),
                               _mm256_min_epi32(_mm256_set1_epi32(127), level));
      sum = _mm256_add_epi32(sum, level);
      const __m128i words =
          _mm_packs_epi32(_mm256_castsi256_si128(level), _mm256_extracti128_si256(level, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + int64_t{g} * group + i),
                       _mm_packs_epi16(words, words));
    }
    scales[g] = amax / 127.0f;
    __m128i total = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0x4E));
    total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0xB1));
    sums[g] = _mm_cvtsi128_si32(total);
  }
}

// int8 / int4 weights: each activation row quantized per group; bf16 weights read float32.
void QuantizeRows(const float* x, int b, const PackedMatrix& w, ActivationScratch& s) {
  QuantizeRowsWith(QuantizeRow, x, b, w, s);
}

void QuantizedPanelRange(const LinearProduct& p, const ActivationScratch& s, int begin, int end) {
  if (p.w.format == WeightFormat::kBf16) {
    Panels(p, s, begin, end);
    return;
  }
  const TileArgs a{.x = p.x,
                   .ldx = p.w.cols,
                   .y = p.y,
                   .ldy = p.w.rows,
                   .w = p.w,
                   .xq = s.q.data(),
                   .ldq = p.w.cols,
                   .xscale = s.scales.data(),
                   .xsum = s.sums.data()};
  if (p.w.format == WeightFormat::kInt4) {
    QuantizedTiles<true>(a, p.b, begin, end);
  } else {
    QuantizedTiles<false>(a, p.b, begin, end);
  }
}

#undef TANDEM_INLINE

}  // namespace

const LinearKernel kAvx2Linear{
    .prepare = nullptr,
    .panels = Panels,
    .panel_align = [](int, const PackedMatrix&) { return 1; },
};
const LinearKernel kAvx2Int8Linear{
    .prepare = QuantizeRows,
    .panels = QuantizedPanelRange,
    .panel_align = [](int,
                      const PackedMatrix& w) { return w.format == WeightFormat::kBf16 ? 1 : 2; },
};

}  // namespace tandem::kernels::cpu::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
