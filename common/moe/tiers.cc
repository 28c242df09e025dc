#include "common/moe/tiers.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/engine/perplexity.h"
#include "common/moe/pruning_plan.h"
#include "common/moe/reorder.h"
#include "common/util/status.h"

namespace tandem::moe {

using tandem::v1::PairTier;

absl::StatusOr<std::vector<std::vector<double>>> MaskingLoss(const engine::ModelWeights& weights,
                                                             const model::Tokenizer& tokenizer,
                                                             const std::string& text_path) {
  const model::ModelConfig& c = weights.config;
  const int layers = static_cast<int>(c.num_hidden_layers);
  const int experts = static_cast<int>(c.num_local_experts);
  ASSIGN_OR_RETURN(engine::PerplexityResult base,
                   engine::EvaluatePerplexity(weights, tokenizer, text_path));
  std::vector<std::vector<double>> loss(layers, std::vector<double>(experts, 0));
  engine::ExpertMask mask;
  mask.retained.assign(layers, std::vector<bool>(experts, true));
  engine::PerplexityOptions options;
  options.moe.mask = &mask;
  for (int l = 0; l < layers; ++l) {
    for (int e = 0; e < experts; ++e) {
      mask.retained[l][e] = false;
      ASSIGN_OR_RETURN(engine::PerplexityResult masked,
                       engine::EvaluatePerplexity(weights, tokenizer, text_path, options));
      mask.retained[l][e] = true;
      loss[l][e] = masked.nll - base.nll;
    }
  }
  return loss;
}

absl::Status AssignTiers(const CalibrationStats& stats, const TierOptions& options,
                         const std::vector<std::vector<double>>* masking_loss,
                         const model::ModelConfig& config, tandem::v1::PruningPlan* plan) {
  const int inter = static_cast<int>(config.intermediate_size);
  const int experts = static_cast<int>(config.num_local_experts);
  if (config.num_experts_per_tok < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("tiers are for top-k routing with k >= 2; the model routes each token to ",
                     config.num_experts_per_tok));
  }
  if (options.hot_share < 0 || options.warm_share < 0 ||
      options.hot_share + options.warm_share > 1 + 1e-12) {
    return absl::InvalidArgumentError(absl::StrCat("tier shares hot ", options.hot_share,
                                                   " and warm ", options.warm_share,
                                                   " must be in [0, 1] and sum to at most 1"));
  }
  const int warm_width = options.warm_width == 0 ? inter / 2 : options.warm_width;
  if (warm_width < 1 || warm_width >= inter) {
    return absl::InvalidArgumentError(
        absl::StrCat("warm width ", warm_width, " must be in [1, ", inter, ")"));
  }
  if (options.dominance == tandem::v1::DOMINANCE_MASKING_LOSS && masking_loss == nullptr) {
    return absl::InvalidArgumentError("masking-loss dominance needs the masking losses");
  }
  if (options.dominance != tandem::v1::DOMINANCE_MASKING_LOSS &&
      options.dominance != tandem::v1::DOMINANCE_ROUTER_WEIGHT) {
    return absl::InvalidArgumentError("a dominance rule is required");
  }
  RETURN_IF_ERROR(ValidatePlan(*plan, config));
  if (static_cast<int>(stats.layers.size()) != plan->num_layers() ||
      (masking_loss != nullptr && static_cast<int>(masking_loss->size()) != plan->num_layers())) {
    return absl::InvalidArgumentError("the statistics do not cover the plan's layers");
  }
  tandem::v1::TierSettings* settings = plan->mutable_tiers();
  settings->set_hot_share(options.hot_share);
  settings->set_warm_share(options.warm_share);
  settings->set_warm_width(warm_width);
  settings->set_dominance(options.dominance);
  for (tandem::v1::LayerPlan& layer : *plan->mutable_layers()) {
    const LayerStats& s = stats.layers[layer.layer()];
    layer.clear_pairs();
    std::vector<tandem::v1::ExpertPair> pairs;
    int64_t total = 0;
    const auto& retained = layer.retained_experts();
    for (int i = 0; i < retained.size(); ++i) {
      for (int j = i + 1; j < retained.size(); ++j) {
        tandem::v1::ExpertPair pair;
        const int a = retained[i], b = retained[j];
        pair.set_a(a);
        pair.set_b(b);
        auto count = s.pairs.find({a, b});
        pair.set_count(count == s.pairs.end() ? 0 : count->second);
        total += pair.count();
        if (options.dominance == tandem::v1::DOMINANCE_MASKING_LOSS) {
          const std::vector<double>& loss = (*masking_loss)[layer.layer()];
          if (static_cast<int>(loss.size()) != experts) {
            return absl::InvalidArgumentError("the masking losses do not cover every expert");
          }
          pair.set_dominant(loss[a] >= loss[b] ? a : b);
        } else {
          auto first = s.pair_a_first.find({a, b});
          const int64_t a_first = first == s.pair_a_first.end() ? 0 : first->second;
          pair.set_dominant(2 * a_first >= pair.count() ? a : b);
        }
        pairs.push_back(pair);
      }
    }
    std::vector<size_t> order(pairs.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return pairs[x].count() > pairs[y].count(); });
    double before = 0;  // tokens of the more frequent pairs
    for (size_t k : order) {
      tandem::v1::ExpertPair& pair = pairs[k];
      const double share = total == 0 ? 1.0 : before / static_cast<double>(total);
      pair.set_tier(pair.count() == 0                                ? tandem::v1::PAIR_TIER_COLD
                    : share < options.hot_share                      ? tandem::v1::PAIR_TIER_HOT
                    : share < options.hot_share + options.warm_share ? tandem::v1::PAIR_TIER_WARM
                                                                     : tandem::v1::PAIR_TIER_COLD);
      before += static_cast<double>(pair.count());
    }
    for (const tandem::v1::ExpertPair& pair : pairs) *layer.add_pairs() = pair;
  }
  return ValidatePlan(*plan, config);
}

std::vector<std::vector<double>> CachePriorities(const tandem::v1::PruningPlan& plan) {
  std::vector<std::vector<double>> weights(plan.num_layers(),
                                           std::vector<double>(plan.num_experts(), 1.0));
  for (const tandem::v1::LayerPlan& layer : plan.layers()) {
    for (const tandem::v1::ExpertPair& pair : layer.pairs()) {
      const double count = static_cast<double>(pair.count());
      if (pair.tier() == tandem::v1::PAIR_TIER_HOT) {
        weights[layer.layer()][pair.a()] += count;
        weights[layer.layer()][pair.b()] += count;
      } else {
        weights[layer.layer()][pair.dominant()] += count;
      }
    }
  }
  return weights;
}

absl::StatusOr<std::unique_ptr<TierWidthPolicy>> TierPolicyFor(const tandem::v1::PruningPlan& plan,
                                                               const std::string& model_dir,
                                                               const model::ModelConfig& config) {
  if (!plan.has_tiers()) return nullptr;
  ASSIGN_OR_RETURN(bool reordered, IsReordered(model_dir));
  if (!reordered) {
    return absl::InvalidArgumentError(
        "the plan has mixed-width tiers, which need a checkpoint with its neurons in importance "
        "order (make one with tandem reorder and pass it as --model)");
  }
  return TierWidthPolicy::Create(plan, config);
}

absl::StatusOr<std::unique_ptr<TierWidthPolicy>> TierWidthPolicy::Create(
    const tandem::v1::PruningPlan& plan, const model::ModelConfig& config) {
  RETURN_IF_ERROR(ValidatePlan(plan, config));
  if (!plan.has_tiers()) return absl::InvalidArgumentError("the plan has no tiers");
  const int experts = static_cast<int>(config.num_local_experts);
  std::unique_ptr<TierWidthPolicy> policy(
      new TierWidthPolicy(experts, static_cast<int>(config.intermediate_size),
                          plan.tiers().warm_width(), config.norm_topk_prob));
  policy->rules_.assign(plan.num_layers(), std::vector<PairRule>(experts * experts));
  for (const tandem::v1::LayerPlan& layer : plan.layers()) {
    for (const tandem::v1::ExpertPair& pair : layer.pairs()) {
      policy->rules_[layer.layer()][pair.a() * experts + pair.b()] = {pair.tier(), pair.dominant()};
    }
  }
  return policy;
}

void TierWidthPolicy::Widths(int layer, absl::Span<const int32_t> experts,
                             absl::Span<float> weights, absl::Span<int> widths) const {
  // The tier belongs to the token's two leading experts (the forward pass gives them in
  // descending router weight); any after them run at full width.
  const int a = std::min(experts[0], experts[1]), b = std::max(experts[0], experts[1]);
  const PairRule& rule = rules_[layer][a * experts_ + b];
  // A pair the plan does not list (it holds a pruned expert: the mask keeps it from being
  // routed) runs at full width, as Hot.
  const int dominant = rule.dominant == experts[1] ? 1 : 0;
  const int auxiliary = 1 - dominant;
  for (size_t j = 0; j < widths.size(); ++j) widths[j] = intermediate_;
  switch (rule.tier) {
    case tandem::v1::PAIR_TIER_WARM:
      widths[auxiliary] = warm_width_;
      ++counts_.warm;
      break;
    case tandem::v1::PAIR_TIER_COLD: {
      widths[auxiliary] = 0;
      if (weights.size() == 2 && normalised_) {
        weights[dominant] = 1.0f;  // exactly: renormalised over the one that runs
      } else {
        // Scale what runs back to the routed total (1 when renormalised, the top-k mass
        // otherwise).
        double total = 0;
        for (float w : weights) total += w;
        const double running = total - weights[auxiliary];
        const float scale = running > 0 ? static_cast<float>(total / running) : 1.0f;
        for (size_t j = 0; j < weights.size(); ++j) weights[j] *= scale;
      }
      weights[auxiliary] = 0.0f;
      ++counts_.cold;
      break;
    }
    default:
      ++counts_.hot;
      break;
  }
  for (int w : widths) counts_.neurons += w;
}

}  // namespace tandem::moe
