// tandem reorder --model DIR --stats STATS --out DIR2
//   DIR's checkpoint with every expert's neurons in importance order (common/moe/reorder.h).
// tandem pack --model DIR --out FILE
//   every expert of DIR as an expert pack (common/moe/expert_store.h), for tandem-decode
//   --expert_pack.
// tandem tier --plan PLAN --stats STATS --out PLAN2 [--hot_share S --warm_share S
//             --warm_width N --dominance router|masking --model DIR --text FILE]
//   PLAN with a tier and a dominant expert for every pair of retained experts
//   (common/moe/tiers.h); masking dominance measures each expert's masking loss on --text.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/engine/generator.h"
#include "common/moe/expert_store.h"
#include "common/moe/pruning_plan.h"
#include "common/moe/reorder.h"
#include "common/moe/tiers.h"
#include "tools/cli/commands.h"

ABSL_FLAG(double, hot_share, tandem::moe::TierOptions{}.hot_share,
          "tier: share of routed tokens whose pairs are Hot.");
ABSL_FLAG(double, warm_share, tandem::moe::TierOptions{}.warm_share,
          "tier: share of routed tokens, after Hot, whose pairs are Warm.");
ABSL_FLAG(int, warm_width, 0,
          "tier: neurons a Warm pair's auxiliary expert runs; 0 = half the expert.");
ABSL_FLAG(std::string, dominance, "router",
          "tier: a pair's dominant expert by router (ranked first more often) or masking (masking "
          "it raises the loss on --text more; needs --model).");

namespace tandem::cli {

int Reorder() {
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (model.empty() || absl::GetFlag(FLAGS_stats).empty() || out.empty()) {
    return Report(
        absl::InvalidArgumentError("reorder needs --model DIR, --stats STATS, --out DIR"));
  }
  absl::StatusOr<moe::CalibrationStats> stats =
      moe::LoadCalibrationStats(absl::GetFlag(FLAGS_stats));
  if (!stats.ok()) return Report(stats.status());
  if (absl::Status s = moe::ReorderCheckpoint(model, *stats, out); !s.ok()) return Report(s);
  std::cout << "neurons of every expert in importance order; checkpoint in " << out << std::endl;
  return 0;
}

int Pack() {
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (model.empty() || out.empty()) {
    return Report(absl::InvalidArgumentError("pack needs --model DIR and --out FILE"));
  }
  absl::StatusOr<std::unique_ptr<engine::ModelWeights>> weights =
      engine::LoadModelWeights(model, engine::LoadFormat::kSafetensors);
  if (!weights.ok()) return Report(weights.status());
  if (absl::Status s = moe::WriteExpertPack(**weights, out); !s.ok()) return Report(s);
  std::cout << "every expert of " << model << " packed in neuron bundles; pack in " << out
            << std::endl;
  return 0;
}

int Tier() {
  const std::string plan_path = absl::GetFlag(FLAGS_plan);
  const std::string out = absl::GetFlag(FLAGS_out);
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  if (plan_path.empty() || absl::GetFlag(FLAGS_stats).empty() || out.empty() || model_dir.empty()) {
    return Report(absl::InvalidArgumentError(
        "tier needs --plan PLAN, --stats STATS, --model DIR (the reordered checkpoint) and --out"));
  }
  moe::TierOptions options;
  options.hot_share = absl::GetFlag(FLAGS_hot_share);
  options.warm_share = absl::GetFlag(FLAGS_warm_share);
  options.warm_width = absl::GetFlag(FLAGS_warm_width);
  const std::string dominance = absl::GetFlag(FLAGS_dominance);
  if (dominance == "masking") {
    options.dominance = tandem::v1::DOMINANCE_MASKING_LOSS;
  } else if (dominance != "router") {
    return Report(absl::InvalidArgumentError("--dominance must be router or masking"));
  }
  absl::StatusOr<moe::CalibrationStats> stats =
      moe::LoadCalibrationStats(absl::GetFlag(FLAGS_stats));
  if (!stats.ok()) return Report(stats.status());
  absl::StatusOr<tandem::v1::PruningPlan> plan = moe::LoadPlan(plan_path);
  if (!plan.ok()) return Report(plan.status());
  absl::StatusOr<model::ModelConfig> config = model::LoadModelConfig(model_dir + "/config.json");
  if (!config.ok()) return Report(config.status());
  std::vector<std::vector<double>> loss;
  if (options.dominance == tandem::v1::DOMINANCE_MASKING_LOSS) {
    const std::string text = absl::GetFlag(FLAGS_text);
    if (text.empty()) return Report(absl::InvalidArgumentError("--dominance masking needs --text"));
    absl::StatusOr<engine::LoadedModel> model = engine::LoadModelDir(model_dir);
    if (!model.ok()) return Report(model.status());
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<std::vector<double>>> measured =
        moe::MaskingLoss(*model->weights, *model->tokenizer, text);
    if (!measured.ok()) return Report(measured.status());
    loss = *std::move(measured);
    std::cerr << "masking losses of " << loss.size() << " layers measured in "
              << absl::FormatDuration(absl::Now() - start) << "\n";
  }
  if (absl::Status s =
          moe::AssignTiers(*stats, options, loss.empty() ? nullptr : &loss, *config, &*plan);
      !s.ok()) {
    return Report(s);
  }
  if (absl::Status s = moe::SavePlan(*plan, out); !s.ok()) return Report(s);
  int64_t pairs[4] = {0, 0, 0, 0};
  for (const auto& layer : plan->layers()) {
    for (const auto& pair : layer.pairs()) ++pairs[pair.tier()];
  }
  std::cout << absl::StrCat("pairs: ", pairs[1], " hot, ", pairs[2], " warm, ", pairs[3],
                            " cold (warm width ", plan->tiers().warm_width(), "); plan in ", out)
            << std::endl;
  return 0;
}

}  // namespace tandem::cli
