#include "common/moe/tier_search.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/util/status.h"

namespace tandem::moe {

std::vector<TierOptions> TierCandidates(const model::ModelConfig& config) {
  const int k = static_cast<int>(config.num_experts_per_tok);
  const int full = static_cast<int>(config.intermediate_size);
  // Quantized experts run whole groups (a narrow load is a prefix of whole bundles).
  const int group = config.quantization.experts && config.quantization.group_size > 0
                        ? config.quantization.group_size
                        : 1;
  const auto width = [&](int numerator, int denominator) {
    const int w = full * numerator / denominator;
    return std::min(full, std::max(group, (w + group - 1) / group * group));
  };
  std::vector<TierOptions> out;
  const std::pair<double, double> shares[] = {
      {0.9, 0.1}, {0.7, 0.2}, {0.5, 0.3}, {0.3, 0.4}, {0.1, 0.5}};
  for (const auto& [hot, warm] : shares) {
    TierOptions base;
    base.hot_share = hot;
    base.warm_share = warm;
    // Skipping: Warm narrows the last t ranks, Cold skips them.
    for (int t = 1; t < k; ++t) {
      for (int narrow : {width(1, 2), width(1, 4)}) {
        TierOptions o = base;
        o.warm_width = narrow;
        if (k > 2) {  // with top-2 the empty lists are this rule
          o.hot_widths.assign(k, full);
          o.warm_widths.assign(k, full);
          o.cold_widths.assign(k, full);
          for (int r = k - t; r < k; ++r) {
            o.warm_widths[r] = narrow;
            o.cold_widths[r] = 0;
          }
        }
        out.push_back(std::move(o));
      }
    }
    // Narrowing: Warm runs rank 0 whole and the rest at a, Cold rank 0 at a and the rest at b.
    for (const auto& [a, b] : {std::pair{width(3, 4), width(1, 2)},
                               {width(1, 2), width(1, 3)},
                               {width(1, 2), width(1, 4)},
                               {width(1, 3), width(1, 6)}}) {
      TierOptions o = base;
      o.warm_width = std::min(a, full - 1);
      o.hot_widths.assign(k, full);
      o.warm_widths.assign(k, a);
      o.warm_widths[0] = full;
      o.cold_widths.assign(k, b);
      o.cold_widths[0] = a;
      out.push_back(std::move(o));
    }
  }
  return out;
}

absl::StatusOr<TierSelection> SelectTiers(const CalibrationStats& stats,
                                          const tandem::v1::PruningPlan& base,
                                          const model::ModelConfig& config,
                                          const TierBudget& budget, const TierEvaluator& evaluate) {
  const bool by_loss = budget.max_accuracy_loss >= 0;
  if (by_loss == (budget.max_byte_share >= 0) || budget.max_byte_share > 1) {
    return absl::InvalidArgumentError(
        "give one budget: a maximum accuracy loss, or a maximum share of expert bytes in [0, 1]");
  }
  tandem::v1::PruningPlan untiered = base;
  untiered.clear_tiers();
  for (auto& layer : *untiered.mutable_layers()) layer.clear_pairs();
  TierSelection selection;
  ASSIGN_OR_RETURN(selection.full, evaluate(untiered));
  if (selection.full.accuracy <= 0) {
    return absl::FailedPreconditionError("the full model scores no token right on this text");
  }

  struct Candidate {
    TierOptions options;
    tandem::v1::PruningPlan plan;
    double predicted = 0;
  };
  std::vector<Candidate> candidates;
  for (TierOptions& options : TierCandidates(config)) {
    Candidate c{std::move(options), untiered, 0};
    RETURN_IF_ERROR(AssignTiers(stats, c.options, nullptr, config, &c.plan));
    c.predicted = CalibrationByteShare(c.plan, config);
    candidates.push_back(std::move(c));
  }
  std::stable_sort(
      candidates.begin(), candidates.end(),
      [](const Candidate& x, const Candidate& y) { return x.predicted < y.predicted; });
  std::map<size_t, TierTrial> scored;
  const auto trial = [&](size_t i) -> absl::StatusOr<TierTrial> {
    if (auto it = scored.find(i); it != scored.end()) return it->second;
    ASSIGN_OR_RETURN(TierScore score, evaluate(candidates[i].plan));
    TierTrial t{candidates[i].options,
                candidates[i].predicted,
                score.byte_share,
                score.accuracy,
                score.nll,
                (selection.full.accuracy - score.accuracy) / selection.full.accuracy};
    selection.trials.push_back(t);
    scored[i] = t;
    return t;
  };
  const auto within = [&](const TierTrial& t) {
    return by_loss ? t.accuracy_loss <= budget.max_accuracy_loss
                   : t.byte_share <= budget.max_byte_share;
  };
  const size_t n = candidates.size();
  if (by_loss) {
    // The cheapest candidate within the loss, assuming loss falls as bytes grow.
    size_t lo = 0, hi = n - 1;
    ASSIGN_OR_RETURN(TierTrial dearest, trial(hi));
    if (within(dearest)) {
      while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        ASSIGN_OR_RETURN(TierTrial t, trial(mid));
        if (within(t)) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      for (size_t i = lo; i > 0 && i + 4 > lo; --i) RETURN_IF_ERROR(trial(i - 1).status());
    }
  } else {
    // Those predicted nearest the budget, dearest first (loss falls as bytes grow): eight within
    // it and four just above it, since a run's bytes differ from the prediction.
    int below = 0, above = 0;
    for (size_t i = n; i > 0 && below < 8; --i) {
      const double p = candidates[i - 1].predicted;
      if (p > budget.max_byte_share + 0.03) continue;
      int& taken = p > budget.max_byte_share ? above : below;
      if (&taken == &above && above >= 4) continue;
      RETURN_IF_ERROR(trial(i - 1).status());
      ++taken;
    }
  }
  const TierTrial* best = nullptr;
  size_t best_index = 0;
  for (const auto& [i, t] : scored) {
    if (!within(t)) continue;
    const bool better =
        best == nullptr ||
        (by_loss ? t.byte_share < best->byte_share ||
                       (t.byte_share == best->byte_share && t.accuracy_loss < best->accuracy_loss)
                 : t.accuracy_loss < best->accuracy_loss ||
                       (t.accuracy_loss == best->accuracy_loss && t.byte_share < best->byte_share));
    if (better) best = &t, best_index = i;
  }
  if (best == nullptr) {
    const TierTrial* closest = nullptr;
    for (const auto& [i, t] : scored) {
      if (closest == nullptr || (by_loss ? t.accuracy_loss < closest->accuracy_loss
                                         : t.byte_share < closest->byte_share)) {
        closest = &t;
      }
    }
    return absl::FailedPreconditionError(
        closest == nullptr
            ? std::string("no candidate was scored within the budget")
            : absl::StrCat("no candidate meets the budget; the closest scored ran ",
                           closest->byte_share, " of the expert bytes at an accuracy loss of ",
                           closest->accuracy_loss));
  }
  selection.chosen = *best;
  selection.plan = candidates[best_index].plan;
  return selection;
}

}  // namespace tandem::moe
