// Dispatch: picks the best kernel table for this CPU once, on first use, and forwards every
// public kernel to it. Also holds what all tables share (bf16 conversion, Rope, the split of
// matrix products across threads).
#include "common/kernels/cpu/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "common/kernels/cpu/kernels_internal.h"
#include "common/kernels/cpu/thread_pool.h"

namespace tandem::kernels::cpu {

float Bf16ToF32(uint16_t bits) { return internal::Bf16BitsToF32(bits); }

uint16_t F32ToBf16(float value) { return internal::F32ToBf16Bits(value); }

namespace internal {

// Below this many multiply-adds (1 MB of bf16 weights at b = 1, about 30 us on one thread) a
// product runs inline. One thread streams weights at about 30 GB/s here, two at 52-55 GB/s
// (measured on 7-32 MB products), so everything larger is split; idle workers spin briefly
// between products (thread_pool.cc), which keeps the hand-off to a few microseconds.
constexpr int64_t kMinParallelWork = int64_t{1} << 19;
// Smallest share of a product handed to one thread.
constexpr int64_t kMinChunkWork = int64_t{1} << 17;

void ParallelRows(int b, int n, int d, int row_align, const std::function<void(int, int)>& fn) {
  const int64_t work = int64_t{b} * n * d;
  ThreadPool& pool = DefaultThreadPool();
  if (work < kMinParallelWork || pool.num_threads() == 1) {
    fn(0, d);
    return;
  }
  const int64_t groups = (d + row_align - 1) / row_align;
  const int64_t group_work = std::max<int64_t>(1, int64_t{b} * n * row_align);
  pool.ParallelFor(groups, std::max<int64_t>(1, kMinChunkWork / group_work),
                   [&](int64_t begin, int64_t end) {
                     fn(static_cast<int>(begin * row_align),
                        static_cast<int>(std::min<int64_t>(d, end * row_align)));
                   });
}

void RopeSharedAngles(float* x, int heads, int head_dim, int pos, float theta) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float inv_freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / head_dim);
    const float angle = static_cast<float>(pos) * inv_freq;
    const float c = std::cos(angle);
    const float s = std::sin(angle);
    for (int64_t h = 0; h < heads; ++h) {
      float* head = x + h * head_dim;
      const float x1 = head[i];
      const float x2 = head[i + half];
      head[i] = x1 * c - x2 * s;
      head[i + half] = x2 * c + x1 * s;
    }
  }
}

namespace {

// For CPUs without AVX2 (and for testing the fast paths against it).
constexpr IsaKernels kReferenceKernels = {
    .name = "reference",
    .matmul_bf16 = reference::MatMulBf16Strided,
    .matmul_f32 = reference::MatMulF32,
    .rms_norm = reference::RmsNorm,
    .rope = reference::Rope,
    .softmax = reference::Softmax,
    .log_sum_exp = reference::LogSumExp,
    .top_k = reference::TopK,
    .silu_mul = reference::SiluMul,
    .axpy = reference::Axpy,
    .paged_attention = reference::PagedAttentionHeads,
};

bool CpuHasAvx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

bool Supported(const IsaKernels& kernels) {
  __builtin_cpu_init();
  if (&kernels == &kAvx512Bf16Kernels) {
    return CpuHasAvx512() && __builtin_cpu_supports("avx512bf16");
  }
  if (&kernels == &kAvx512Kernels) return CpuHasAvx512();
  if (&kernels == &kAvx2Kernels) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }
  return true;
}

// The bf16 dot-product table is not a default: it rounds activations to bf16.
const IsaKernels* Detect() {
  for (const IsaKernels* kernels : {&kAvx512Kernels, &kAvx2Kernels}) {
    if (Supported(*kernels)) return kernels;
  }
  return &kReferenceKernels;
}

constinit std::atomic<const IsaKernels*> g_kernels{nullptr};

const IsaKernels& Kernels() {
  const IsaKernels* kernels = g_kernels.load(std::memory_order_acquire);
  if (kernels == nullptr) {
    // Threads racing here all detect the same table.
    kernels = Detect();
    g_kernels.store(kernels, std::memory_order_release);
  }
  return *kernels;
}

}  // namespace
}  // namespace internal

const char* KernelIsa() { return internal::Kernels().name; }

bool SetKernelIsaForTesting(const char* isa) {
  using internal::IsaKernels;
  if (isa == nullptr) {
    internal::g_kernels.store(internal::Detect(), std::memory_order_release);
    return true;
  }
  for (const IsaKernels* kernels : {&internal::kAvx512Bf16Kernels, &internal::kAvx512Kernels,
                                    &internal::kAvx2Kernels, &internal::kReferenceKernels}) {
    if (std::strcmp(isa, kernels->name) == 0) {
      if (!internal::Supported(*kernels)) return false;
      internal::g_kernels.store(kernels, std::memory_order_release);
      return true;
    }
  }
  return false;
}

void MatMulBf16(const float* x, int b, int n, const uint16_t* w, int d, float* y) {
  internal::Kernels().matmul_bf16(x, b, n, w, n, d, y);
}

void MatMulBf16Strided(const float* x, int b, int n, const uint16_t* w, int ldw, int d, float* y) {
  internal::Kernels().matmul_bf16(x, b, n, w, ldw, d, y);
}

void MatMulF32(const float* x, int b, int n, const float* w, int d, float* y) {
  internal::Kernels().matmul_f32(x, b, n, w, d, y);
}

void RmsNorm(const float* x, int b, int n, const float* weight, float eps, float* out) {
  internal::Kernels().rms_norm(x, b, n, weight, eps, out);
}

void Rope(float* x, int heads, int head_dim, int pos, float theta) {
  internal::Kernels().rope(x, heads, head_dim, pos, theta);
}

void Softmax(float* x, int n) { internal::Kernels().softmax(x, n); }

double LogSumExp(const float* x, int n) { return internal::Kernels().log_sum_exp(x, n); }

void TopK(const float* x, int n, int k, int32_t* out) { internal::Kernels().top_k(x, n, k, out); }

void SiluMul(const float* gate, const float* up, int n, float* out) {
  internal::Kernels().silu_mul(gate, up, n, out);
}

void Axpy(float alpha, const float* x, int n, float* y) {
  internal::Kernels().axpy(alpha, x, n, y);
}

void PagedAttention(const float* q, int num_heads, int num_kv_heads, int head_dim,
                    const float* k_pool, const float* v_pool, const int32_t* block_table,
                    int block_size, int context_len, float scale, float* out) {
  internal::Kernels().paged_attention(q, num_heads, num_kv_heads, head_dim, k_pool, v_pool,
                                      block_table, block_size, context_len, scale, 0, num_kv_heads,
                                      out);
}

void PagedAttentionHeads(const float* q, int num_heads, int num_kv_heads, int head_dim,
                         const float* k_pool, const float* v_pool, const int32_t* block_table,
                         int block_size, int context_len, float scale, int kv_head_begin,
                         int kv_head_end, float* out) {
  internal::Kernels().paged_attention(q, num_heads, num_kv_heads, head_dim, k_pool, v_pool,
                                      block_table, block_size, context_len, scale, kv_head_begin,
                                      kv_head_end, out);
}

}  // namespace tandem::kernels::cpu
