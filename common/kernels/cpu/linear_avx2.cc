// The matrix products over packed weights (common/kernels/packed_matrix.h) on AVX2 + FMA, for
// CPUs without AVX-512: activations stay float32, bf16 weights are widened and int8 / int4
// weights dequantized in registers. Compiled for those instructions with a target pragma;
// kernels.cc calls into this file only after checking the CPU, and every function here has
// internal linkage. As on AVX-512, each output sums its products in the same lanes in the same
// order whatever the batch, the tile and the split across threads.
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
        alignas(32) float scales[kPanelRows];
        _mm256_store_ps(scales, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                    panel + a.w.scale_offset + g * kPanelRows * 2))));
        _mm256_store_ps(scales + 8,
                        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
                            panel + a.w.scale_offset + g * kPanelRows * 2 + 16))));
        __m256 scale[8];
        for (int i = 0; i < 8; ++i) {
          scale[i] = _mm256_setr_m128(_mm_set1_ps(scales[2 * i]), _mm_set1_ps(scales[2 * i + 1]));
        }
        const int chunks = kInt4 ? group / 8 : group / 4;
        for (int c = 0; c < chunks; ++c) {
          const std::byte* chunk = panel + g * group_bytes + static_cast<int64_t>(c) * kChunkBytes;
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

void Linear(const float* x, int b, const PackedMatrix& w, float* y) {
  if (b <= 0 || w.rows <= 0) return;
  const TileArgs a{.x = x, .ldx = w.cols, .y = y, .ldy = w.rows, .w = w};
  ParallelPanels(b, w, 1, [&](int begin, int end) {
    switch (w.format) {
      case WeightFormat::kBf16:
        ForTiles<Bf16Tile, 2>(a, b, begin, end);
        break;
      case WeightFormat::kInt8:
        ForTiles<Int8Tile, 1>(a, b, begin, end);
        break;
      case WeightFormat::kInt4:
        ForTiles<Int4Tile, 1>(a, b, begin, end);
        break;
    }
  });
}

#undef TANDEM_INLINE

}  // namespace

const LinearFn kAvx2Linear = Linear;

}  // namespace tandem::kernels::cpu::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
