// Private to common/kernels/cpu: the per-ISA kernel tables that kernels.cc dispatches between,
// and helpers they share.
#pragma once

#include <bit>
#include <cstdint>
#include <functional>

namespace tandem::kernels::cpu::internal {

// One implementation of every dispatched kernel, with the public kernels' signatures.
struct IsaKernels {
  const char* name;
  void (*matmul_bf16)(const float* x, int b, int n, const uint16_t* w, int ldw, int d, float* y);
  void (*matmul_f32)(const float* x, int b, int n, const float* w, int d, float* y);
  void (*rms_norm)(const float* x, int b, int n, const float* weight, float eps, float* out);
  void (*rope)(float* x, int heads, int head_dim, int pos, float theta);
  void (*softmax)(float* x, int n);
  double (*log_sum_exp)(const float* x, int n);
  void (*top_k)(const float* x, int n, int k, int32_t* out);
  void (*silu_mul)(const float* gate, const float* up, int n, float* out);
  void (*axpy)(float alpha, const float* x, int n, float* y);
  void (*paged_attention)(const float* q, int num_heads, int num_kv_heads, int head_dim,
                          const float* k_pool, const float* v_pool, const int32_t* block_table,
                          int block_size, int context_len, float scale, int kv_head_begin,
                          int kv_head_end, float* out);
};

extern const IsaKernels kAvx512Kernels;      // kernels_avx512.cc
extern const IsaKernels kAvx512Bf16Kernels;  // kernels_avx512.cc
extern const IsaKernels kAvx2Kernels;        // kernels_avx2.cc

// Calls fn(row_begin, row_end) on ranges covering the d output features of a (b,n) x (n,d)
// product: across DefaultThreadPool() when the product is large, in one inline call otherwise.
// Every range but the last starts and ends at a multiple of `row_align`.
void ParallelRows(int b, int n, int d, int row_align, const std::function<void(int, int)>& fn);

// Rope for the fast paths: the reference's arithmetic, with each angle's sine and cosine
// computed once for all heads rather than once per head. Results equal the reference's.
void RopeSharedAngles(float* x, int heads, int head_dim, int pos, float theta);

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
