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
  settings->clear_hot_widths();
  settings->clear_warm_widths();
  settings->clear_cold_widths();
  for (int w : options.hot_widths) settings->add_hot_widths(w);
  for (int w : options.warm_widths) settings->add_warm_widths(w);
  for (int w : options.cold_widths) settings->add_cold_widths(w);
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

std::vector<std::vector<int>> RankWidths(const tandem::v1::PruningPlan& plan,
                                         const model::ModelConfig& config) {
  const int k = static_cast<int>(config.num_experts_per_tok);
  const int full = static_cast<int>(config.intermediate_size);
  std::vector<std::vector<int>> widths(4, std::vector<int>(k, full));
  widths[tandem::v1::PAIR_TIER_WARM][1] = plan.tiers().warm_width();
  widths[tandem::v1::PAIR_TIER_COLD][1] = 0;
  const auto take = [&](const google::protobuf::RepeatedField<int32_t>& given, int tier) {
    if (!given.empty()) widths[tier].assign(given.begin(), given.end());
  };
  take(plan.tiers().hot_widths(), tandem::v1::PAIR_TIER_HOT);
  take(plan.tiers().warm_widths(), tandem::v1::PAIR_TIER_WARM);
  take(plan.tiers().cold_widths(), tandem::v1::PAIR_TIER_COLD);
  return widths;
}

double CalibrationByteShare(const tandem::v1::PruningPlan& plan, const model::ModelConfig& config) {
  if (!plan.has_tiers()) return 1.0;
  const std::vector<std::vector<int>> widths = RankWidths(plan, config);
  std::vector<double> share(4, 0);
  for (int tier = 1; tier < 4; ++tier) {
    for (int w : widths[tier]) share[tier] += w;
    share[tier] /= static_cast<double>(config.num_experts_per_tok * config.intermediate_size);
  }
  double tokens = 0, bytes = 0;
  for (const tandem::v1::LayerPlan& layer : plan.layers()) {
    for (const tandem::v1::ExpertPair& pair : layer.pairs()) {
      tokens += static_cast<double>(pair.count());
      bytes += static_cast<double>(pair.count()) * share[pair.tier()];
    }
  }
  return tokens == 0 ? 1.0 : bytes / tokens;
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

tandem::v1::PruningPlan WithoutTiers(const tandem::v1::PruningPlan& plan) {
  tandem::v1::PruningPlan untiered = plan;
  untiered.clear_tiers();
  for (tandem::v1::LayerPlan& layer : *untiered.mutable_layers()) layer.clear_pairs();
  return untiered;
}

absl::Status RequireReordered(const model::ModelDir& dir) {
  ASSIGN_OR_RETURN(bool reordered, IsReordered(dir));
  if (!reordered) {
    return absl::InvalidArgumentError(
        "mixed-width tiers need a checkpoint with its neurons in importance order (make one "
        "with tandem reorder and pass it as --model)");
  }
  return absl::OkStatus();
}

double WidthCounts::ByteShare(int top_k, int intermediate) const {
  if (decisions == 0) return 0;
  return static_cast<double>(neurons) /
         (static_cast<double>(decisions) * top_k * static_cast<double>(intermediate));
}

void KeepRoutedWeight(absl::Span<const int> widths, absl::Span<float> weights, bool normalised) {
  int running = 0;
  size_t last_running = 0;
  double total = 0, kept = 0;
  for (size_t j = 0; j < weights.size(); ++j) {
    total += weights[j];
    if (widths[j] > 0) ++running, last_running = j, kept += weights[j];
  }
  if (running == static_cast<int>(weights.size())) return;
  if (running == 1 && normalised) {
    for (float& w : weights) w = 0.0f;
    weights[last_running] = 1.0f;  // exactly: renormalised over the one that runs
    return;
  }
  const float scale = kept > 0 ? static_cast<float>(total / kept) : 1.0f;
  for (size_t j = 0; j < weights.size(); ++j)
    weights[j] = widths[j] > 0 ? weights[j] * scale : 0.0f;
}

absl::StatusOr<std::unique_ptr<TierWidthPolicy>> TierPolicyFor(const tandem::v1::PruningPlan& plan,
                                                               const model::ModelDir& dir) {
  if (!plan.has_tiers()) return nullptr;
  RETURN_IF_ERROR(RequireReordered(dir));
  return TierWidthPolicy::Create(plan, dir.config());
}

absl::StatusOr<std::unique_ptr<TierWidthPolicy>> TierWidthPolicy::Create(
    const tandem::v1::PruningPlan& plan, const model::ModelConfig& config) {
  RETURN_IF_ERROR(ValidatePlan(plan, config));
  if (!plan.has_tiers()) return absl::InvalidArgumentError("the plan has no tiers");
  const int experts = static_cast<int>(config.num_local_experts);
  std::unique_ptr<TierWidthPolicy> policy(
      new TierWidthPolicy(experts, static_cast<int>(config.intermediate_size),
                          plan.tiers().warm_width(), config.norm_topk_prob));
  policy->rank_widths_ = RankWidths(plan, config);
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
  // descending router weight).
  const int a = std::min(experts[0], experts[1]), b = std::max(experts[0], experts[1]);
  const PairRule& rule = rules_[layer][a * experts_ + b];
  // A pair the plan does not list (it holds a pruned expert: the mask keeps it from being
  // routed) runs at full width, as Hot.
  const int tier =
      rule.tier == tandem::v1::PAIR_TIER_UNSPECIFIED ? tandem::v1::PAIR_TIER_HOT : rule.tier;
  const std::vector<int>& by_rank = rank_widths_[tier];
  // Rank 0 is the dominant, rank 1 the other leading expert, then router order.
  const size_t dominant = rule.dominant == experts[1] ? 1 : 0;
  for (size_t j = 0; j < widths.size(); ++j) {
    const size_t rank = j < 2 ? (j == dominant ? 0 : 1) : j;
    widths[j] = rank < by_rank.size() ? by_rank[rank] : intermediate_;
  }
  KeepRoutedWeight(widths, weights, normalised_);
  switch (tier) {
    case tandem::v1::PAIR_TIER_WARM:
      ++counts_.warm;
      break;
    case tandem::v1::PAIR_TIER_COLD:
      ++counts_.cold;
      break;
    default:
      ++counts_.hot;
      break;
  }
  for (int w : widths) counts_.neurons += w;
}

}  // namespace tandem::moe
