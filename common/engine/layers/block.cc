#include "common/engine/layers/block.h"

#include "common/engine/overlay.h"

namespace tandem::engine {

void StepContext::Begin(absl::Span<const StepInput> batch_in, const MoeOptions& moe_in,
                        const kernels::Backend* ops_in, RouterTrace* trace_in) {
  batch = batch_in;
  moe = &moe_in;
  ops = ops_in;
  trace = trace_in;
  seqs.clear();
  ids.clear();
  positions.clear();
  row_begin.clear();
  for (size_t s = 0; s < batch.size(); ++s) {
    row_begin.push_back(static_cast<int>(ids.size()));
    for (size_t i = 0; i < batch[s].tokens.size(); ++i) {
      seqs.push_back(static_cast<int>(s));
      ids.push_back(batch[s].tokens[i]);
      positions.push_back(batch[s].start_position + static_cast<int>(i));
    }
  }
  row_begin.push_back(static_cast<int>(ids.size()));
  // Rows by always-on weights: usually one run; in colocated mode with an overlay, prompts run
  // the model's and generated tokens the overlay's.
  runs.clear();
  for (size_t s = 0, row = 0; s < batch.size(); ++s) {
    const DecoderOverlay* overlay = Options(static_cast<int>(s)).overlay;
    const int end = static_cast<int>(row + batch[s].tokens.size());
    if (!runs.empty() && runs.back().overlay == overlay) {
      runs.back().end = end;
    } else {
      runs.push_back({static_cast<int>(row), end, overlay});
    }
    row = end;
  }
  stats = StepStats();
  stats.tokens = tokens();
}

const LayerWeights& StepContext::AlwaysOn(const RowRun& run, int l) const {
  return run.overlay != nullptr ? run.overlay->layers[l] : w.layers[l];
}

void StepContext::Linear(const float* in, int rows, const kernels::PackedMatrix& m, float* out,
                         bool exact) {
  (exact ? ops->linear_f32 : ops->linear)(in, rows, m, out);
  Count(rows, m);
}

void StepContext::LinearGroup(absl::Span<const kernels::LinearProduct> products) {
  ops->linear_group(products.data(), static_cast<int>(products.size()));
  for (const kernels::LinearProduct& p : products) Count(p.b, p.w);
}

void StepContext::Count(int rows, const kernels::PackedMatrix& m) {
  stats.weight_bytes += m.bytes_read();
  stats.matmul_flops += int64_t{2} * rows * m.rows * m.cols;
}

void StepContext::Activate(const float* gate, const float* up, int n, float* out) const {
  if (w.config.activation == model::Activation::kGeluTanh) {
    ops->gelu_tanh_mul(gate, up, n, out);
  } else {
    ops->silu_mul(gate, up, n, out);
  }
}

void StepContext::GatedMlp(const ExpertWeights& m, int row0, int rows, float* out) {
  const int64_t hidden = w.config.hidden_size;
  const int width = m.gate.rows();
  Resize(gate_, rows, width);
  Resize(up_, rows, width);
  Resize(act_, rows, width);
  const float* in = h.data() + row0 * hidden;
  const kernels::LinearProduct gate_up[] = {
      {.x = in, .b = rows, .w = m.gate.view(), .y = gate_.data()},
      {.x = in, .b = rows, .w = m.up.view(), .y = up_.data()}};
  LinearGroup(gate_up);
  Activate(gate_.data(), up_.data(), rows * width, act_.data());
  Linear(act_.data(), rows, m.down.view(), out);
}

}  // namespace tandem::engine
