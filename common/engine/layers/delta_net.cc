#include "common/engine/layers/delta_net.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "common/kernels/cpu/thread_pool.h"

namespace tandem::engine {
namespace {

namespace k = kernels::cpu;

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float Silu(float x) { return x * Sigmoid(x); }
// torch.nn.functional.softplus (beta 1, threshold 20).
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

GatedDeltaNetBlock::GatedDeltaNetBlock(const model::ModelConfig& config, KvBlockPool* pool,
                                       std::vector<int64_t> state_offsets)
    : pool_(pool),
      cache_{CacheSpec::Kind::kState, 0, 0, config.linear.state_bytes()},
      state_offsets_(std::move(state_offsets)) {}

absl::Status GatedDeltaNetBlock::Forward(int l, StepContext& ctx, float* out) {
  const model::ModelConfig& c = ctx.w.config;
  const model::DeltaNetConfig& d = c.linear;
  const DeltaNetWeights& W = ctx.w.layers[l].linear;
  const int T = ctx.tokens();
  const int conv_dim = static_cast<int>(d.conv_dim());
  const int key_dim = static_cast<int>(d.key_dim());
  const int value_dim = static_cast<int>(d.value_dim());
  const int kernel = static_cast<int>(d.conv_kernel);
  const int tail = kernel - 1;
  const int nk = static_cast<int>(d.num_key_heads);
  const int nv = static_cast<int>(d.num_value_heads);
  const int dk = static_cast<int>(d.key_head_dim);
  const int dv = static_cast<int>(d.value_head_dim);
  const int group = nv / nk;  // value heads per key head
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));

  Resize(mixed_, T, conv_dim);
  Resize(z_, T, value_dim);
  Resize(b_, T, nv);
  Resize(a_, T, nv);
  Resize(core_, T, value_dim);
  ctx.Linear(ctx.h.data(), T, W.qkv.view(), mixed_.data());
  ctx.Linear(ctx.h.data(), T, W.z.view(), z_.data());
  // Float32 activations for beta and the decay: they compound over every later token.
  ctx.Linear(ctx.h.data(), T, W.b.view(), b_.data(), /*exact=*/true);
  ctx.Linear(ctx.h.data(), T, W.a.view(), a_.data(), /*exact=*/true);

  // Each sequence's tokens are consecutive in the step and in position order.
  for (int first = 0; first < T;) {
    const int seq = ctx.refs[first].seq;
    int n = 1;
    while (first + n < T && ctx.refs[first + n].seq == seq) ++n;
    float* conv_state = reinterpret_cast<float*>(
        pool_->state(ctx.batch[seq].block_table->state_slot()) + state_offsets_[l]);
    float* recurrent = conv_state + static_cast<int64_t>(conv_dim) * tail;  // (nv, dk, dv)
    if (ctx.refs[first].position == 0) {  // a sequence (re)starting: no history
      std::memset(conv_state, 0, static_cast<size_t>(cache_.state_bytes));
    }
    // The causal convolution and SiLU, channel by channel, in place; each channel's tail
    // (its last `tail` inputs, oldest first) moves along.
    k::DefaultThreadPool().ParallelFor(conv_dim, 64, [&](int64_t begin, int64_t end) {
      float window[64 + 1024];
      for (int64_t ch = begin; ch < end; ++ch) {
        const float* w = W.conv.data() + ch * kernel;
        float* history = conv_state + ch * tail;
        for (int done = 0; done < n; done += 1024) {
          const int m = std::min(1024, n - done);
          std::memcpy(window, history, tail * sizeof(float));
          for (int i = 0; i < m; ++i)
            window[tail + i] = mixed_[(first + done + i) * int64_t{conv_dim} + ch];
          for (int i = 0; i < m; ++i) {
            float sum = 0;
            for (int j = 0; j < kernel; ++j) sum += w[j] * window[i + j];
            mixed_[(first + done + i) * int64_t{conv_dim} + ch] = Silu(sum);
          }
          std::memcpy(history, window + m, tail * sizeof(float));
        }
      }
    });
    // q and k L2-normed per key head (q also by 1/sqrt(dk)).
    for (int t = first; t < first + n; ++t) {
      float* row = Row(mixed_, t, conv_dim);
      for (int part = 0; part < 2; ++part) {
        for (int h = 0; h < nk; ++h) {
          float* x = row + part * key_dim + h * dk;
          float sum = 0;
          for (int i = 0; i < dk; ++i) sum += x[i] * x[i];
          const float scale = (1.0f / std::sqrt(sum + 1e-6f)) * (part == 0 ? q_scale : 1.0f);
          for (int i = 0; i < dk; ++i) x[i] *= scale;
        }
      }
    }
    // The recurrence, each value head on its own.
    k::DefaultThreadPool().ParallelFor(nv, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> kv(dv);
      for (int64_t vh = begin; vh < end; ++vh) {
        float* S = recurrent + vh * dk * dv;
        const int kh = static_cast<int>(vh) / group;
        const float a_scale = -std::exp(W.a_log[vh]);
        for (int t = first; t < first + n; ++t) {
          const float* row = Row(mixed_, t, conv_dim);
          const float* q = row + kh * dk;
          const float* key = row + key_dim + kh * dk;
          const float* v = row + 2 * key_dim + vh * dv;
          const float beta = Sigmoid(b_[t * int64_t{nv} + vh]);
          const float decay =
              std::exp(a_scale * Softplus(a_[t * int64_t{nv} + vh] + W.dt_bias[vh]));
          std::fill(kv.begin(), kv.end(), 0.0f);
          for (int i = 0; i < dk; ++i) {
            float* s = S + i * dv;
            for (int j = 0; j < dv; ++j) {
              s[j] *= decay;
              kv[j] += s[j] * key[i];
            }
          }
          for (int j = 0; j < dv; ++j) kv[j] = (v[j] - kv[j]) * beta;  // the delta
          float* o = Row(core_, t, value_dim) + vh * dv;
          std::fill(o, o + dv, 0.0f);
          for (int i = 0; i < dk; ++i) {
            float* s = S + i * dv;
            for (int j = 0; j < dv; ++j) {
              s[j] += key[i] * kv[j];
              o[j] += s[j] * q[i];
            }
          }
        }
      }
    });
    ctx.stats.state_bytes += 2 * cache_.state_bytes;
    first += n;
  }
  // RMSNorm of each head's output, gated by silu(z), then out_proj.
  ctx.ops->rms_norm(core_.data(), T * nv, dv, W.norm.data(), eps, core_.data());
  for (size_t i = 0; i < static_cast<size_t>(T) * value_dim; ++i) core_[i] *= Silu(z_[i]);
  ctx.Linear(core_.data(), T, W.out.view(), out);
  return absl::OkStatus();
}

}  // namespace tandem::engine
