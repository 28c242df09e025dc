#include "common/engine/layers/dense_and_moe.h"

#include "common/util/status.h"

namespace tandem::engine {

absl::Status DenseAndMoeBlock::Forward(int l, StepContext& ctx, float* out) {
  const model::ModelConfig& c = ctx.w.config;
  const int T = ctx.tokens();
  const int hidden = static_cast<int>(c.hidden_size);
  const float eps = static_cast<float>(c.rms_norm_eps);
  Resize(dense_out_, T, hidden);
  // The dense MLP on the block's normed input, then its own norm.
  for (const StepContext::RowRun& run : ctx.runs) {
    const LayerWeights& A = ctx.AlwaysOn(run, l);
    float* rows = Row(dense_out_, run.begin, hidden);
    ctx.GatedMlp(A.dense, run.begin, run.end - run.begin, rows);
    ctx.ops->rms_norm(rows, run.end - run.begin, hidden, A.post_dense_norm.data(), eps, rows);
  }
  // The experts' input: the residual stream under its own norm.
  for (const StepContext::RowRun& run : ctx.runs) {
    ctx.ops->rms_norm(ctx.x + int64_t{run.begin} * hidden, run.end - run.begin, hidden,
                      ctx.AlwaysOn(run, l).pre_moe_norm.data(), eps, Row(ctx.h, run.begin, hidden));
  }
  RETURN_IF_ERROR(moe_.Forward(l, ctx, out));
  for (const StepContext::RowRun& run : ctx.runs) {
    float* rows = out + int64_t{run.begin} * hidden;
    ctx.ops->rms_norm(rows, run.end - run.begin, hidden, ctx.AlwaysOn(run, l).post_moe_norm.data(),
                      eps, rows);
  }
  ctx.ops->add_rows(dense_out_.data(), T, hidden, nullptr, nullptr, out);
  return absl::OkStatus();
}

}  // namespace tandem::engine
