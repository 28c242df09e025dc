// tandem reorder --model DIR --stats STATS --out DIR2
//   DIR's checkpoint with every expert's neurons in importance order (common/moe/reorder.h).
// tandem pack --model DIR --out FILE
//   every expert of DIR as an expert pack (common/moe/expert_store.h), for tandem-decode
//   --expert_pack.
// tandem tier --plan PLAN --stats STATS --model DIR --out PLAN2 [--hot_share S --warm_share S
//             --warm_width N --hot_widths W,.. --warm_widths W,.. --cold_widths W,..
//             --dominance router|masking --text FILE]
//   PLAN with a tier and a dominant expert for every pair of retained experts
//   (common/moe/tiers.h); masking dominance measures each expert's masking loss on --text.
// tandem tier --plan PLAN --stats STATS --model DIR --out PLAN2 --text CALIBRATION
//             (--max_accuracy_loss L | --max_expert_bytes B) [--heldout_text FILE]
//   The cut-offs and widths chosen by a budget (common/moe/tier_search.h), scored on --text
//   and, when given, validated on --heldout_text.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/engine/generator.h"
#include "common/engine/perplexity.h"
#include "common/moe/expert_store.h"
#include "common/moe/pruning_plan.h"
#include "common/moe/reorder.h"
#include "common/moe/tier_search.h"
#include "common/moe/tiers.h"
#include "common/util/clock.h"
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

ABSL_FLAG(std::vector<std::string>, hot_widths, {},
          "tier: neurons each router rank runs in a Hot token (top_k values, rank 0 the leading "
          "pair's dominant; 0 skips); empty = every rank full.");
ABSL_FLAG(std::vector<std::string>, warm_widths, {},
          "tier: as --hot_widths for a Warm token; empty = rank 1 at --warm_width, the rest full.");
ABSL_FLAG(std::vector<std::string>, cold_widths, {},
          "tier: as --hot_widths for a Cold token; empty = rank 1 skipped, the rest full.");
ABSL_FLAG(double, max_accuracy_loss, -1,
          "tier: choose the cut-offs and widths with the fewest expert bytes whose top-1 accuracy "
          "on --text is at most this share below the untiered plan's (e.g. 0.036); < 0 = off.");
ABSL_FLAG(double, max_expert_bytes, -1,
          "tier: choose the cut-offs and widths with the least accuracy loss on --text that run at "
          "most this share of the full-width expert bytes; < 0 = off.");
ABSL_FLAG(std::string, heldout_text, "",
          "tier: text (not the calibration text) the chosen plan is validated on.");
ABSL_DECLARE_FLAG(int, context);

namespace tandem::cli {
namespace {

absl::StatusOr<std::vector<int>> ParseWidths(const std::vector<std::string>& values,
                                             const char* flag) {
  std::vector<int> out;
  for (const std::string& v : values) {
    int w = 0;
    if (!absl::SimpleAtoi(v, &w)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", v, "\" is not a width"));
    }
    out.push_back(w);
  }
  return out;
}

// Handoff scoring (the full model's prompt, the plan's continuation) of `plan` on `text`: its
// accuracy, loss and the expert bytes it ran.
absl::StatusOr<moe::TierScore> ScorePlan(const engine::LoadedModel& model,
                                         const tandem::v1::PruningPlan& plan,
                                         const std::string& text) {
  const model::ModelConfig& config = model.weights->config;
  absl::StatusOr<engine::ExpertMask> mask = moe::MaskFromPlan(plan, config);
  if (!mask.ok()) return mask.status();
  std::unique_ptr<moe::TierWidthPolicy> policy;
  if (plan.has_tiers()) {
    absl::StatusOr<std::unique_ptr<moe::TierWidthPolicy>> made =
        moe::TierWidthPolicy::Create(plan, config);
    if (!made.ok()) return made.status();
    policy = *std::move(made);
  }
  engine::PerplexityOptions scoring;
  scoring.context = absl::GetFlag(FLAGS_context);
  scoring.moe = {.mask = &*mask, .widths = policy.get()};
  absl::StatusOr<engine::PerplexityResult> result =
      engine::EvaluatePerplexity(*model.weights, *model.tokenizer, text, scoring);
  if (!result.ok()) return result.status();
  moe::TierScore score{1.0, result->accuracy, result->nll};
  if (policy != nullptr && policy->counts().total() > 0) {
    score.byte_share = policy->counts().widths().ByteShare(
        static_cast<int>(config.num_experts_per_tok), static_cast<int>(config.intermediate_size));
  }
  return score;
}

std::string Describe(const moe::TierOptions& o) {
  const auto list = [](const std::vector<int>& w) {
    return w.empty() ? std::string("pair rule") : absl::StrJoin(w, ",");
  };
  return absl::StrCat("hot ", o.hot_share, " warm ", o.warm_share, " narrow ", o.warm_width,
                      " | warm widths ", list(o.warm_widths), " | cold widths ",
                      list(o.cold_widths));
}

// --max_accuracy_loss / --max_expert_bytes: choose, save and validate.
int SelectByBudget(const moe::CalibrationStats& stats, const tandem::v1::PruningPlan& base,
                   const model::ModelDir& dir, const std::string& out) {
  const std::string text = absl::GetFlag(FLAGS_text);
  if (text.empty()) {
    return Report(absl::InvalidArgumentError(
        "choosing tiers by a budget needs --text (calibration text to score candidates on)"));
  }
  // Checked once here; the candidates' policies are made without reading the checkpoint again.
  if (absl::Status s = moe::RequireReordered(dir); !s.ok()) return Report(s);
  absl::StatusOr<engine::LoadedModel> model = engine::LoadModelDir(dir);
  if (!model.ok()) return Report(model.status());
  const model::ModelConfig& config = model->weights->config;
  moe::TierBudget budget{absl::GetFlag(FLAGS_max_accuracy_loss),
                         absl::GetFlag(FLAGS_max_expert_bytes)};
  // Candidates are screened on the first quarter of the calibration documents (at least one).
  std::vector<std::string> documents;
  {
    std::ifstream in(text);
    if (!in) return Report(absl::NotFoundError("cannot read --text " + text));
    for (std::string line; std::getline(in, line);) {
      if (!absl::StripAsciiWhitespace(line).empty()) documents.push_back(line);
    }
  }
  const std::string screen_path = out + ".screening.txt";
  {
    std::ofstream screen(screen_path);
    for (size_t d = 0; d < std::max<size_t>(1, documents.size() / 4) && d < documents.size(); ++d) {
      screen << documents[d] << "\n";
    }
    if (!screen) return Report(absl::PermissionDeniedError("cannot write " + screen_path));
  }
  const absl::Cleanup remove_screen = [&] { std::remove(screen_path.c_str()); };
  const util::Instant start = util::Instant::Now();
  absl::StatusOr<moe::TierSelection> selection = moe::SelectTiers(
      stats, base, config, budget, [&](const tandem::v1::PruningPlan& plan, bool screening) {
        return ScorePlan(*model, plan, screening ? screen_path : text);
      });
  if (!selection.ok()) return Report(selection.status());
  std::cout << absl::StrCat("untiered on ", text, ": accuracy ", selection->full.accuracy, ", nll ",
                            selection->full.nll, "\n");
  std::cout << "text    predicted bytes  ran bytes  accuracy  loss     candidate\n";
  for (const moe::TierTrial& t : selection->trials) {
    std::cout << absl::StrFormat("%-6s  %15.3f  %9.3f  %8.4f  %6.2f%%  %s\n",
                                 t.screening ? "screen" : "whole", t.predicted_byte_share,
                                 t.byte_share, t.accuracy, 100 * t.accuracy_loss,
                                 Describe(t.options));
  }
  const moe::TierTrial& c = selection->chosen;
  std::cout << absl::StrFormat(
      "chosen: %s; on the calibration text %.3f of the expert bytes, accuracy loss %.2f%% (%d "
      "scorings in %s)\n",
      Describe(c.options), c.byte_share, 100 * c.accuracy_loss, selection->trials.size(),
      absl::FormatDuration(util::Since(start)));
  if (absl::Status s = moe::SavePlan(selection->plan, out); !s.ok()) return Report(s);
  if (const std::string heldout = absl::GetFlag(FLAGS_heldout_text); !heldout.empty()) {
    absl::StatusOr<moe::TierScore> full = ScorePlan(*model, moe::WithoutTiers(base), heldout);
    if (!full.ok()) return Report(full.status());
    absl::StatusOr<moe::TierScore> chosen = ScorePlan(*model, selection->plan, heldout);
    if (!chosen.ok()) return Report(chosen.status());
    const double loss =
        full->accuracy > 0 ? (full->accuracy - chosen->accuracy) / full->accuracy : 0.0;
    std::cout << absl::StrFormat(
        "held out (%s): accuracy %.4f untiered, %.4f chosen: loss %.2f%%, %.3f of the expert "
        "bytes%s\n",
        heldout, full->accuracy, chosen->accuracy, 100 * loss, chosen->byte_share,
        budget.max_accuracy_loss >= 0 && loss > budget.max_accuracy_loss
            ? " (over the budget on held-out text)"
            : "");
  }
  std::cout << "plan in " << out << std::endl;
  return 0;
}

}  // namespace

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
  absl::StatusOr<std::unique_ptr<model::ModelDir>> dir = model::ModelDir::Open(model);
  if (!dir.ok()) return Report(dir.status());
  if (absl::Status s = moe::ReorderCheckpoint(**dir, *stats, out); !s.ok()) return Report(s);
  std::cout << "neurons of every expert in importance order; checkpoint in " << out << std::endl;
  return 0;
}

int Pack() {
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (model.empty() || out.empty()) {
    return Report(absl::InvalidArgumentError("pack needs --model DIR and --out FILE"));
  }
  absl::StatusOr<std::unique_ptr<model::ModelDir>> dir = model::ModelDir::Open(model);
  if (!dir.ok()) return Report(dir.status());
  absl::StatusOr<std::unique_ptr<engine::ModelWeights>> weights =
      engine::LoadModelWeights(**dir, engine::LoadFormat::kSafetensors);
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
  absl::StatusOr<moe::CalibrationStats> stats =
      moe::LoadCalibrationStats(absl::GetFlag(FLAGS_stats));
  if (!stats.ok()) return Report(stats.status());
  absl::StatusOr<tandem::v1::PruningPlan> plan = moe::LoadPlan(plan_path);
  if (!plan.ok()) return Report(plan.status());
  absl::StatusOr<std::unique_ptr<model::ModelDir>> dir = model::ModelDir::Open(model_dir);
  if (!dir.ok()) return Report(dir.status());
  if (absl::GetFlag(FLAGS_max_accuracy_loss) >= 0 || absl::GetFlag(FLAGS_max_expert_bytes) >= 0) {
    return SelectByBudget(*stats, *plan, **dir, out);
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
  for (auto [values, flag, widths] :
       {std::tuple{absl::GetFlag(FLAGS_hot_widths), "hot_widths", &options.hot_widths},
        {absl::GetFlag(FLAGS_warm_widths), "warm_widths", &options.warm_widths},
        {absl::GetFlag(FLAGS_cold_widths), "cold_widths", &options.cold_widths}}) {
    absl::StatusOr<std::vector<int>> parsed = ParseWidths(values, flag);
    if (!parsed.ok()) return Report(parsed.status());
    *widths = *std::move(parsed);
  }
  const model::ModelConfig* config = &(*dir)->config();
  std::vector<std::vector<double>> loss;
  if (options.dominance == tandem::v1::DOMINANCE_MASKING_LOSS) {
    const std::string text = absl::GetFlag(FLAGS_text);
    if (text.empty()) return Report(absl::InvalidArgumentError("--dominance masking needs --text"));
    absl::StatusOr<engine::LoadedModel> model = engine::LoadModelDir(**dir);
    if (!model.ok()) return Report(model.status());
    const util::Instant start = util::Instant::Now();
    absl::StatusOr<std::vector<std::vector<double>>> measured =
        moe::MaskingLoss(*model->weights, *model->tokenizer, text);
    if (!measured.ok()) return Report(measured.status());
    loss = *std::move(measured);
    std::cerr << "masking losses of " << loss.size() << " layers measured in "
              << absl::FormatDuration(util::Since(start)) << "\n";
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
                            " cold (warm width ", plan->tiers().warm_width(),
                            "); calibration tokens run at ",
                            absl::SixDigits(100 * moe::CalibrationByteShare(*plan, *config)),
                            "% of the full-width expert bytes; plan in ", out)
            << std::endl;
  return 0;
}

}  // namespace tandem::cli
