#include "common/engine/layers/delta_net.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "common/kernels/cpu/thread_pool.h"

namespace tandem::engine {
namespace {

namespace k = kernels::cpu;

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
  const kernels::LinearProduct qkv_z[] = {
      {.x = ctx.h.data(), .b = T, .w = W.qkv.view(), .y = mixed_.data()},
      {.x = ctx.h.data(), .b = T, .w = W.z.view(), .y = z_.data()}};
  ctx.LinearGroup(qkv_z);
  // Float32 activations for beta and the decay: they compound over every later token.
  ctx.Linear(ctx.h.data(), T, W.b.view(), b_.data(), /*exact=*/true);
  ctx.Linear(ctx.h.data(), T, W.a.view(), a_.data(), /*exact=*/true);

  // beta and the decay's log in place of their inputs.
  ctx.ops->delta_gates(a_.data(), b_.data(), T, nv, W.a_log.data(), W.dt_bias.data());
  // Each sequence's tokens are consecutive in the step and in position order.
  for (size_t seq = 0; seq < ctx.batch.size(); ++seq) {
    const int first = ctx.row_begin[seq];
    const int n = ctx.row_begin[seq + 1] - first;
    float* conv_state = reinterpret_cast<float*>(
        pool_->state(ctx.batch[seq].block_table->state_slot()) + state_offsets_[l]);
    float* recurrent = conv_state + static_cast<int64_t>(conv_dim) * tail;  // (nv, dk, dv)
    if (ctx.positions[first] == 0) {  // a sequence (re)starting: no history
      std::memset(conv_state, 0, static_cast<size_t>(cache_.state_bytes));
    }
    float* rows = Row(mixed_, first, conv_dim);
    // The convolution over the channels in slices, one per thread.
    constexpr int kConvSlice = 128;
    k::DefaultThreadPool().ParallelFor(
        (conv_dim + kConvSlice - 1) / kConvSlice, 1, [&](int64_t begin, int64_t end) {
          const int ch0 = static_cast<int>(begin) * kConvSlice;
          const int ch1 = std::min(conv_dim, static_cast<int>(end) * kConvSlice);
          ctx.ops->causal_conv(rows + ch0, n, ch1 - ch0, conv_dim,
                               W.conv.data() + static_cast<int64_t>(ch0) * kernel, kernel,
                               conv_state + static_cast<int64_t>(ch0) * tail);
        });
    // q and k L2-normed per key head (q also by 1/sqrt(dk)).
    ctx.ops->l2_norm(rows, n, nk, dk, conv_dim, q_scale);
    ctx.ops->l2_norm(rows + key_dim, n, nk, dk, conv_dim, 1.0f);
    // The recurrence, each value head on its own.
    k::DefaultThreadPool().ParallelFor(nv, 1, [&](int64_t begin, int64_t end) {
      for (int64_t vh = begin; vh < end; ++vh) {
        const int kh = static_cast<int>(vh) / group;
        ctx.ops->gated_delta(kernels::GatedDeltaHead{
            .q = rows + kh * dk,
            .k = rows + key_dim + kh * dk,
            .qk_stride = conv_dim,
            .v = rows + 2 * key_dim + vh * dv,
            .v_stride = conv_dim,
            .g = a_.data() + first * int64_t{nv} + vh,
            .beta = b_.data() + first * int64_t{nv} + vh,
            .gb_stride = nv,
            .m = n,
            .dk = dk,
            .dv = dv,
            .state = recurrent + vh * dk * dv,
            .out = Row(core_, first, value_dim) + vh * dv,
            .out_stride = value_dim,
        });
      }
    });
    ctx.stats.state_bytes += 2 * cache_.state_bytes;
  }
  // RMSNorm of each head's output, gated by silu(z), then out_proj.
  ctx.ops->rms_norm(core_.data(), T * nv, dv, W.norm.data(), eps, core_.data());
  ctx.ops->silu_mul(z_.data(), core_.data(), T * value_dim, core_.data());
  ctx.Linear(core_.data(), T, W.out.view(), out);
  return absl::OkStatus();
}

}  // namespace tandem::engine
