// Reference kernels: the test oracle. Plain loops, written to be obviously correct rather than
// fast; sums are accumulated in double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/kernels/cpu/kernels.h"
#include "common/kernels/cpu/kernels_internal.h"

namespace tandem::kernels::cpu::reference {

namespace {

// Outputs [row_begin, row_end) of every activation row.
void LinearRows(const float* x, int b, const PackedMatrix& w, float* y, int row_begin,
                int row_end) {
  for (int64_t i = 0; i < b; ++i) {
    for (int j = row_begin; j < row_end; ++j) {
      double sum = 0;
      for (int k = 0; k < w.cols; ++k) sum += double{PackedElement(w, j, k)} * x[i * w.cols + k];
      y[i * w.rows + j] = static_cast<float>(sum);
    }
  }
}

}  // namespace

// X (b, w.cols) @ W^T -> Y (b, w.rows), over W's dequantized elements
void Linear(const float* x, int b, const PackedMatrix& w, float* y) {
  LinearRows(x, b, w, y, 0, w.rows);
}

// x (b,n), weight (n,) -> out (b,n) = x / sqrt(mean(x^2) + eps) * weight
void RmsNorm(const float* x, int b, int n, const float* weight, float eps, float* out) {
  for (int64_t i = 0; i < b; ++i) {
    const float* row = x + i * n;
    double sum_squares = 0;
    for (int k = 0; k < n; ++k) sum_squares += double{row[k]} * row[k];
    const float inv_rms = static_cast<float>(1.0 / std::sqrt(sum_squares / n + eps));
    for (int k = 0; k < n; ++k) out[i * n + k] = weight[k] * (row[k] * inv_rms);
  }
}

// The first rope.rotary_dim of each of x's heads (head_dim apart) rotated in place at `pos`.
void Rope(float* x, int heads, int head_dim, int pos, const RopeSpec& rope) {
  const int half = rope.rotary_dim / 2;
  for (int h = 0; h < heads; ++h) {
    float* head = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * rope.inv_freq[i];
      const float c = std::cos(angle);
      const float s = std::sin(angle);
      const int a = rope.interleaved ? 2 * i : i;
      const int b = rope.interleaved ? 2 * i + 1 : i + half;
      const float x1 = head[a];
      const float x2 = head[b];
      head[a] = x1 * c - x2 * s;
      head[b] = x2 * c + x1 * s;
    }
  }
}

// x (n,) <- exp(x - max) / sum(exp(x - max))
void Softmax(float* x, int n) {
  if (n <= 0) return;
  float max_value = x[0];
  for (int i = 1; i < n; ++i) max_value = std::max(max_value, x[i]);
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_value);
    sum += x[i];
  }
  const float inv_sum = static_cast<float>(1.0 / sum);
  for (int i = 0; i < n; ++i) x[i] *= inv_sum;
}

double LogSumExp(const float* x, int n) {
  float max_value = x[0];
  for (int i = 1; i < n; ++i) max_value = std::max(max_value, x[i]);
  if (!std::isfinite(max_value)) return max_value;  // all -inf (or a +inf)
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(x[i] - max_value);
  return max_value + std::log(sum);
}

void TopK(const float* x, int n, int k, int32_t* out) {
  internal::StartTopK(x, k, out);
  for (int32_t t = k; t < n; ++t) {
    if (x[t] > x[out[k - 1]]) internal::InsertTopK(x, out, k, t);
  }
}

// gate (n,), up (n,) -> out (n,) = gate / (1 + exp(-gate)) * up
void SiluMul(const float* gate, const float* up, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// y (n,) += alpha * x (n,)
void Axpy(float alpha, const float* x, int n, float* y) {
  for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// q (num_heads, head_dim) -> out (num_heads, head_dim) = softmax(scale * q.K^T) @ V over
// positions [context_begin, context_end), K and V dequantised to float32 rows (LoadKvRow).
void PagedAttentionRange(const float* q, int num_heads, const PagedKv& kv, int context_begin,
                         int context_end, float scale, int kv_head_begin, int kv_head_end,
                         float* out, float* lse) {
  const int group = num_heads / kv.num_kv_heads;
  const int n = std::max(0, context_end - context_begin);
  std::vector<double> scores(n);
  std::vector<float> row(kv.head_dim);
  for (int h = kv_head_begin * group; h < kv_head_end * group; ++h) {
    const int kv_head = h / group;
    const float* qh = q + h * kv.head_dim;
    double max_score = -INFINITY;
    for (int t = 0; t < n; ++t) {
      LoadKvRow(kv, /*value=*/false, context_begin + t, kv_head, row.data());
      double dot = 0;
      for (int i = 0; i < kv.head_dim; ++i) dot += double{qh[i]} * row[i];
      scores[t] = dot * scale;
      max_score = std::max(max_score, scores[t]);
    }
    double sum = 0;
    for (int t = 0; t < n; ++t) {
      scores[t] = std::exp(scores[t] - max_score);
      sum += scores[t];
    }
    std::vector<double> acc(kv.head_dim, 0.0);
    for (int t = 0; t < n; ++t) {
      LoadKvRow(kv, /*value=*/true, context_begin + t, kv_head, row.data());
      for (int i = 0; i < kv.head_dim; ++i) acc[i] += scores[t] / sum * row[i];
    }
    for (int i = 0; i < kv.head_dim; ++i) out[h * kv.head_dim + i] = static_cast<float>(acc[i]);
    if (lse != nullptr) {
      lse[h] = n == 0 ? -INFINITY : static_cast<float>(max_score + std::log(sum));
    }
  }
}

void PagedAttention(const float* q, int num_heads, const PagedKv& kv, int context_len, float scale,
                    float* out) {
  PagedAttentionRange(q, num_heads, kv, 0, context_len, scale, 0, kv.num_kv_heads, out, nullptr);
}

// The convolution by its definition: each output from the kernel's inputs, read from the tail
// before x's first row.
void CausalConv(float* x, int m, int channels, int stride, const float* weight, int kernel,
                float* tail) {
  const int keep = kernel - 1;
  std::vector<float> in(static_cast<size_t>(m) * channels);
  for (int t = 0; t < m; ++t) {
    for (int ch = 0; ch < channels; ++ch)
      in[static_cast<size_t>(t) * channels + ch] = x[static_cast<size_t>(t) * stride + ch];
  }
  auto input = [&](int t, int ch) {  // t < 0: the tail's (keep + t)-th
    return t >= 0 ? in[static_cast<size_t>(t) * channels + ch]
                  : tail[static_cast<size_t>(ch) * keep + keep + t];
  };
  for (int t = 0; t < m; ++t) {
    for (int ch = 0; ch < channels; ++ch) {
      double sum = 0;
      for (int j = 0; j < kernel; ++j) {
        sum += double{weight[static_cast<size_t>(ch) * kernel + j]} * input(t - keep + j, ch);
      }
      x[static_cast<size_t>(t) * stride + ch] = static_cast<float>(sum / (1.0 + std::exp(-sum)));
    }
  }
  std::vector<float> next(static_cast<size_t>(channels) * keep);
  for (int ch = 0; ch < channels; ++ch) {
    for (int j = 0; j < keep; ++j)
      next[static_cast<size_t>(ch) * keep + j] = input(m - keep + j, ch);
  }
  std::copy(next.begin(), next.end(), tail);
}

// The recurrence token by token, the state float32 and each sum in double.
void GatedDelta(const GatedDeltaHead& h) {
  std::vector<float> delta(h.dv);
  for (int t = 0; t < h.m; ++t) {
    const float* q = h.q + static_cast<size_t>(t) * h.qk_stride;
    const float* k = h.k + static_cast<size_t>(t) * h.qk_stride;
    const float* v = h.v + static_cast<size_t>(t) * h.v_stride;
    const float decay = std::exp(h.g[static_cast<size_t>(t) * h.gb_stride]);
    const double beta = h.beta[static_cast<size_t>(t) * h.gb_stride];
    float* S = h.state;
    for (int i = 0; i < h.dk * h.dv; ++i) S[i] *= decay;
    for (int j = 0; j < h.dv; ++j) {
      double read = 0;
      for (int i = 0; i < h.dk; ++i) read += double{S[i * h.dv + j]} * k[i];
      delta[j] = static_cast<float>((v[j] - read) * beta);
    }
    for (int i = 0; i < h.dk; ++i) {
      for (int j = 0; j < h.dv; ++j) S[i * h.dv + j] += k[i] * delta[j];
    }
    float* o = h.out + static_cast<size_t>(t) * h.out_stride;
    for (int j = 0; j < h.dv; ++j) {
      double sum = 0;
      for (int i = 0; i < h.dk; ++i) sum += double{S[i * h.dv + j]} * q[i];
      o[j] = static_cast<float>(sum);
    }
  }
}

}  // namespace tandem::kernels::cpu::reference

namespace tandem::kernels::cpu::internal {

const LinearKernel kReferenceLinear{
    .prepare = nullptr,
    .panels =
        [](const LinearProduct& p, const ActivationScratch&, int begin, int end) {
          reference::LinearRows(p.x, p.b, p.w, p.y, begin * kPanelRows,
                                std::min(p.w.rows, end * kPanelRows));
        },
    .panel_align = [](int, const PackedMatrix&) { return 1; },
};

}  // namespace tandem::kernels::cpu::internal
