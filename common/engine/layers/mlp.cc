#include "common/engine/layers/mlp.h"

namespace tandem::engine {

absl::Status DenseMlpBlock::Forward(int l, StepContext& ctx, float* out) {
  const int64_t hidden = ctx.w.config.hidden_size;
  for (const StepContext::RowRun& run : ctx.runs) {
    ctx.GatedMlp(ctx.AlwaysOn(run, l).dense, run.begin, run.end - run.begin,
                 out + run.begin * hidden);
  }
  if (ctx.trace != nullptr) {  // the trace keeps one (empty) entry per layer
    ctx.trace->probs.emplace_back();
    ctx.trace->experts.emplace_back();
    ctx.trace->weights.emplace_back();
    ctx.trace->widths.emplace_back();
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine
