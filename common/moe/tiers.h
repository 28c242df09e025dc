// Combination-aware mixed width (docs/design.md, docs/mixed-width.md): every routed pair of
// retained experts of a layer gets a tier from its calibration frequency, and one of its two
// experts is its dominant. A token's tier is its leading pair's (its two experts of highest
// router weight: with top-2 its only pair; the calibration counts exactly those pairs), and
// the tier gives a width to each router rank: rank 0 the pair's dominant, rank 1 its other
// expert, ranks 2.. the rest in router order. The pair rule, and the default for every k:
//   Hot   every rank at full width
//   Warm  rank 1 (the auxiliary) at the plan's warm width, the rest full
//   Cold  rank 1 skipped, the rest full; the weights of what runs are scaled to the routed
//         total (1 for renormalised top-k: with top-2 the dominant's weight becomes 1)
// A plan may give each tier its own widths by rank instead (TierSettings.hot_widths ...), e.g.
// for top-8 a Warm token narrowing ranks 4-7 and a Cold one skipping them.
// Tiers are cut by cumulative share of routed tokens: pairs by descending count, the most
// frequent carrying hot_share of the tokens are Hot, the next warm_share Warm, the rest Cold
// (pairs never seen in calibration included). The checkpoint must hold its neurons in
// importance order (tandem reorder) for a narrow width to keep the important ones.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/forward.h"
#include "common/model/config.h"
#include "common/model/model_dir.h"
#include "common/model/tokenizer.h"
#include "common/moe/calibration.h"
#include "tandem/v1/pruning_plan.pb.h"

namespace tandem::moe {

// Defaults: the setting of docs/mixed-width.md that stays within the published 3.6% accuracy
// loss on the tiny model (2.7%, 90% of the expert bytes).
struct TierOptions {
  double hot_share = 0.7;
  double warm_share = 0.2;
  int warm_width = 0;  // 0: half the intermediate size
  tandem::v1::Dominance dominance = tandem::v1::DOMINANCE_ROUTER_WEIGHT;
  // Widths by router rank for each tier (top_k entries, 0 skips); empty: the pair rule.
  std::vector<int> hot_widths = {}, warm_widths = {}, cold_widths = {};
};

// The widths by rank each tier of `plan` runs (index PairTier: HOT, WARM, COLD; entry 0 unused),
// the plan's own or the pair rule's. The plan must have tiers.
std::vector<std::vector<int>> RankWidths(const tandem::v1::PruningPlan& plan,
                                         const model::ModelConfig& config);

// The share of full-width expert bytes the plan's tiers run over its calibration tokens (every
// listed pair weighted by its count): what its decoder is expected to load. 1 without tiers.
double CalibrationByteShare(const tandem::v1::PruningPlan& plan, const model::ModelConfig& config);

// How much masking each expert alone raises the mean loss (nats per token) of the full model
// on `text_path` (the perplexity protocol): (layers, experts). For DOMINANCE_MASKING_LOSS; one
// pass over the text per expert, plus one unmasked.
absl::StatusOr<std::vector<std::vector<double>>> MaskingLoss(const engine::ModelWeights& weights,
                                                             const model::Tokenizer& tokenizer,
                                                             const std::string& text_path);

// Adds tiers to `plan` (whose retained experts are already chosen) from `stats`;
// `masking_loss` is required for DOMINANCE_MASKING_LOSS. INVALID_ARGUMENT for shares outside
// [0, 1] or summing above 1, a warm width outside [1, intermediate_size), or statistics of
// another shape.
absl::Status AssignTiers(const CalibrationStats& stats, const TierOptions& options,
                         const std::vector<std::vector<double>>* masking_loss,
                         const model::ModelConfig& config, tandem::v1::PruningPlan* plan);

// `plan` without its tiers (and pairs): the same experts, every one at full width.
tandem::v1::PruningPlan WithoutTiers(const tandem::v1::PruningPlan& plan);

// OK when the checkpoint in `dir` holds its neurons in importance order (tandem reorder), as
// tiers need; INVALID_ARGUMENT saying so otherwise.
absl::Status RequireReordered(const model::ModelDir& dir);

// What a width policy ran: routed (token, layer) decisions and neurons summed over them.
struct WidthCounts {
  int64_t decisions = 0;
  int64_t neurons = 0;
  // neurons over decisions x top_k x intermediate: the share of full-width expert bytes.
  double ByteShare(int top_k, int intermediate) const;
};

// After a policy chose `widths` (0: skipped) for one token's routed `weights`: scales the
// weights of the experts that run back to the routed total (1 when norm_topk_prob renormalises,
// the top-k mass otherwise) and zeroes the skipped ones; a single expert running under
// `normalised` gets exactly 1. Nothing changes when every expert runs.
void KeepRoutedWeight(absl::Span<const int> widths, absl::Span<float> weights, bool normalised);

// Replacement priority weights for an expert cache (ExpertCache::SetPriorityWeights) from a plan
// with tiers: per (layer, expert), 1 + the calibration tokens of the pairs it is in, with a
// pair's tokens counted fully for a Hot pair, for its dominant only in a Warm or Cold one (an
// auxiliary expert runs narrow or not at all there). Pruned experts get 1.
std::vector<std::vector<double>> CachePriorities(const tandem::v1::PruningPlan& plan);

class TierWidthPolicy;
// The width policy of `plan` for the checkpoint in `dir`: null when the plan has no tiers;
// INVALID_ARGUMENT when it has tiers and the checkpoint's neurons were not reordered (tandem
// reorder), or the tiers do not fit.
absl::StatusOr<std::unique_ptr<TierWidthPolicy>> TierPolicyFor(const tandem::v1::PruningPlan& plan,
                                                               const model::ModelDir& dir);

// The width policy of a plan with tiers (top-k models, k >= 2). Counts the pairs it sees per
// tier.
class TierWidthPolicy : public engine::ExpertWidthPolicy {
 public:
  // INVALID_ARGUMENT when the plan has no tiers or does not fit the model.
  static absl::StatusOr<std::unique_ptr<TierWidthPolicy>> Create(
      const tandem::v1::PruningPlan& plan, const model::ModelConfig& config);

  void Widths(int layer, absl::Span<const int32_t> experts, absl::Span<float> weights,
              absl::Span<int> widths) const override;

  struct Counts {
    int64_t hot = 0, warm = 0, cold = 0;
    int64_t neurons = 0;  // widths summed over every routed expert: what the pairs read
    int64_t total() const { return hot + warm + cold; }
    WidthCounts widths() const { return {total(), neurons}; }
  };
  // Pairs seen since creation or the last ResetCounts (call from the stepping thread).
  Counts counts() const { return counts_; }
  void ResetCounts() { counts_ = {}; }
  int warm_width() const { return warm_width_; }

 private:
  TierWidthPolicy(int experts, int intermediate, int warm_width, bool normalised)
      : experts_(experts),
        intermediate_(intermediate),
        warm_width_(warm_width),
        normalised_(normalised) {}

  struct PairRule {
    tandem::v1::PairTier tier = tandem::v1::PAIR_TIER_HOT;
    int32_t dominant = -1;
  };
  const int experts_, intermediate_, warm_width_;
  const bool normalised_;                      // norm_topk_prob: the routed weights sum to one
  std::vector<std::vector<PairRule>> rules_;   // (layers) x (a * experts + b), a < b
  std::vector<std::vector<int>> rank_widths_;  // RankWidths
  mutable Counts counts_;
};

}  // namespace tandem::moe
