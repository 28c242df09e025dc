// The matrix products over packed weights on AMX tiles (Intel Sapphire Rapids and later): bf16
// weights against bf16 activations in TDPBF16PS, int8 / int4 weights against int8 activations
// in TDPBSSD. The panel layout is already the tiles' layout: 16 consecutive 64-byte chunks of a
// panel (32 bf16 columns, or 64 int8 columns) are one B tile, loaded with a 64-byte stride; a
// quantized group's chunks are first made signed int8 (int4 unpacked) into such rows.
// Activations are laid out once per product in a zero-padded buffer of whole 16-row A tiles.
//
// Compiled for AMX and AVX-512 with a target pragma; kernels.cc calls into it only after CPUID
// says the CPU has AMX-TILE, AMX-BF16 and AMX-INT8 and Linux has granted this process the tile
// data (arch_prctl ARCH_REQ_XCOMP_PERM). The same kernels are also instantiated over a software
// model of the tile instructions (EmulatedTiles, after the Intel SDM's pseudo-code), so that
// machines without AMX test the blocking, the layout and the dequantization around them:
// AmxEmulatedLinearForTesting.
//
// Every output accumulates in the same order whatever the batch: a C tile element depends only
// on its A row and B column, and groups are folded into float32 in group order.

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/kernels/cpu/amx_tiles.h"
#include "common/kernels/cpu/intrinsics.h"
#include "common/kernels/cpu/kernels_internal.h"

#if defined(__clang__)
#pragma clang attribute push(                                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,fma,amx-tile," \
                          "amx-int8,amx-bf16"))),                                                  \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target( \
    "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,fma,amx-tile,amx-int8,amx-bf16")
#endif

namespace tandem::kernels::cpu::internal {
namespace {

#define TANDEM_INLINE inline __attribute__((always_inline))

// Tiles used: C0, C1 accumulate two panels; A the activations; B0, B1 the two panels' weights.
constexpr int kC0 = 0, kC1 = 1, kA = 2, kB0 = 3, kB1 = 4;
// The largest quantization group (ValidGroup, packed_matrix.cc).
constexpr int kMaxGroup = 128;

// The tile instructions themselves. GCC's intrinsics paste the tile number into the assembly
// text, so each tile this file uses is spelled out.
struct HardwareTiles {
  static void Configure(const AmxTileConfig& config) {
    // GCC 12's _tile_loadconfig tells the compiler that it reads the configuration's first 8
    // bytes (an "m" operand of a pointer's size): unless the whole of it escapes first, the
    // stores of its rows and columns may be dropped as dead, and the first tile instruction
    // then raises SIGILL (seen in a kernel whose configuration was built in a small function).
    __asm__ volatile("" : : "r"(&config) : "memory");
    _tile_loadconfig(&config);
  }
  static void Release() { _tile_release(); }
  template <int T>
  static void Load(const void* p, int64_t stride) {
    static_assert(T == kA || T == kB0 || T == kB1);
    if constexpr (T == kA) {
      _tile_loadd(2, p, stride);
    } else if constexpr (T == kB0) {
      _tile_loadd(3, p, stride);
    } else {
      _tile_loadd(4, p, stride);
    }
  }
  template <int T>
  static void Store(void* p, int64_t stride) {
    static_assert(T == kC0 || T == kC1);
    if constexpr (T == kC0) {
      _tile_stored(0, p, stride);
    } else {
      _tile_stored(1, p, stride);
    }
  }
  template <int T>
  static void Zero() {
    static_assert(T == kC0 || T == kC1);
    if constexpr (T == kC0) {
      _tile_zero(0);
    } else {
      _tile_zero(1);
    }
  }
  template <int C, int A, int B>
  static void DotBf16() {
    static_assert(A == kA && ((C == kC0 && B == kB0) || (C == kC1 && B == kB1)));
    if constexpr (C == kC0) {
      _tile_dpbf16ps(0, 2, 3);
    } else {
      _tile_dpbf16ps(1, 2, 4);
    }
  }
  template <int C, int A, int B>
  static void DotSigned() {
    static_assert(A == kA && ((C == kC0 && B == kB0) || (C == kC1 && B == kB1)));
    if constexpr (C == kC0) {
      _tile_dpbssd(0, 2, 3);
    } else {
      _tile_dpbssd(1, 2, 4);
    }
  }
};

// The same instructions in software, per the Intel SDM: 8 tiles of up to 16 rows of 64 bytes
// per thread, rows and bytes per row from the configuration, zeros past them.
struct EmulatedTiles {
  struct State {
    AmxTileConfig config;
    alignas(64) uint8_t tiles[8][16][64];
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static void Configure(const AmxTileConfig& config) {
    state().config = config;
    std::memset(state().tiles, 0, sizeof(state().tiles));
  }
  static void Release() {}
  template <int T>
  static void Load(const void* p, int64_t stride) {
    State& s = state();
    std::memset(s.tiles[T], 0, sizeof(s.tiles[T]));
    for (int r = 0; r < s.config.rows[T]; ++r) {
      std::memcpy(s.tiles[T][r], static_cast<const uint8_t*>(p) + r * stride, s.config.colsb[T]);
    }
  }
  template <int T>
  static void Store(void* p, int64_t stride) {
    State& s = state();
    for (int r = 0; r < s.config.rows[T]; ++r) {
      std::memcpy(static_cast<uint8_t*>(p) + r * stride, s.tiles[T][r], s.config.colsb[T]);
    }
  }
  template <int T>
  static void Zero() {
    std::memset(state().tiles[T], 0, sizeof(state().tiles[T]));
  }
  // C[m][n] += A[m][2k] * B[k][2n] + A[m][2k+1] * B[k][2n+1], bf16 products in float32.
  template <int C, int A, int B>
  static void DotBf16() {
    State& s = state();
    auto bf16 = [](const uint8_t* p) {
      uint16_t bits;
      std::memcpy(&bits, p, 2);
      return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
    };
    for (int m = 0; m < s.config.rows[C]; ++m) {
      for (int k = 0; k < s.config.colsb[A] / 4; ++k) {
        for (int n = 0; n < s.config.colsb[C] / 4; ++n) {
          float acc;
          std::memcpy(&acc, s.tiles[C][m] + 4 * n, 4);
          acc += bf16(s.tiles[A][m] + 4 * k) * bf16(s.tiles[B][k] + 4 * n);
          acc += bf16(s.tiles[A][m] + 4 * k + 2) * bf16(s.tiles[B][k] + 4 * n + 2);
          std::memcpy(s.tiles[C][m] + 4 * n, &acc, 4);
        }
      }
    }
  }
  // C[m][n] += sum over i < 4 of signed A[m][4k+i] * signed B[k][4n+i], int32.
  template <int C, int A, int B>
  static void DotSigned() {
    State& s = state();
    for (int m = 0; m < s.config.rows[C]; ++m) {
      for (int k = 0; k < s.config.colsb[A] / 4; ++k) {
        for (int n = 0; n < s.config.colsb[C] / 4; ++n) {
          int32_t acc;
          std::memcpy(&acc, s.tiles[C][m] + 4 * n, 4);
          for (int i = 0; i < 4; ++i) {
            acc += static_cast<int8_t>(s.tiles[A][m][4 * k + i]) *
                   static_cast<int8_t>(s.tiles[B][k][4 * n + i]);
          }
          std::memcpy(s.tiles[C][m] + 4 * n, &acc, 4);
        }
      }
    }
  }
};

// Activations (b, ldh) in whole 16-row tiles (rows past b zero), and the weights of one panel
// pair at a time.
struct AmxArgs {
  float* y;
  int64_t ldy;
  PackedMatrix w;
  int b;
  int64_t ldh;  // bytes per activation row, a multiple of 64
  const std::byte* x;
  const float* xscale = nullptr;  // int: (rows, groups)
};

// y rows [m0, m0 + 16) (those below b) of panel `panel` from 16 rows of 16 floats, `ld` apart.
TANDEM_INLINE void StoreRows(const AmxArgs& a, int m0, int panel, const float* c, int ld) {
  const int first = panel * kPanelRows;
  const int count = std::min(kPanelRows, a.w.rows - first);
  if (count <= 0) return;
  const __mmask16 lanes = static_cast<__mmask16>((1u << count) - 1u);
  for (int m = 0; m < kPanelRows && m0 + m < a.b; ++m) {
    _mm512_mask_storeu_ps(a.y + (m0 + m) * a.ldy + first, lanes, _mm512_loadu_ps(c + ld * m));
  }
}

// bf16 panels [p_begin, p_end): per pair of panels and 16-row block, C += A B over 32-column steps.
// A tile load alone leaves too few lines in flight at one or a few rows (a B tile is 16 lines, and
// one tile product's work per step is too short to cover the next tile's misses): with the next
// step's B rows prefetched, the batch-1 products read 1.13-1.17x faster (docs/benchmarks.md). The
// last step of a column count that is not a multiple of 32 (and a column prefix) reads its B rows
// from a copy holding only the valid columns, zeros after.
template <class Tiles>
void Bf16Panels(const AmxArgs& a, int p_begin, int p_end) {
  AmxTileConfig config;
  for (int t : {kC0, kC1, kA, kB0, kB1}) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  Tiles::Configure(config);
  const int cols = a.w.cols;
  const int steps = (cols + 31) / 32;
  const int last_pairs = (cols - 32 * (steps - 1) + 1) / 2;  // chunks in the last step
  const bool last_odd = cols % 2 != 0;
  const bool tail = last_pairs < 16 || last_odd;
  alignas(64) std::byte padded[2][16 * 64];
  alignas(64) float c[2][16 * 16];
  for (int p = p_begin; p < p_end; p += 2) {
    const bool two = p + 1 < p_end;
    const std::byte* panel[2] = {a.w.data + p * a.w.panel_bytes,
                                 a.w.data + (two ? p + 1 : p) * a.w.panel_bytes};
    if (tail) {
      for (int q = 0; q < 2; ++q) {
        std::memset(padded[q], 0, sizeof(padded[q]));
        std::memcpy(padded[q], panel[q] + (steps - 1) * 16 * 64, last_pairs * 64);
        if (last_odd) {  // the odd column's partner: zero, whatever the matrix holds there
          for (int i = 0; i < 16; ++i)
            std::memset(padded[q] + (last_pairs - 1) * 64 + 4 * i + 2, 0, 2);
        }
      }
    }
    for (int m0 = 0; m0 < a.b; m0 += 16) {
      Tiles::template Zero<kC0>();
      Tiles::template Zero<kC1>();
      for (int s = 0; s < steps; ++s) {
        // The first row block asks for the next step's B rows of both panels (16 lines each)
        // while this step's tiles run; the other blocks find them in cache.
        if (m0 == 0) {
          for (int q = 0; q < 2; ++q) {
            for (int line = 0; line < 16; ++line) {
              PrefetchAhead(panel[q], int64_t{s + 1} * 16 * 64 + 64 * line);
            }
          }
        }
        Tiles::template Load<kA>(a.x + m0 * a.ldh + s * 64, a.ldh);
        const bool last = tail && s == steps - 1;
        Tiles::template Load<kB0>(last ? padded[0] : panel[0] + s * 16 * 64, 64);
        Tiles::template Load<kB1>(last ? padded[1] : panel[1] + s * 16 * 64, 64);
        Tiles::template DotBf16<kC0, kA, kB0>();
        Tiles::template DotBf16<kC1, kA, kB1>();
      }
      Tiles::template Store<kC0>(c[0], 64);
      Tiles::template Store<kC1>(c[1], 64);
      StoreRows(a, m0, p, c[0], 16);
      if (two) StoreRows(a, m0, p + 1, c[1], 16);
    }
  }
  Tiles::Release();
}

// int8 / int4 panels [p_begin, p_end): per pair of panels and quantization group, the group's
// weights are made signed B rows once (int4: the nibbles less 8; int8: the stored q + 128 less
// 128) and multiplied in TDPBSSD against every 16-row block of activations, in steps of up to
// 64 columns; each block's integer sums are then folded into its float32 accumulators, acc +=
// C * (weight scale * activation scale), in group order: the VNNI kernels' sums, so the same
// bits. What bounds it (docs/benchmarks.md, Intel Xeon with AMX): a tile product takes as long
// over a group of 32 columns as over 64, and as bf16's over 32; each group's sums then leave
// the tile in a store that takes nearly as long again; and the fold, three vector operations
// per row and panel for each group, did not overlap the tile instructions. Making B once per
// group (not per row block) and signed (no offset term) keeps it to that. The lines a kilobyte
// past the group's are asked for as it is made: at 16 rows (a decode batch) the memory still
// sets much of the pace.
template <class Tiles, bool kInt4>
void IntPanels(const AmxArgs& a, int p_begin, int p_end) {
  const int group = a.w.group;
  const int groups = a.w.cols / group;
  const int step = std::min(group, 64);  // columns per tile product
  AmxTileConfig config;
  for (int t : {kC0, kC1}) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  config.rows[kA] = 16;
  config.colsb[kA] = static_cast<uint16_t>(step);
  for (int t : {kB0, kB1}) {
    config.rows[t] = static_cast<uint8_t>(step / 4);
    config.colsb[t] = 64;
  }
  Tiles::Configure(config);
  const int64_t group_bytes = int64_t{kPanelRows} * group * (kInt4 ? 4 : 8) / 8;
  const int quads = group / 4;  // B rows of a group: 16 outputs x 4 columns, 64 bytes
  const __m512i nibbles = _mm512_set1_epi8(0x0f);
  const __m512i eight = _mm512_set1_epi8(8);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  // Every row block's accumulators for the pair of panels: row m holds panel p's 16 outputs,
  // then panel p + 1's.
  thread_local std::vector<float> acc_here;
  std::vector<float>& acc = acc_here;
  alignas(64) int8_t wq[2][kMaxGroup * 16];
  // A row block's sums, two panels, in one of two buffers: each block's are folded after the
  // next block's tile products are issued, so that the tiles' stores have landed when the
  // vector loads read them (1.10-1.22x at 64 rows, tandem_kernels_bench).
  alignas(64) int32_t c[2][2][16 * 16];
  struct Block {
    int m0 = -1;  // none
    int g = 0;
    int buffer = 0;
    __m512 scale[2] = {};
  } pending;
  const auto fold = [&](const Block& f) {
    const int rows = std::min(16, a.b - f.m0);
    for (int m = 0; m < rows; ++m) {
      const __m512 xs = _mm512_set1_ps(a.xscale[(f.m0 + m) * groups + f.g]);
      float* row = acc.data() + static_cast<size_t>(f.m0 + m) * 32;
      for (int q = 0; q < 2; ++q) {
        _mm512_storeu_ps(
            row + 16 * q,
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[f.buffer][q] + 16 * m)),
                            _mm512_mul_ps(f.scale[q], xs), _mm512_loadu_ps(row + 16 * q)));
      }
    }
  };
  int buffer = 0;
  for (int p = p_begin; p < p_end; p += 2) {
    const bool two = p + 1 < p_end;
    const std::byte* panel[2] = {a.w.data + p * a.w.panel_bytes,
                                 a.w.data + (two ? p + 1 : p) * a.w.panel_bytes};
    acc.assign(static_cast<size_t>(a.b) * 32, 0.0f);
    for (int g = 0; g < groups; ++g) {
      __m512 scale[2];
      for (int q = 0; q < 2; ++q) {
        const std::byte* values = panel[q] + g * group_bytes;
        for (int64_t line = 0; line < group_bytes; line += 64) {
          PrefetchAhead(values, kWeightPrefetchAhead + line);
        }
        PrefetchScalesAhead(panel[q], a.w, g);
        if constexpr (kInt4) {
          // Chunk j holds quads 2j (low nibbles) and 2j + 1 (high): B rows in quad order.
          for (int j = 0; j < quads / 2; ++j) {
            const __m512i v = _mm512_loadu_si512(values + j * 64);
            _mm512_store_si512(wq[q] + (2 * j) * 64,
                               _mm512_sub_epi8(_mm512_and_si512(v, nibbles), eight));
            _mm512_store_si512(
                wq[q] + (2 * j + 1) * 64,
                _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), nibbles), eight));
          }
        } else {
          for (int j = 0; j < quads; ++j) {
            _mm512_store_si512(wq[q] + j * 64,
                               _mm512_xor_si512(_mm512_loadu_si512(values + j * 64), flip));
          }
        }
        scale[q] = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(GroupScales(panel[q], a.w, g))));
      }
      for (int m0 = 0; m0 < a.b; m0 += 16) {
        Tiles::template Zero<kC0>();
        Tiles::template Zero<kC1>();
        for (int s = 0; s < group / step; ++s) {
          Tiles::template Load<kA>(a.x + m0 * a.ldh + g * group + s * step, a.ldh);
          Tiles::template Load<kB0>(wq[0] + s * (step / 4) * 64, 64);
          Tiles::template Load<kB1>(wq[1] + s * (step / 4) * 64, 64);
          Tiles::template DotSigned<kC0, kA, kB0>();
          Tiles::template DotSigned<kC1, kA, kB1>();
        }
        Tiles::template Store<kC0>(c[buffer][0], 64);
        Tiles::template Store<kC1>(c[buffer][1], 64);
        if (pending.m0 >= 0) fold(pending);
        pending = {.m0 = m0, .g = g, .buffer = buffer, .scale = {scale[0], scale[1]}};
        buffer ^= 1;
      }
    }
    fold(pending);
    pending.m0 = -1;
    for (int m0 = 0; m0 < a.b; m0 += 16) {
      StoreRows(a, m0, p, acc.data() + static_cast<size_t>(m0) * 32, 32);
      if (two) StoreRows(a, m0, p + 1, acc.data() + static_cast<size_t>(m0) * 32 + 16, 32);
    }
  }
  Tiles::Release();
}

// Activations in whole tiles: bf16 rows of a multiple of 32 values for bf16 weights, or int8
// levels (rows of a multiple of 64) with per-group scales and sums (the VNNI kernels' offset
// term), rows padded with zeros to a multiple of 16 where the tiles will read them.
int PaddedRows(int b) { return (b + 15) / 16 * 16; }
int Bf16RowValues(int cols) { return (cols + 31) / 32 * 32; }
int Int8RowBytes(int cols) { return (cols + 63) / 64 * 64; }

// Quantized products of fewer rows run on the avx512vnni kernels, over the same activations
// (so the same bits: LinearTilesTest.QuantizedTilesEqualVnni): a tile product costs the same
// for 1 row as for 16, and its sums go through memory before each group's fold. With fewer
// rows VNNI is faster (int4 3584 x 1024 at batch 1: 88 us against 168 on the tiles, Intel Xeon
// with AMX); from 16 rows the tiles are as fast or faster (tandem_kernels_bench).
constexpr int kIntTileMinRows = 16;

int PanelAlign(int b, const PackedMatrix& w) {
  return w.format != WeightFormat::kBf16 && b < kIntTileMinRows ? Avx512VnniPanelAlign(b) : 2;
}

void PrepareTiles(const float* x, int b, const PackedMatrix& w, ActivationScratch& s) {
  if (w.format == WeightFormat::kBf16) {
    const int ldh = Bf16RowValues(w.cols);
    s.bf16.assign(static_cast<size_t>(PaddedRows(b)) * ldh, 0);
    for (int m = 0; m < b; ++m) {
      Avx512Bf16RoundRow(x + int64_t{m} * w.cols, w.cols,
                         s.bf16.data() + static_cast<size_t>(m) * ldh);
    }
    return;
  }
  const int groups = w.cols / w.group;
  const int ldh = Int8RowBytes(w.cols);
  if (b < kIntTileMinRows) {
    s.q.resize(static_cast<size_t>(b) * ldh);  // the VNNI kernels read these rows' columns only
  } else {
    s.q.assign(static_cast<size_t>(PaddedRows(b)) * ldh, 0);  // whole tiles, zeros past x
  }
  s.scales.resize(static_cast<size_t>(b) * groups);
  s.sums.resize(s.scales.size());
  for (int m = 0; m < b; ++m) {
    Avx512QuantizeRow(x + int64_t{m} * w.cols, w.cols, w.group,
                      s.q.data() + static_cast<size_t>(m) * ldh,
                      s.scales.data() + static_cast<size_t>(m) * groups,
                      s.sums.data() + static_cast<size_t>(m) * groups);
  }
}

template <class Tiles>
void TilePanels(const LinearProduct& p, const ActivationScratch& s, int begin, int end) {
  AmxArgs a{.y = p.y, .ldy = p.w.rows, .w = p.w, .b = p.b, .ldh = 0, .x = nullptr};
  if (p.w.format == WeightFormat::kBf16) {
    a.ldh = int64_t{Bf16RowValues(p.w.cols)} * 2;
    a.x = reinterpret_cast<const std::byte*>(s.bf16.data());
    Bf16Panels<Tiles>(a, begin, end);
    return;
  }
  a.ldh = Int8RowBytes(p.w.cols);
  if (p.b < kIntTileMinRows) {
    Avx512VnniPanels(p, s.q.data(), a.ldh, s.scales.data(), s.sums.data(), begin, end);
    return;
  }
  a.x = reinterpret_cast<const std::byte*>(s.q.data());
  a.xscale = s.scales.data();
  if (p.w.format == WeightFormat::kInt4) {
    IntPanels<Tiles, true>(a, begin, end);
  } else {
    IntPanels<Tiles, false>(a, begin, end);
  }
}

#undef TANDEM_INLINE

}  // namespace

const LinearKernel kAmxLinear{
    .prepare = PrepareTiles,
    .panels = TilePanels<HardwareTiles>,
    .panel_align = PanelAlign,
};
const LinearKernel kAmxEmulatedLinear{
    .prepare = PrepareTiles,
    .panels = TilePanels<EmulatedTiles>,
    .panel_align = PanelAlign,
};

}  // namespace tandem::kernels::cpu::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
