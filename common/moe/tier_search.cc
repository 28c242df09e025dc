#include "common/moe/tier_search.h"

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_set.h"
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
  const tandem::v1::PruningPlan untiered = WithoutTiers(base);
  TierSelection selection;
  ASSIGN_OR_RETURN(TierScore screened_full, evaluate(untiered, true));
  ASSIGN_OR_RETURN(selection.full, evaluate(untiered, false));
  if (selection.full.accuracy <= 0 || screened_full.accuracy <= 0) {
    return absl::FailedPreconditionError("the untiered plan scores no token right on this text");
  }

  struct Candidate {
    TierOptions options;
    tandem::v1::PruningPlan plan;
    double predicted = 0;
    TierTrial screen;
  };
  std::vector<Candidate> candidates;
  absl::flat_hash_set<std::string> seen;  // settings that make the same plan are scored once
  for (TierOptions& options : TierCandidates(config)) {
    Candidate c{std::move(options), untiered, 0, {}};
    RETURN_IF_ERROR(AssignTiers(stats, c.options, nullptr, config, &c.plan));
    tandem::v1::PruningPlan key = c.plan;
    key.mutable_tiers()->clear_hot_share();
    key.mutable_tiers()->clear_warm_share();
    if (!seen.insert(key.SerializeAsString()).second) continue;
    c.predicted = CalibrationByteShare(c.plan, config);
    candidates.push_back(std::move(c));
  }
  const auto score = [&](Candidate& c, bool screening) -> absl::StatusOr<TierTrial> {
    ASSIGN_OR_RETURN(TierScore s, evaluate(c.plan, screening));
    const double full = screening ? screened_full.accuracy : selection.full.accuracy;
    TierTrial t{c.options, c.predicted, s.byte_share, s.accuracy, s.nll, (full - s.accuracy) / full,
                screening};
    selection.trials.push_back(t);
    return t;
  };
  const auto within = [&](const TierTrial& t) {
    return by_loss ? t.accuracy_loss <= budget.max_accuracy_loss
                   : t.byte_share <= budget.max_byte_share;
  };
  std::vector<size_t> passing;
  for (size_t i = 0; i < candidates.size(); ++i) {
    ASSIGN_OR_RETURN(candidates[i].screen, score(candidates[i], true));
    if (within(candidates[i].screen)) passing.push_back(i);
  }
  // The most promising first: fewest bytes within the loss, or least loss within the bytes.
  std::stable_sort(passing.begin(), passing.end(), [&](size_t x, size_t y) {
    const TierTrial &a = candidates[x].screen, &b = candidates[y].screen;
    return by_loss ? a.byte_share < b.byte_share : a.accuracy_loss < b.accuracy_loss;
  });
  std::optional<TierTrial> best, closest;
  size_t best_index = 0;
  for (size_t n = 0; n < passing.size() && n < static_cast<size_t>(kChecks); ++n) {
    ASSIGN_OR_RETURN(TierTrial t, score(candidates[passing[n]], false));
    if (!closest ||
        (by_loss ? t.accuracy_loss < closest->accuracy_loss : t.byte_share < closest->byte_share)) {
      closest = t;
    }
    if (!within(t)) continue;
    if (!best ||
        (by_loss ? t.byte_share < best->byte_share : t.accuracy_loss < best->accuracy_loss)) {
      best = t;
      best_index = passing[n];
    }
    if (by_loss) break;  // the fewest screened bytes that hold on the whole text
  }
  if (!best) {
    return absl::FailedPreconditionError(
        !closest ? std::string("no candidate meets the budget on the screening text")
                 : absl::StrCat("no candidate meets the budget on the whole text; the closest "
                                "checked ran ",
                                closest->byte_share, " of the expert bytes at an accuracy loss of ",
                                closest->accuracy_loss));
  }
  selection.chosen = *best;
  selection.plan = candidates[best_index].plan;
  return selection;
}

}  // namespace tandem::moe
