#include "common/engine/layers/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/engine/overlay.h"
#include "common/util/status.h"

namespace tandem::engine {
namespace {

// gpt-oss's clamped SwiGLU: g * sigmoid(1.702 g).
constexpr float kGptOssSwigluAlpha = 1.702f;

}  // namespace

int ExpertRunWidth(const model::ModelConfig& config, int width) {
  const model::QuantizationConfig& q = config.quantization;
  if (!q.experts || width <= 0) return width;
  const int group = q.group_size;
  return std::min(static_cast<int>(config.intermediate_size), (width + group - 1) / group * group);
}

MoeBlock::MoeBlock(const model::ModelConfig& config) : routed_(config.num_local_experts) {}

absl::Status MoeBlock::Forward(int l, StepContext& ctx, float* out) {
  const model::ModelConfig& c = ctx.w.config;
  const int T = ctx.tokens();
  const int top_k = static_cast<int>(c.num_experts_per_tok);
  Resize(router_logits_, T, c.num_local_experts);
  chosen_.resize(static_cast<size_t>(T) * top_k);
  chosen_w_.resize(chosen_.size());
  chosen_width_.resize(chosen_.size());
  RETURN_IF_ERROR(Route(l, ctx));
  RETURN_IF_ERROR(RunExperts(l, ctx, out));
  if (c.HasSharedExpert()) SharedExpert(l, ctx, out);
  return absl::OkStatus();
}

absl::Status MoeBlock::Route(int l, StepContext& ctx) {
  const model::ModelConfig& c = ctx.w.config;
  const int T = ctx.tokens();
  const int hidden = static_cast<int>(c.hidden_size);
  const int inter = static_cast<int>(c.intermediate_size);
  const int num_experts = static_cast<int>(c.num_local_experts);
  const int top_k = static_cast<int>(c.num_experts_per_tok);
  if (ctx.router == nullptr) {
    // Gemma 4's router reads the residual stream through a norm of its own (its scale and
    // hidden^-0.5 folded into the norm's weight at load).
    const float* in = ctx.h.data();
    if (c.router.gemma) {
      Resize(router_in_, T, hidden);
      for (const StepContext::RowRun& run : ctx.runs) {
        ctx.ops->rms_norm(ctx.x + int64_t{run.begin} * hidden, run.end - run.begin, hidden,
                          ctx.AlwaysOn(run, l).moe.router_norm.data(),
                          static_cast<float>(c.rms_norm_eps), Row(router_in_, run.begin, hidden));
      }
      in = router_in_.data();
    }
    // Float32 activations at every level: the logits pick experts.
    for (const StepContext::RowRun& run : ctx.runs) {
      ctx.Linear(in + int64_t{run.begin} * hidden, run.end - run.begin,
                 ctx.AlwaysOn(run, l).moe.router.view(),
                 Row(router_logits_, run.begin, num_experts),
                 /*exact=*/true);
    }
    if (c.router.logit_bias) {  // gpt-oss's router bias; the model's under any overlay
      ctx.ops->add_bias(ctx.w.layers[l].moe.router_bias.data(), T, num_experts,
                        router_logits_.data());
    }
  } else {
    for (int t = 0; t < T; ++t) {
      ctx.router->Logits(l, ctx.ids[t], ctx.positions[t],
                         absl::MakeSpan(Row(router_logits_, t, num_experts), num_experts));
    }
  }
  // Softmax, top-k and their weights on the backend, over runs of sequences that share a mask.
  const int sequences = static_cast<int>(ctx.batch.size());
  // The router's options; only the mask changes between runs of sequences.
  kernels::RouteSpec spec{.k = top_k, .renormalize = c.norm_topk_prob};
  spec.sigmoid = c.router.sigmoid;
  spec.selection_bias = c.router.selection_bias ? ctx.w.layers[l].moe.router_bias.data() : nullptr;
  spec.groups = static_cast<int>(c.router.groups);
  spec.top_groups = static_cast<int>(c.router.top_groups);
  spec.group_top_two = c.router.group_top_two;
  spec.scaling = static_cast<float>(c.router.scaling);
  for (int s = 0; s < sequences;) {
    const ExpertMask* mask = ctx.Options(s).mask;
    int end = s + 1;
    while (end < sequences && ctx.Options(end).mask == mask) ++end;
    const int first = ctx.row_begin[s];
    const int n = ctx.row_begin[end] - first;
    const bool masked = mask != nullptr && !mask->retained.empty();
    if (masked) {
      mask_bias_.resize(num_experts);
      for (int e = 0; e < num_experts; ++e) {
        mask_bias_[e] = mask->retained[l][e] ? 0.0f : -std::numeric_limits<float>::infinity();
      }
    }
    spec.mask = masked ? mask_bias_.data() : nullptr;
    ctx.ops->route(Row(router_logits_, first, num_experts), n, num_experts, spec,
                   &chosen_[static_cast<size_t>(first) * top_k],
                   &chosen_w_[static_cast<size_t>(first) * top_k]);
    s = end;
  }
  if (c.router.gemma) {  // each chosen expert's weight times its per_expert_scale
    for (const StepContext::RowRun& run : ctx.runs) {
      const std::vector<float>& scale = ctx.AlwaysOn(run, l).moe.expert_scale;
      for (size_t i = static_cast<size_t>(run.begin) * top_k;
           i < static_cast<size_t>(run.end) * top_k; ++i) {
        chosen_w_[i] *= scale[chosen_[i]];
      }
    }
  }
  for (auto& pairs : routed_) pairs.clear();
  for (int t = 0; t < T; ++t) {
    const MoeOptions& options = ctx.Options(ctx.seqs[t]);
    const int32_t* experts = &chosen_[static_cast<size_t>(t) * top_k];
    float* weights = &chosen_w_[static_cast<size_t>(t) * top_k];
    int* widths = &chosen_width_[static_cast<size_t>(t) * top_k];
    std::fill(widths, widths + top_k, inter);
    if (options.widths != nullptr) {
      options.widths->Widths(l, absl::MakeConstSpan(experts, top_k), absl::MakeSpan(weights, top_k),
                             absl::MakeSpan(widths, top_k));
    }
    for (int j = 0; j < top_k; ++j) {
      if (widths[j] < 0 || widths[j] > inter) {
        return absl::InvalidArgumentError(absl::StrCat("width policy gave width ", widths[j],
                                                       " for expert ", experts[j], " of layer ", l,
                                                       "; widths must lie in [0, ", inter, "]"));
      }
      widths[j] = ExpertRunWidth(c, widths[j]);
      if (widths[j] > 0) routed_[experts[j]].push_back({t, widths[j], weights[j]});
    }
  }
  if (ctx.trace != nullptr) {
    ctx.trace->probs.push_back(router_logits_);
    ctx.trace->experts.push_back(chosen_);
    ctx.trace->weights.push_back(chosen_w_);
    ctx.trace->widths.emplace_back(chosen_width_.begin(), chosen_width_.end());
  }
  return absl::OkStatus();
}

void MoeBlock::SharedExpert(int l, StepContext& ctx, float* out) {
  // The always-on shared expert on every token: Qwen2-MoE scales it by
  // sigmoid(shared_expert_gate . h), DeepSeek-MoE adds it as it is.
  const model::ModelConfig& c = ctx.w.config;
  const int T = ctx.tokens();
  const int hidden = static_cast<int>(c.hidden_size);
  Resize(shared_out_, T, hidden);
  shared_scale_.assign(T, 0.0f);
  for (const StepContext::RowRun& run : ctx.runs) {
    const MoeWeights& A = ctx.AlwaysOn(run, l).moe;
    ctx.GatedMlp(A.shared, run.begin, run.end - run.begin, Row(shared_out_, run.begin, hidden));
    if (c.shared_expert_gated) {
      ctx.Linear(Row(ctx.h, run.begin, hidden), run.end - run.begin, A.shared_gate.view(),
                 shared_scale_.data() + run.begin, /*exact=*/true);
    }
  }
  if (c.shared_expert_gated) ctx.ops->sigmoid(shared_scale_.data(), T);
  ctx.ops->add_rows(shared_out_.data(), T, hidden,
                    c.shared_expert_gated ? shared_scale_.data() : nullptr, nullptr, out);
}

absl::Status MoeBlock::RunExperts(int l, StepContext& ctx, float* out) {
  const model::ModelConfig& c = ctx.w.config;
  const int hidden = static_cast<int>(c.hidden_size);
  std::fill(out, out + int64_t{ctx.tokens()} * hidden, 0.0f);
  // The experts the step runs, widest first (ties by index). A token's two outputs (top-2) add
  // to the same float in either order, so the order does not change results; with more experts
  // per token it changes them by rounding only.
  loads_.clear();
  for (size_t e = 0; e < routed_.size(); ++e) {
    std::vector<Routed>& pairs = routed_[e];
    if (pairs.empty()) continue;
    // Widest first; token order within a width, so results do not depend on the batch.
    std::stable_sort(pairs.begin(), pairs.end(),
                     [](const Routed& a, const Routed& b) { return a.width > b.width; });
    loads_.push_back({static_cast<int>(e), pairs.front().width});
  }
  std::stable_sort(loads_.begin(), loads_.end(),
                   [](const ExpertLoad& a, const ExpertLoad& b) { return a.width > b.width; });
  if (ctx.provider != nullptr) RETURN_IF_ERROR(ctx.provider->BeginLayer(l, loads_));
  // Every (expert, width) run of the layer: rows [row, row + m) of expert_in_ / expert_out_,
  // values [offset, offset + m * width) of the layer's gate / up / act (held a wave at a time).
  runs_.clear();
  int64_t rows = 0, values = 0;
  absl::Status status;
  for (const ExpertLoad& load : loads_) {
    const int e = load.expert;
    const std::vector<Routed>& pairs = routed_[e];
    ExpertView E;
    if (ctx.provider != nullptr) {
      absl::StatusOr<ExpertView> view = ctx.provider->Wait(l, e, load.width);
      if (!view.ok()) {
        status = view.status();
        break;
      }
      E = *view;
    } else {
      const ExpertWeights& W = ctx.w.layers[l].moe.experts[e];
      E = {W.gate.view(), W.up.view(), W.down.view()};
    }
    for (size_t begin = 0; begin < pairs.size();) {
      const int width = pairs[begin].width;
      size_t end = begin;
      while (end < pairs.size() && pairs[end].width == width) ++end;
      const int m = static_cast<int>(end - begin);
      runs_.push_back({E, e, width, m, rows, values});
      pair_tokens_.resize(rows + m);
      pair_weights_.resize(rows + m);
      for (int i = 0; i < m; ++i) {
        pair_tokens_[rows + i] = pairs[begin + i].token;
        pair_weights_[rows + i] = pairs[begin + i].weight;
      }
      rows += m;
      values += int64_t{m} * width;
      begin = end;
    }
  }
  if (status.ok() && rows > 0) {
    Resize(expert_in_, rows, hidden);
    Resize(expert_out_, rows, hidden);
    ctx.ops->gather_rows(ctx.h.data(), hidden, pair_tokens_.data(), static_cast<int>(rows), hidden,
                         expert_in_.data(), hidden);
    const int64_t before = ctx.stats.weight_bytes;
    for (size_t first = 0; first < runs_.size();) {
      // A wave of runs whose gate, up and act values stay within kWaveValues each (at least
      // one run): every run's gate and up as one group of products, the activations at once,
      // every run's down as another group, then their weighted sums in run order.
      size_t last = first + 1;
      const int64_t base = runs_[first].offset;
      while (last < runs_.size() && runs_[last].end() - base <= kWaveValues) ++last;
      const int64_t wave_values = runs_[last - 1].end() - base;
      Resize(gate_, wave_values, 1);
      Resize(up_, wave_values, 1);
      Resize(act_, wave_values, 1);
      products_.clear();
      for (size_t i = first; i < last; ++i) {
        const ExpertRun& run = runs_[i];
        // gate and up: the first `width` rows; down: the first `width` columns of each row.
        kernels::PackedMatrix gate = run.view.gate, up = run.view.up;
        gate.rows = up.rows = run.width;
        const float* in = Row(expert_in_, run.row, hidden);
        products_.push_back(
            {.x = in, .b = run.m, .w = gate, .y = gate_.data() + run.offset - base});
        products_.push_back({.x = in, .b = run.m, .w = up, .y = up_.data() + run.offset - base});
      }
      ctx.LinearGroup(products_);
      const std::vector<ExpertWeights>& resident = ctx.w.layers[l].moe.experts;
      if (c.expert_bias) {  // an expert's first `width` gate and up biases on each of its rows
        for (size_t i = first; i < last; ++i) {
          const ExpertRun& run = runs_[i];
          const ExpertWeights& W = resident[run.expert];
          ctx.ops->add_bias(W.gate_bias.data(), run.m, run.width, gate_.data() + run.offset - base);
          ctx.ops->add_bias(W.up_bias.data(), run.m, run.width, up_.data() + run.offset - base);
        }
      }
      if (c.swiglu_limit > 0) {
        ctx.ops->clamped_swiglu(gate_.data(), up_.data(), static_cast<int>(wave_values),
                                kGptOssSwigluAlpha, static_cast<float>(c.swiglu_limit),
                                act_.data());
      } else {
        ctx.Activate(gate_.data(), up_.data(), static_cast<int>(wave_values), act_.data());
      }
      products_.clear();
      for (size_t i = first; i < last; ++i) {
        const ExpertRun& run = runs_[i];
        kernels::PackedMatrix down = run.view.down;
        down.cols = run.width;
        products_.push_back({.x = act_.data() + run.offset - base,
                             .b = run.m,
                             .w = down,
                             .y = Row(expert_out_, run.row, hidden)});
      }
      ctx.LinearGroup(products_);
      if (c.expert_bias) {
        for (size_t i = first; i < last; ++i) {
          const ExpertRun& run = runs_[i];
          ctx.ops->add_bias(resident[run.expert].down_bias.data(), run.m, hidden,
                            Row(expert_out_, run.row, hidden));
        }
      }
      if (ctx.observer != nullptr) {
        for (size_t i = first; i < last; ++i) {
          const ExpertRun& run = runs_[i];
          ctx.observer->OnExpert(
              l, run.expert, run.width, absl::MakeConstSpan(pair_tokens_).subspan(run.row, run.m),
              act_.data() + run.offset - base, Row(expert_out_, run.row, hidden));
        }
      }
      const int64_t row = runs_[first].row;
      const int wave_rows = static_cast<int>(runs_[last - 1].row + runs_[last - 1].m - row);
      ctx.ops->add_rows(Row(expert_out_, row, hidden), wave_rows, hidden,
                        pair_weights_.data() + row, pair_tokens_.data() + row, out);
      first = last;
    }
    ctx.stats.expert_weight_bytes += ctx.stats.weight_bytes - before;
    ctx.stats.expert_runs += static_cast<int>(runs_.size());
  }
  if (ctx.provider != nullptr) ctx.provider->EndLayer(l);
  return status;
}

}  // namespace tandem::engine
