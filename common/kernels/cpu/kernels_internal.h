// Private to common/kernels/cpu: the per-ISA kernel tables that kernels.cc dispatches between,
// and helpers they share.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "common/kernels/backend.h"
#include "common/kernels/cpu/kernels.h"
#include "common/kernels/packed_matrix.h"

namespace tandem::kernels::cpu::internal {

// The elementwise and attention kernels of each instruction set (their linear fields null;
// kernels.cc completes the tables with the products below).
extern const Backend kAvx512Elementwise;  // kernels_avx512.cc
extern const Backend kAvx2Elementwise;    // kernels_avx2.cc
// Attention at the levels with AVX512-BF16: vdpbf16ps over bf16 caches (the query and softmax
// weights rounded to bf16), else kAvx512Elementwise's (kernels_avx512.cc).
using PagedAttentionFn = decltype(Backend::paged_attention);
extern const PagedAttentionFn kAvx512Bf16Attention;
using CausalAttentionFn = decltype(Backend::causal_attention);
extern const CausalAttentionFn kAvx512Bf16CausalAttention;

// CausalAttentionByQuery over `Attend`, as a table entry: what every level runs where it has no
// kernel for blocks of queries.
template <auto Attend>
void CausalByQuery(const float* q, int m, int num_heads, const PagedKv& kv, int first_position,
                   int context_begin, int context_end, int window, float scale, float* out,
                   float* lse) {
  CausalAttentionByQuery(Attend, q, m, num_heads, kv, first_position, context_begin, context_end,
                         window, scale, out, lse);
}
// The step's ops that every level shares (Backend::embed .. kv_store; step_ops.cc): plain loops
// the compiler vectorises, memory-bound.
void Embed(const uint16_t* table, int cols, const int32_t* ids, int n, float* out);
void GatherRows(const float* x, int x_stride, const int32_t* rows, int n, int cols, float* out,
                int out_stride);
void AddBias(const float* bias, int rows, int n, float* x);
void Sigmoid(float* x, int n);
void ClampedSwiglu(const float* gate, const float* up, int n, float alpha, float limit, float* out);
void GeluTanhMul(const float* gate, const float* up, int n, float* out);
void SoftCap(float* x, int n, float cap);
void Scale(float* x, int n, float alpha);
void AttentionSinks(float* out, const float* lse, const float* sinks, int rows, int heads,
                    int head_dim);
void Mul(const float* x, int n, float* y);
void L2Norm(float* x, int rows, int heads, int n, int stride, float scale);
void DeltaGates(float* a, float* b, int rows, int heads, const float* a_log, const float* dt_bias);
void KvStore(const PagedKvOut& kv, int rows, const int32_t* positions, const float* k,
             const float* v);

// Backend::rope over a level's rotation of one token (x (heads, head_dim) at `pos`).
template <auto RopeToken>
void RopeRows(float* x, int rows, int heads, int head_dim, const RopeSpec& rope,
              const int32_t* positions) {
  for (int r = 0; r < rows; ++r) {
    RopeToken(x + static_cast<int64_t>(r) * heads * head_dim, heads, head_dim, positions[r], rope);
  }
}

// Backend::add_rows over a level's axpy for the scaled rows.
template <auto AxpyFn>
void AddRows(const float* x, int rows, int n, const float* scales, const int32_t* to, float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* src = x + static_cast<int64_t>(r) * n;
    float* dst = y + static_cast<int64_t>(to != nullptr ? to[r] : r) * n;
    if (scales != nullptr) {
      AxpyFn(scales[r], src, n, dst);
    } else {
      for (int i = 0; i < n; ++i) dst[i] += src[i];
    }
  }
}

// Backend::route over a level's softmax and top_k.
template <auto SoftmaxFn, auto TopKFn>
void Route(float* logits, int rows, int n, const RouteSpec& spec, int32_t* experts,
           float* weights) {
  const int k = spec.k;
  const bool grouped = spec.groups > 1;
  const bool choose_apart = spec.selection_bias != nullptr || grouped;
  thread_local std::vector<float> choice, group_score;
  thread_local std::vector<int32_t> best_groups;
  if (choose_apart) choice.resize(n);
  for (int r = 0; r < rows; ++r) {
    float* p = logits + static_cast<int64_t>(r) * n;
    if (spec.mask != nullptr) {
      for (int e = 0; e < n; ++e) p[e] += spec.mask[e];
    }
    if (spec.sigmoid) {
      Sigmoid(p, n);
    } else {
      SoftmaxFn(p, n);
    }
    int32_t* chosen = experts + static_cast<int64_t>(r) * k;
    float* w = weights + static_cast<int64_t>(r) * k;
    if (!choose_apart) {
      TopKFn(p, n, k, chosen);
    } else {
      for (int e = 0; e < n; ++e) {
        choice[e] = p[e] + (spec.selection_bias != nullptr ? spec.selection_bias[e] : 0.0f);
      }
      if (grouped) {
        const int per_group = n / spec.groups;
        group_score.resize(spec.groups);
        best_groups.resize(spec.top_groups);
        for (int g = 0; g < spec.groups; ++g) {
          const float* c = choice.data() + static_cast<int64_t>(g) * per_group;
          float first = -std::numeric_limits<float>::infinity(), second = first;
          for (int e = 0; e < per_group; ++e) {
            if (c[e] > first) {
              second = first;
              first = c[e];
            } else if (c[e] > second) {
              second = c[e];
            }
          }
          group_score[g] = spec.group_top_two ? first + second : first;
        }
        TopKFn(group_score.data(), spec.groups, spec.top_groups, best_groups.data());
        for (int g = 0; g < spec.groups; ++g) {
          if (std::find(best_groups.begin(), best_groups.end(), g) != best_groups.end()) continue;
          std::fill_n(choice.data() + static_cast<int64_t>(g) * per_group, per_group, 0.0f);
        }
      }
      if (spec.mask != nullptr) {  // an expert the plan drops is never chosen
        for (int e = 0; e < n; ++e) {
          if (std::isinf(spec.mask[e])) choice[e] = -std::numeric_limits<float>::infinity();
        }
      }
      TopKFn(choice.data(), n, k, chosen);
    }
    float mass = 1.0f;
    if (spec.renormalize) {
      mass = 0;
      for (int j = 0; j < k; ++j) mass += p[chosen[j]];
      if (!(mass > 0)) mass = 1.0f;
    }
    for (int j = 0; j < k; ++j) w[j] = p[chosen[j]] / mass * spec.scaling;
  }
}

// `table` with the step's ops filled in over the level's softmax, top_k and axpy.
template <auto SoftmaxFn, auto TopKFn, auto AxpyFn>
constexpr Backend WithStepOps(Backend table) {
  table.embed = Embed;
  table.gather_rows = GatherRows;
  table.add_rows = AddRows<AxpyFn>;
  table.add_bias = AddBias;
  table.clamped_swiglu = ClampedSwiglu;
  table.attention_sinks = AttentionSinks;
  // A level's own where it has them (its vector exp), else the plain loops.
  if (table.gelu_tanh_mul == nullptr) table.gelu_tanh_mul = GeluTanhMul;
  if (table.soft_cap == nullptr) table.soft_cap = SoftCap;
  table.scale = Scale;
  table.sigmoid = Sigmoid;
  table.mul = Mul;
  table.l2_norm = L2Norm;
  table.delta_gates = DeltaGates;
  table.route = Route<SoftmaxFn, TopKFn>;
  table.merge_attention = MergeAttentionParts;
  table.kv_store = KvStore;
  return table;
}

// Activations as one product's panels read them (grown as needed, never shrunk): rounded to
// bf16, or int8 levels with per-group scales and sums; filled by the thread that runs the
// product (or group) before its panels start, then only read.
struct ActivationScratch {
  std::vector<uint16_t> bf16;
  std::vector<int8_t> q;
  std::vector<float> scales;
  std::vector<int32_t> sums;
};

// One activation row quantized per group, exactly as QuantizeActivations does (a level's
// vector form of it); and each of x's b rows so, into s: levels (b, w.cols), scales and sums
// (b, w.cols / w.group). Nothing for bf16 weights.
using QuantizeRowFn = void (*)(const float* x, int cols, int group, int8_t* q, float* scales,
                               int32_t* sums);
void QuantizeRowsWith(QuantizeRowFn row, const float* x, int b, const PackedMatrix& w,
                      ActivationScratch& s);

// A level's matrix product in its two halves, so that several products can share one pass over
// the threads (Backend::linear_group; RunLinearGroup below):
//   prepare       rounds or quantizes x (b, w.cols) as the panels read it, into s; null when the
//                 level reads float32 activations for every format. What it writes depends on
//                 x, b, w.cols, whether w is bf16 and w's group only.
//   panels        y's panels [begin, end) of one product (16 outputs each) from x and s.
//   panel_align   panels a thread takes at a time for a product with b rows: every range but a
//                 product's last starts and ends at a multiple of it.
struct LinearKernel {
  void (*prepare)(const float* x, int b, const PackedMatrix& w, ActivationScratch& s);
  void (*panels)(const LinearProduct& p, const ActivationScratch& s, int begin, int end);
  int (*panel_align)(int b, const PackedMatrix& w);
};

// Runs the products: prepares each input once (consecutive products reading the same x share it),
// then every product's panels, in one inline call each when the group is small, else as blocks of
// panels handed out across DefaultThreadPool() (a thread takes the next block, of whichever
// product, when it is done).
void RunLinearGroup(const LinearProduct* products, int n, const LinearKernel& kernel);

template <const LinearKernel& K>
void LinearGroupWith(const LinearProduct* products, int n) {
  RunLinearGroup(products, n, K);
}
template <const LinearKernel& K>
void LinearWith(const float* x, int b, const PackedMatrix& w, float* y) {
  const LinearProduct product{.x = x, .b = b, .w = w, .y = y};
  RunLinearGroup(&product, 1, K);
}

// The products over packed weights (linear_avx512.cc, linear_avx2.cc, reference.cc), by what
// they do with activations: float32 throughout; int8 for int8/int4 weights; and bf16 for bf16
// weights.
extern const LinearKernel kReferenceLinear;
extern const LinearKernel kAvx512Linear;
extern const LinearKernel kAvx512VnniLinear;
extern const LinearKernel kAvx512Bf16Linear;
extern const LinearKernel kAvx2Linear;
extern const LinearKernel kAvx2Int8Linear;  // int8 activations for int8 / int4 weights
// AMX tiles (linear_amx.cc): bf16 activations for bf16 weights, int8 for int8/int4; and the same
// kernels over a software model of the tile instructions, for tests on machines without AMX.
extern const LinearKernel kAmxLinear;
extern const LinearKernel kAmxEmulatedLinear;
// linear_avx512.cc's activation rows, for the AMX level's own layout of them: one row quantized
// as QuantizeRowFn says (AVX-512F), and one rounded to bf16 (AVX512-BF16; out holds cols rounded
// up to even).
void Avx512QuantizeRow(const float* x, int cols, int group, int8_t* q, float* scales,
                       int32_t* sums);
void Avx512Bf16RoundRow(const float* x, int cols, uint16_t* out);
// The avx512vnni level's int8 / int4 panels [begin, end) of p against rows quantized as
// QuantizeRowFn says, q (p.b, ldh), scales and sums (p.b, groups); and the panels a thread
// should take at a time for them.
void Avx512VnniPanels(const LinearProduct& p, const int8_t* q, int64_t ldh, const float* scales,
                      const int32_t* sums, int begin, int end);
int Avx512VnniPanelAlign(int b);

// How far ahead in a panel the products (every vector level's and the AMX tiles') ask for the
// weights they will read, and how far ahead in the panel's scales (two groups of 16 float16).
// A product's arithmetic per byte (an int4 chunk: three operations to unpack, two vpdpbusd; a
// tile's group made signed before its tile products) leaves too few of its loads in flight for
// the hardware prefetchers alone to keep the memory busy. On the Xeon with AMX, asked for a
// kilobyte ahead, the products read 1.03-1.38x faster at 1-64 rows, the float32-activation
// int8 / int4 kernels 1.4-2.8x at batch 1 (docs/benchmarks.md).
inline constexpr int kWeightPrefetchAhead = 1024;
inline constexpr int kScalePrefetchAhead = 64;

// Asks for the line `ahead` bytes past p, into L1. The address is computed as an integer: it
// may lie past the matrix's end, which a prefetch never faults on.
inline void PrefetchAhead(const std::byte* p, int64_t ahead) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + ahead), 0, 3);
}
// The scales of group g of `panel` in w's layout, and asking for those kScalePrefetchAhead on.
inline const std::byte* GroupScales(const std::byte* panel, const PackedMatrix& w, int g) {
  return panel + w.scale_offset + int64_t{g} * kPanelRows * 2;
}
inline void PrefetchScalesAhead(const std::byte* panel, const PackedMatrix& w, int g) {
  PrefetchAhead(GroupScales(panel, w, g), kScalePrefetchAhead);
}

// Rope for the fast paths: the reference's arithmetic, with each angle's sine and cosine
// computed once for all heads rather than once per head. Results equal the reference's.
void RopeSharedAngles(float* x, int heads, int head_dim, int pos, const RopeSpec& rope);

// TopK's bookkeeping, shared by every ISA: `best` (k,) holds indices of x, largest first and
// the lower index first among equal values; index t (after every index in best) enters when
// it beats the last, behind every entry at least its value, and the last drops out.
inline void InsertTopK(const float* x, int32_t* best, int k, int32_t t) {
  const float v = x[t];
  int j = k - 1;
  while (j > 0 && x[best[j - 1]] < v) {
    best[j] = best[j - 1];
    --j;
  }
  best[j] = t;
}

// The indices base + (set bits of `above`) that beat `floor`, the k-th so far, go into best in
// index order; returns the k-th after them. (A vector scan finds the lanes above the threshold
// it had; the threshold may rise within them.)
inline float InsertAbove(const float* x, int32_t* best, int k, int32_t base, uint32_t above,
                         float floor) {
  while (above != 0) {
    const int32_t t = base + std::countr_zero(above);
    above &= above - 1;
    if (!(x[t] > floor)) continue;
    InsertTopK(x, best, k, t);
    floor = x[best[k - 1]];
  }
  return floor;
}

// Fills best (k,) with 0..k-1 in TopK's order: the start of every ISA's scan.
inline void StartTopK(const float* x, int k, int32_t* best) {
  for (int32_t t = 0; t < k; ++t) {
    int j = t;
    while (j > 0 && x[best[j - 1]] < x[t]) {
      best[j] = best[j - 1];
      --j;
    }
    best[j] = t;
  }
}

inline float Bf16BitsToF32(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

inline uint16_t F32ToBf16Bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // NaN: keep the sign and top payload bits and set the quiet bit, so that a NaN whose
  // payload lies only in the low 16 bits does not become infinity.
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  // Round to nearest, ties to even; overflow carries into the exponent, giving infinity.
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace tandem::kernels::cpu::internal
