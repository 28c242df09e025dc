// The step's ops every CPU level shares (Backend::embed .. kv_store): plain loops over a step's
// rows, which the compiler vectorises; each is memory-bound at the sizes a step has.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/kernels/cpu/kernels.h"
#include "common/kernels/cpu/kernels_internal.h"
#include "common/kernels/kv_format.h"

namespace tandem::kernels::cpu::internal {

void Embed(const uint16_t* table, int cols, const int32_t* ids, int n, float* out) {
  for (int r = 0; r < n; ++r) {
    const uint16_t* row = table + static_cast<int64_t>(ids[r]) * cols;
    float* y = out + static_cast<int64_t>(r) * cols;
    for (int i = 0; i < cols; ++i) y[i] = Bf16BitsToF32(row[i]);
  }
}

void GatherRows(const float* x, int x_stride, const int32_t* rows, int n, int cols, float* out,
                int out_stride) {
  for (int i = 0; i < n; ++i) {
    const int64_t from = rows != nullptr ? rows[i] : i;
    std::memcpy(out + static_cast<int64_t>(i) * out_stride, x + from * x_stride,
                static_cast<size_t>(cols) * sizeof(float));
  }
}

void AddBias(const float* bias, int rows, int n, float* x) {
  for (int r = 0; r < rows; ++r) {
    float* row = x + static_cast<int64_t>(r) * n;
    for (int i = 0; i < n; ++i) row[i] += bias[i];
  }
}

void Sigmoid(float* x, int n) {
  for (int i = 0; i < n; ++i) x[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

void ClampedSwiglu(const float* gate, const float* up, int n, float alpha, float limit,
                   float* out) {
  for (int i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::clamp(up[i], -limit, limit);
    out[i] = (u + 1.0f) * (g / (1.0f + std::exp(-alpha * g)));
  }
}

void GeluTanhMul(const float* gate, const float* up, int n, float* out) {
  // 0.5 (1 + tanh(z)) = sigmoid(2 z).
  constexpr float kTwoSqrtTwoOverPi = 1.5957691216057308f;
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    const float z = kTwoSqrtTwoOverPi * (g + 0.044715f * g * g * g);
    out[i] = g / (1.0f + std::exp(-z)) * up[i];
  }
}

void SoftCap(float* x, int n, float cap) {
  const float inverse = 1.0f / cap;
  for (int i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inverse);
}

void Scale(float* x, int n, float alpha) {
  for (int i = 0; i < n; ++i) x[i] *= alpha;
}

void AttentionSinks(float* out, const float* lse, const float* sinks, int rows, int heads,
                    int head_dim) {
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      const float keep = 1.0f / (1.0f + std::exp(sinks[h] - lse[r * heads + h]));
      float* o = out + (static_cast<int64_t>(r) * heads + h) * head_dim;
      for (int d = 0; d < head_dim; ++d) o[d] *= keep;
    }
  }
}

void Mul(const float* x, int n, float* y) {
  for (int i = 0; i < n; ++i) y[i] *= x[i];
}

void L2Norm(float* x, int rows, int heads, int n, int stride, float scale) {
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      float* v = x + static_cast<int64_t>(r) * stride + static_cast<int64_t>(h) * n;
      float sum = 0;
      for (int i = 0; i < n; ++i) sum += v[i] * v[i];
      const float s = (1.0f / std::sqrt(sum + 1e-6f)) * scale;
      for (int i = 0; i < n; ++i) v[i] *= s;
    }
  }
}

void DeltaGates(float* a, float* b, int rows, int heads, const float* a_log, const float* dt_bias) {
  for (int h = 0; h < heads; ++h) {
    const float a_scale = -std::exp(a_log[h]);
    for (int r = 0; r < rows; ++r) {
      float& beta = b[static_cast<int64_t>(r) * heads + h];
      float& g = a[static_cast<int64_t>(r) * heads + h];
      beta = 1.0f / (1.0f + std::exp(-beta));
      const float x = g + dt_bias[h];
      g = a_scale * (x > 20.0f ? x : std::log1p(std::exp(x)));  // softplus, threshold 20
    }
  }
}

void KvStore(const PagedKvOut& kv, int rows, const int32_t* positions, const float* k,
             const float* v) {
  const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
  for (int r = 0; r < rows; ++r) {
    const int position = positions[r];
    const size_t block = static_cast<size_t>(kv.block_table[position / kv.block_size]);
    const int offset = position % kv.block_size;
    StoreKvToken(k + r * row, kv.dtype, kv.block_size, kv.num_kv_heads, kv.head_dim, offset,
                 kv.k + block * kv.block_bytes);
    if (kv.v == kv.k) continue;  // keys only: the values are the keys' first values
    StoreKvToken(v + r * row, kv.dtype, kv.block_size, kv.num_kv_heads, kv.head_dim, offset,
                 kv.v + block * kv.block_bytes);
  }
}

}  // namespace tandem::kernels::cpu::internal
