// Choosing tier cut-offs and widths by a budget (`tandem tier --max_accuracy_loss`,
// `--max_expert_bytes`; docs/mixed-width.md, "Choosing a plan by a budget"). The candidates are
// a grid over the tier shares, how many tail ranks a Warm token narrows and a Cold one skips,
// and the narrow width; each is scored on calibration text (never the held-out text it is then
// validated on) by an evaluator that gives its accuracy and the expert bytes it ran.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/moe/calibration.h"
#include "common/moe/tiers.h"
#include "tandem/v1/pruning_plan.pb.h"

namespace tandem::moe {

// The candidate settings for a model: tier shares (hot, warm) in {(0.9, 0.1), (0.7, 0.2),
// (0.5, 0.3), (0.3, 0.4), (0.1, 0.5)}, each with
//   skipping   for every t in [1, top_k): Hot runs every rank at full width, Warm narrows ranks
//              [top_k - t, top_k) to half or a quarter of the expert, Cold skips them (with
//              top-2, the pair rule)
//   narrowing  for (a, b) in {(3/4, 1/2), (1/2, 1/3), (1/2, 1/4), (1/3, 1/6)} of the expert:
//              Hot every rank full, Warm rank 0 full and the rest at a, Cold rank 0 at a and
//              the rest at b
// Widths of quantized experts are rounded up to whole groups.
std::vector<TierOptions> TierCandidates(const model::ModelConfig& config);

// One candidate scored on the calibration text.
struct TierTrial {
  TierOptions options;
  double predicted_byte_share = 0;  // CalibrationByteShare
  double byte_share = 0;            // what the scoring run ran
  double accuracy = 0;
  double nll = 0;
  double accuracy_loss = 0;  // (full - accuracy) / full, the untiered plan's on the same text
  bool screening = false;    // scored on the screening text, not the whole calibration text
};

struct TierBudget {
  // At most one of them set (>= 0): the fewest bytes whose accuracy loss is within it, or the
  // least loss whose bytes are within it.
  double max_accuracy_loss = -1;
  double max_byte_share = -1;
};

struct TierScore {
  double byte_share = 0;
  double accuracy = 0;
  double nll = 0;
};
// Scores `plan` (the candidate's tiers; the full model is a plan without tiers) on the whole
// calibration text, or when `screening` on a part of it (cheaper; the same part every time).
using TierEvaluator =
    std::function<absl::StatusOr<TierScore>(const tandem::v1::PruningPlan&, bool screening)>;

struct TierSelection {
  tandem::v1::PruningPlan plan;  // the chosen candidate's
  TierTrial chosen;
  TierScore full;                 // the untiered plan on the whole text
  std::vector<TierTrial> trials;  // every scoring, in order: the screening, then the checks
};

// Screens every candidate on the screening text (loss is not monotone in bytes across the
// grid, so no candidate is skipped), then checks the most promising on the whole text: for an
// accuracy budget, those within it on the screen, fewest bytes first, until one is within it
// on the whole text (at most `kChecks`); for a bytes budget, the `kChecks` with the least
// screened loss within it, the least whole-text loss among them chosen. INVALID_ARGUMENT for a
// bad budget; FAILED_PRECONDITION naming the closest check when no candidate meets it.
inline constexpr int kChecks = 4;
absl::StatusOr<TierSelection> SelectTiers(const CalibrationStats& stats,
                                          const tandem::v1::PruningPlan& base,
                                          const model::ModelConfig& config,
                                          const TierBudget& budget, const TierEvaluator& evaluate);

}  // namespace tandem::moe
