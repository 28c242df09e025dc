// CPU kernels: plain functions with shape comments. Each fast kernel (AVX-512 with bf16 dot
// products where the CPU has them, AVX2 otherwise, chosen once at run time) has a simple
// reference beside it in namespace `reference`, and a test comparing the two on random inputs.
// All matrices are row-major; activations are float32, weights bfloat16 (raw bits) or float32,
// accumulation is float32.
//
// By default the AVX-512 path widens bf16 weights to float32 and multiplies them by the exact
// float32 activations, as the reference does; the bf16 dot-product path ("avx512bf16") rounds
// activations to bf16 first (about 3 significant digits) and is used only when selected with
// SetKernelIsaForTesting. MatMulBf16 and MatMulF32 split large products across the threads of
// DefaultThreadPool() (thread_pool.h); every kernel is safe to call from several threads at once.
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu {

// bfloat16 <-> float32 (round to nearest even; NaN stays NaN).
float Bf16ToF32(uint16_t bits);
uint16_t F32ToBf16(float value);

// Which implementation the dispatched kernels use on this machine: "avx512bf16", "avx512",
// "avx2" or "reference".
const char* KernelIsa();

// Makes the dispatched kernels use `isa` (one of KernelIsa()'s names) from now on, in every
// thread; nullptr restores the choice made for this machine. Returns false, changing nothing,
// when the name is unknown or the CPU lacks the instructions. For tests and benchmarks: do not
// call it while other threads are running kernels.
bool SetKernelIsaForTesting(const char* isa);

// Y (b,d) = X (b,n) @ W^T, W (d,n) bf16 — one weight row per output feature.
void MatMulBf16(const float* x, int b, int n, const uint16_t* w, int d, float* y);
// The same over the first n columns of a W whose rows are ldw >= n apart: a width-n slice.
void MatMulBf16Strided(const float* x, int b, int n, const uint16_t* w, int ldw, int d, float* y);
// Same with float32 weights.
void MatMulF32(const float* x, int b, int n, const float* w, int d, float* y);
// out (b,n) = x (b,n) / rms(x row) * weight (n,)
void RmsNorm(const float* x, int b, int n, const float* weight, float eps, float* out);
// Rotary embedding in place, Hugging Face's rotate_half convention: for each head of
// x (heads, head_dim) at position `pos`, pairs (i, i + head_dim/2) rotate by
// pos * theta^(-2i/head_dim).
void Rope(float* x, int heads, int head_dim, int pos, float theta);
// x (n,) <- softmax(x), numerically stable.
void Softmax(float* x, int n);
// log(sum(exp(x))) over x (n,), n >= 1, numerically stable: the log-softmax's normaliser
// (x[i] - LogSumExp(x) is log softmax(x)[i]). Exponentials in float, summed in double. With
// every x -inf the result is -inf; with a +inf or a NaN in x it is not finite.
double LogSumExp(const float* x, int n);
// out (k,) = the indices of the k largest of x (n,), 1 <= k <= n: largest first, the lower index
// first among equal values. x must hold no NaN.
void TopK(const float* x, int n, int k, int32_t* out);
// out (n,) = silu(gate) * up
void SiluMul(const float* gate, const float* up, int n, float* out);
// y (n,) += alpha * x (n,)
void Axpy(float alpha, const float* x, int n, float* y);

// Attention of one query token over a paged KV cache (grouped-query attention).
//   q            (num_heads, head_dim)
//   k_pool/v_pool (num_blocks, block_size, num_kv_heads, head_dim): one layer's pool
//   block_table  (ceil(context_len / block_size),): block ids, in position order
//   out          (num_heads, head_dim)
// Attends to positions [0, context_len); query head h uses KV head h / (num_heads/num_kv_heads);
// scores are scaled by `scale` (1/sqrt(head_dim) for Mixtral).
void PagedAttention(const float* q, int num_heads, int num_kv_heads, int head_dim,
                    const float* k_pool, const float* v_pool, const int32_t* block_table,
                    int block_size, int context_len, float scale, float* out);
// The same for the query heads of KV heads [kv_head_begin, kv_head_end) only: the rest of out
// is untouched, so disjoint ranges can run on different threads.
void PagedAttentionHeads(const float* q, int num_heads, int num_kv_heads, int head_dim,
                         const float* k_pool, const float* v_pool, const int32_t* block_table,
                         int block_size, int context_len, float scale, int kv_head_begin,
                         int kv_head_end, float* out);

namespace reference {
void MatMulBf16(const float* x, int b, int n, const uint16_t* w, int d, float* y);
void MatMulBf16Strided(const float* x, int b, int n, const uint16_t* w, int ldw, int d, float* y);
void MatMulF32(const float* x, int b, int n, const float* w, int d, float* y);
void RmsNorm(const float* x, int b, int n, const float* weight, float eps, float* out);
void Rope(float* x, int heads, int head_dim, int pos, float theta);
void Softmax(float* x, int n);
double LogSumExp(const float* x, int n);
void TopK(const float* x, int n, int k, int32_t* out);
void SiluMul(const float* gate, const float* up, int n, float* out);
void Axpy(float alpha, const float* x, int n, float* y);
void PagedAttention(const float* q, int num_heads, int num_kv_heads, int head_dim,
                    const float* k_pool, const float* v_pool, const int32_t* block_table,
                    int block_size, int context_len, float scale, float* out);
void PagedAttentionHeads(const float* q, int num_heads, int num_kv_heads, int head_dim,
                         const float* k_pool, const float* v_pool, const int32_t* block_table,
                         int block_size, int context_len, float scale, int kv_head_begin,
                         int kv_head_end, float* out);
}  // namespace reference

}  // namespace tandem::kernels::cpu
