// CPU kernels: plain functions with shape comments, and the CPU backend's op tables
// (common/kernels/backend.h). Each fast kernel has a simple reference beside it in namespace
// `reference`, and a test comparing the two on random inputs. All matrices are row-major;
// activations are float32; the matrix products read weights packed in panels
// (common/kernels/packed_matrix.h: bf16, int8 or int4), accumulating in float32.
//
// Levels (instruction sets), slowest first; each is chosen at run time only where the CPU has
// its instructions (and the OS enables them):
//   reference    plain loops, the test oracle
//   avx2         AVX2 + FMA + F16C; activations float32
//   avx2int8     + int8 / int4 weights meet activations quantized to int8 per group
//                (vpmaddubsw): the default on CPUs without AVX-512
//   avx512       AVX-512 F/BW/VL/DQ; activations float32
//   avx512vnni   + VNNI: int8/int4 weights meet activations quantized to int8 per group
//   avx512bf16   + AVX512_BF16: bf16 weights meet activations rounded to bf16 as well
//   amx          + AMX tiles (TDPBF16PS, TDPBSSD), where Linux grants them to the process
// The default is the fastest level the CPU has; TANDEM_KERNELS (environment) or SetKernelIsa
// picks another: a level's name, "auto" (the default) or "exact" (the fastest level that keeps
// activations float32, whose results match the PyTorch reference to float32 rounding). Every
// dispatched kernel is safe to call from several threads at once; the matrix products split
// large products across the threads of DefaultThreadPool() (thread_pool.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/kernels/backend.h"
#include "common/kernels/packed_matrix.h"

namespace tandem::kernels::cpu {

// bfloat16 <-> float32 (round to nearest even; NaN stays NaN).
float Bf16ToF32(uint16_t bits);
uint16_t F32ToBf16(float value);

// The level the dispatched kernels use now.
const char* KernelIsa();
// The backend of the level in use, and of every level this CPU can run (slowest first).
const Backend& ActiveBackend();
std::vector<const Backend*> SupportedBackends();
// The backend `name` selects ("auto", "exact" or a level), null when the name is unknown or
// the CPU lacks the level's instructions.
const Backend* FindBackend(const std::string& name);
// Every name FindBackend knows, for messages: "auto, exact, reference, avx2, ...".
std::string KernelIsaNames();

// For tests: the amx level's kernels with the tile instructions carried out in software (the
// same tiles, blocking and dequantization), so that machines without AMX check them; null
// where the CPU lacks avx512bf16. Never chosen by FindBackend.
const Backend* AmxEmulatedBackendForTesting();

// Makes the dispatched kernels use `name` (as FindBackend) from now on, in every thread.
// Returns false, changing nothing, when FindBackend finds nothing. Call it at start-up, or in
// tests and benchmarks while no other thread runs kernels.
bool SetKernelIsa(const std::string& name);

// Y (b, w.rows) = X (b, w.cols) @ W^T, W packed; activations rounded as the level says.
void Linear(const float* x, int b, const PackedMatrix& w, float* y);
// The products in one pass over the threads, each equal to Linear's (Backend::linear_group).
void LinearGroup(const LinearProduct* products, int n);
// The same with activations float32 at every level.
void LinearF32(const float* x, int b, const PackedMatrix& w, float* y);
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
//   q    (num_heads, head_dim)
//   kv   one layer's K and V pools and the sequence's block table (common/kernels/kv_format.h)
//   out  (num_heads, head_dim)
// Attends to positions [0, context_len); query head h uses KV head h / (num_heads/num_kv_heads);
// scores are scaled by `scale` (1/sqrt(head_dim) for Mixtral). Keys and values are read in the
// pool's dtype and computed with in float32.
void PagedAttention(const float* q, int num_heads, const PagedKv& kv, int context_len, float scale,
                    float* out);
// The same over positions [context_begin, context_end) only, for the query heads of KV heads
// [kv_head_begin, kv_head_end): the rest of out is untouched, so disjoint head ranges can run on
// different threads. When `lse` (num_heads,) is not null, lse[h] receives log(sum(exp(scaled
// scores))) of each of those heads, -inf for an empty range: attention over a whole context is
// the parts' outputs weighted by exp(lse_part - lse_whole) (MergeAttentionParts).
void PagedAttentionRange(const float* q, int num_heads, const PagedKv& kv, int context_begin,
                         int context_end, float scale, int kv_head_begin, int kv_head_end,
                         float* out, float* lse);
// out (n,) = the attention over the union of `parts` disjoint position ranges, from each part's
// output parts_out[i] (n,) and log-sum-exp parts_lse[i]. Parts with lse -inf count for nothing.
void MergeAttentionParts(const float* const* parts_out, const float* parts_lse, int parts, int n,
                         float* out);

// A Gated DeltaNet's causal depthwise convolution with SiLU, in place over m rows of x, and its
// gated delta rule over one value head's tokens (Backend::causal_conv, Backend::gated_delta).
void CausalConv(float* x, int m, int channels, int stride, const float* weight, int kernel,
                float* tail);
void GatedDelta(const GatedDeltaHead& head);

namespace reference {
// The product over W's dequantized elements (PackedElement), summed in double.
void Linear(const float* x, int b, const PackedMatrix& w, float* y);
void RmsNorm(const float* x, int b, int n, const float* weight, float eps, float* out);
// The first rope.rotary_dim of each of x's `heads` heads (head_dim apart) rotated at `pos`.
void Rope(float* x, int heads, int head_dim, int pos, const RopeSpec& rope);
void Softmax(float* x, int n);
double LogSumExp(const float* x, int n);
void TopK(const float* x, int n, int k, int32_t* out);
void SiluMul(const float* gate, const float* up, int n, float* out);
void Axpy(float alpha, const float* x, int n, float* y);
// Over LoadKvRow's float32 rows, in double.
void PagedAttention(const float* q, int num_heads, const PagedKv& kv, int context_len, float scale,
                    float* out);
void PagedAttentionRange(const float* q, int num_heads, const PagedKv& kv, int context_begin,
                         int context_end, float scale, int kv_head_begin, int kv_head_end,
                         float* out, float* lse);
// Each output by its definition, sums in double.
void CausalConv(float* x, int m, int channels, int stride, const float* weight, int kernel,
                float* tail);
// Token by token whatever m, the state float32, sums in double.
void GatedDelta(const GatedDeltaHead& head);
}  // namespace reference

}  // namespace tandem::kernels::cpu
