#include "common/moe/pruning_plan.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/util/status.h"

namespace tandem::moe {

using tandem::v1::PruningCriterion;
using tandem::v1::PruningPlan;

absl::StatusOr<PruningCriterion> ParseCriterion(const std::string& name) {
  if (name == "frequency") return tandem::v1::PRUNING_CRITERION_FREQUENCY;
  if (name == "mass") return tandem::v1::PRUNING_CRITERION_ROUTING_MASS;
  if (name == "ean") return tandem::v1::PRUNING_CRITERION_EAN;
  if (name == "reap") return tandem::v1::PRUNING_CRITERION_REAP;
  return absl::InvalidArgumentError(
      absl::StrCat("criterion \"", name, "\" is not frequency, mass, ean or reap"));
}

absl::StatusOr<PruningPlan> MakePlan(const CalibrationStats& stats, PruningCriterion criterion,
                                     int keep) {
  if (stats.layers.empty()) return absl::InvalidArgumentError("the statistics have no layers");
  const int experts = static_cast<int>(stats.layers[0].frequency.size());
  if (keep < 1 || keep > experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep ", keep, " is outside [1, ", experts, "]"));
  }
  PruningPlan plan;
  plan.set_model(stats.model);
  plan.set_num_layers(static_cast<int>(stats.layers.size()));
  plan.set_num_experts(experts);
  plan.set_criterion(criterion);
  plan.mutable_calibration()->set_model(stats.model);
  plan.mutable_calibration()->set_text_file(stats.text);
  plan.mutable_calibration()->set_text_sha256(stats.text_sha256);
  plan.mutable_calibration()->set_tokens(stats.tokens);
  for (size_t l = 0; l < stats.layers.size(); ++l) {
    const LayerStats& layer = stats.layers[l];
    auto score = [&](int e) -> double {
      switch (criterion) {
        case tandem::v1::PRUNING_CRITERION_FREQUENCY:
          return static_cast<double>(layer.frequency[e]);
        case tandem::v1::PRUNING_CRITERION_ROUTING_MASS:
          return layer.mass[e];
        case tandem::v1::PRUNING_CRITERION_EAN:
          return layer.ean[e];
        case tandem::v1::PRUNING_CRITERION_REAP:
          return layer.reap[e];
        default:
          return 0;
      }
    };
    if (static_cast<int>(layer.frequency.size()) != experts) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " has another expert count"));
    }
    std::vector<int> order(experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score(a) > score(b); });
    order.resize(keep);
    std::sort(order.begin(), order.end());
    tandem::v1::LayerPlan* layer_plan = plan.add_layers();
    layer_plan->set_layer(static_cast<int>(l));
    for (int e : order) layer_plan->add_retained_experts(e);
  }
  if (criterion == tandem::v1::PRUNING_CRITERION_UNSPECIFIED) {
    return absl::InvalidArgumentError("a plan needs a criterion");
  }
  return plan;
}

namespace {

// A layer's pairs when the plan has tiers: every pair of its retained experts once, in order,
// with a tier and one of the two as dominant; none without tiers.
absl::Status ValidateTiers(const PruningPlan& plan, const tandem::v1::LayerPlan& layer,
                           const model::ModelConfig& config) {
  const int l = layer.layer();
  if (!plan.has_tiers()) {
    if (layer.pairs_size() == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", l, " lists pairs but the plan has no tiers"));
  }
  if (config.num_experts_per_tok < 2) {
    return absl::InvalidArgumentError(
        "tiers are for models that route each token to 2 experts or more");
  }
  const int width = plan.tiers().warm_width();
  if (width < 1 || width >= config.intermediate_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the warm width ", width, " is outside [1, ", config.intermediate_size, ")"));
  }
  const int top_k = static_cast<int>(config.num_experts_per_tok);
  for (const auto& [name, widths] : {std::pair{"hot", &plan.tiers().hot_widths()},
                                     {"warm", &plan.tiers().warm_widths()},
                                     {"cold", &plan.tiers().cold_widths()}}) {
    if (widths->empty()) continue;
    if (widths->size() != top_k) {
      return absl::InvalidArgumentError(absl::StrCat("the ", name, " widths give ", widths->size(),
                                                     " ranks; the model routes ", top_k));
    }
    for (int r = 0; r < widths->size(); ++r) {
      const int w = widths->Get(r);
      if (w < (r == 0 ? 1 : 0) || w > config.intermediate_size) {
        return absl::InvalidArgumentError(absl::StrCat("the ", name, " width of rank ", r, " is ",
                                                       w, "; it must be in [", r == 0 ? 1 : 0, ", ",
                                                       config.intermediate_size, "]"));
      }
    }
  }
  const auto& retained = layer.retained_experts();
  int k = 0;
  for (int i = 0; i < retained.size(); ++i) {
    for (int j = i + 1; j < retained.size(); ++j, ++k) {
      if (k >= layer.pairs_size() || layer.pairs(k).a() != retained[i] ||
          layer.pairs(k).b() != retained[j]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer ", l, "'s pairs must be every pair of its retained experts, in order; pair ", k,
            " should be (", retained[i], ", ", retained[j], ")"));
      }
      const tandem::v1::ExpertPair& pair = layer.pairs(k);
      if (pair.tier() == tandem::v1::PAIR_TIER_UNSPECIFIED ||
          (pair.dominant() != pair.a() && pair.dominant() != pair.b())) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", l, " pair (", pair.a(), ", ",
                                                       pair.b(),
                                                       ") needs a tier and a dominant "
                                                       "expert of the two"));
      }
    }
  }
  if (k != layer.pairs_size()) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", l, " lists ", layer.pairs_size(),
                                                   " pairs; its retained experts make ", k));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlan(const PruningPlan& plan, const model::ModelConfig& config) {
  if (plan.num_layers() != config.num_hidden_layers ||
      plan.num_experts() != config.num_local_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the plan is for ", plan.num_layers(), " layers of ", plan.num_experts(),
        " experts; the model has ", config.num_hidden_layers, " of ", config.num_local_experts));
  }
  if (plan.layers_size() != plan.num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan lists ", plan.layers_size(), " layers, not ", plan.num_layers()));
  }
  for (int l = 0; l < plan.layers_size(); ++l) {
    const tandem::v1::LayerPlan& layer = plan.layers(l);
    if (layer.layer() != l) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan entry ", l, " is for layer ", layer.layer(), "; layers go in order"));
    }
    if (layer.retained_experts_size() < config.num_experts_per_tok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", l, " retains ", layer.retained_experts_size(), " experts; the model routes ",
          "each token to ", config.num_experts_per_tok));
    }
    for (int i = 0; i < layer.retained_experts_size(); ++i) {
      const int e = layer.retained_experts(i);
      if (e < 0 || e >= config.num_local_experts) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer ", l, " retains expert ", e, ", outside [0, ", config.num_local_experts, ")"));
      }
      if (i > 0 && e <= layer.retained_experts(i - 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", l, "'s retained experts are not ascending and distinct"));
      }
    }
    RETURN_IF_ERROR(ValidateTiers(plan, layer, config));
  }
  return absl::OkStatus();
}

absl::StatusOr<engine::ExpertMask> MaskFromPlan(const PruningPlan& plan,
                                                const model::ModelConfig& config) {
  RETURN_IF_ERROR(ValidatePlan(plan, config));
  engine::ExpertMask mask;
  mask.retained.assign(config.num_hidden_layers,
                       std::vector<bool>(config.num_local_experts, false));
  for (const tandem::v1::LayerPlan& layer : plan.layers()) {
    for (int e : layer.retained_experts()) mask.retained[layer.layer()][e] = true;
  }
  return mask;
}

absl::StatusOr<PlanForModel> LoadPlanFor(const std::string& plan_path, const model::ModelDir& dir) {
  PlanForModel out;
  absl::StatusOr<PruningPlan> plan = LoadPlan(plan_path);
  absl::StatusOr<engine::ExpertMask> mask =
      plan.ok() ? MaskFromPlan(*plan, dir.config()) : plan.status();
  if (!mask.ok()) {
    return absl::Status(mask.status().code(),
                        absl::StrCat("plan ", plan_path, ": ", mask.status().message()));
  }
  out.plan = *std::move(plan);
  out.mask = *std::move(mask);
  return out;
}

absl::StatusOr<engine::ExpertMask> LoadPlanMask(const std::string& plan_path,
                                                const model::ModelDir& dir) {
  ASSIGN_OR_RETURN(PlanForModel loaded, LoadPlanFor(plan_path, dir));
  return std::move(loaded.mask);
}

absl::Status SavePlan(const PruningPlan& plan, const std::string& path) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  if (!google::protobuf::util::MessageToJsonString(plan, &json, options).ok()) {
    return absl::InternalError("cannot print the plan as JSON");
  }
  std::ofstream out(path);
  out << json;
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<PruningPlan> LoadPlan(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    return absl::NotFoundError(absl::StrCat("pruning plan ", path, " does not exist"));
  }
  std::ifstream in(path);
  const std::string json((std::istreambuf_iterator<char>(in)), {});
  PruningPlan plan;
  if (auto status = google::protobuf::util::JsonStringToMessage(json, &plan); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a pruning plan: ", std::string(status.message())));
  }
  return plan;
}

}  // namespace tandem::moe
