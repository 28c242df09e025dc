// tandem eval --model DIR --plan PLAN --text FILE --prompts FILE [--mode full,conventional,handoff]
//             [--context N --max_tokens N --stop S1,S2 --baselines uniform,adaptive
//              --out RESULT.json]
// Scores and generates with the full model and a pruning plan in each mode (common/moe/
// evaluation.h) and prints one row per mode; --out writes every number as JSON. With a tiered
// plan, --baselines also runs each pruned mode with the equal-bytes baselines
// (common/moe/width_baselines.h) at the expert bytes the plan ran.
#include <cmath>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/engine/generator.h"
#include "common/engine/overlay.h"
#include "common/engine/perplexity.h"
#include "common/moe/evaluation.h"
#include "common/moe/pruning_plan.h"
#include "common/moe/tiers.h"
#include "common/moe/width_baselines.h"
#include "common/util/clock.h"
#include "nlohmann/json.hpp"
#include "tools/cli/commands.h"

ABSL_FLAG(std::string, prompts, "", "eval: prompts to continue greedily, one per non-blank line.");
ABSL_FLAG(std::string, mode, "full,conventional,handoff",
          "eval: modes to run, comma-separated: full (every expert), conventional (the plan "
          "for prompt and continuation), handoff (full prompt, the plan's continuation).");
ABSL_FLAG(int, context, 128,
          "eval: prompt tokens of each scored window; the rest of the window is scored.");
ABSL_FLAG(int, near_tokens, 32,
          "eval: also score the first N continuation tokens of each window on their own.");
ABSL_FLAG(std::vector<std::string>, baselines, {},
          "eval: with a tiered plan, also run each pruned mode with these equal-bytes baselines "
          "at the expert bytes the plan ran, comma-separated: uniform (every routed expert "
          "narrowed alike), adaptive (each token's lowest-weighted experts dropped).");
ABSL_FLAG(std::vector<std::string>, stop, {},
          "eval: strings that end a continuation as EOS does, comma-separated (at most 4).");

namespace tandem::cli {
namespace {

nlohmann::json ToJson(const moe::GenerationStats& g) {
  return {{"prompts", g.prompts},
          {"mean_length", g.mean_length},
          {"p50_length", g.p50_length},
          {"p90_length", g.p90_length},
          {"hit_max_share", g.hit_max_share},
          {"never_ended_share", g.never_ended_share},
          {"exact_agreement", g.exact_agreement},
          {"prefix_agreement", g.prefix_agreement}};
}

}  // namespace

int Eval() {
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const std::string text = absl::GetFlag(FLAGS_text);
  const std::string prompts_path = absl::GetFlag(FLAGS_prompts);
  const std::string plan_path = absl::GetFlag(FLAGS_plan);
  if (model_dir.empty() || text.empty() || prompts_path.empty()) {
    return Report(
        absl::InvalidArgumentError("eval needs --model DIR, --text FILE and --prompts FILE"));
  }
  std::vector<moe::EvalMode> modes;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_mode), ',', absl::SkipEmpty())) {
    absl::StatusOr<moe::EvalMode> mode = moe::ParseEvalMode(std::string(name));
    if (!mode.ok()) return Report(mode.status());
    if (*mode != moe::EvalMode::kFull && plan_path.empty()) {
      return Report(absl::InvalidArgumentError(
          absl::StrCat("--mode ", name, " needs --plan (the pruned model's experts)")));
    }
    modes.push_back(*mode);
  }
  if (modes.empty()) return Report(absl::InvalidArgumentError("--mode names no mode"));

  absl::StatusOr<std::unique_ptr<model::ModelDir>> dir = model::ModelDir::Open(model_dir);
  if (!dir.ok()) return Report(dir.status());
  // The pruned model: the plan's mask and, for a plan with tiers, mixed width.
  engine::ExpertMask plan;
  std::unique_ptr<moe::TierWidthPolicy> tiers;
  if (!plan_path.empty()) {
    absl::StatusOr<moe::PlanForModel> loaded = moe::LoadPlanFor(plan_path, **dir);
    if (!loaded.ok()) return Report(loaded.status());
    plan = std::move(loaded->mask);
    absl::StatusOr<std::unique_ptr<moe::TierWidthPolicy>> policy =
        moe::TierPolicyFor(loaded->plan, **dir);
    if (!policy.ok()) return Report(policy.status());
    tiers = *std::move(policy);
  }
  absl::StatusOr<engine::LoadedModel> model = engine::LoadModelDir(**dir);
  if (!model.ok()) return Report(model.status());
  // A distilled decoder: the pruned phases run its always-on tensors.
  std::unique_ptr<engine::DecoderOverlay> overlay;
  const std::string overlay_path = absl::GetFlag(FLAGS_overlay);
  if (!overlay_path.empty()) {
    if (plan_path.empty()) {
      return Report(absl::InvalidArgumentError("--overlay needs the --plan it was distilled for"));
    }
    absl::StatusOr<std::unique_ptr<engine::DecoderOverlay>> loaded =
        engine::LoadDecoderOverlay(overlay_path, **dir, *model->weights, plan);
    if (!loaded.ok()) return Report(loaded.status());
    overlay = *std::move(loaded);
  }
  absl::StatusOr<std::vector<std::vector<int32_t>>> prompts =
      moe::ReadPrompts(*model->tokenizer, prompts_path, model->tokenizer->add_bos());
  if (!prompts.ok()) return Report(prompts.status());
  moe::GenerationOptions generation;
  generation.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  generation.stop = absl::GetFlag(FLAGS_stop);

  // The full model's continuations are the reference every mode is compared with.
  const util::Instant start = util::Instant::Now();
  absl::StatusOr<std::vector<moe::Continuation>> reference =
      moe::GenerateGreedy(*model->weights, *model->tokenizer, *prompts,
                          moe::PhaseOptionsFor(moe::EvalMode::kFull, nullptr), generation);
  if (!reference.ok()) return Report(reference.status());

  nlohmann::json doc = {{"model", model_dir},
                        {"plan", plan_path},
                        {"overlay", overlay_path},
                        {"text", text},
                        {"prompts", prompts_path},
                        {"context", absl::GetFlag(FLAGS_context)},
                        {"max_tokens", generation.max_tokens},
                        {"stop", generation.stop},
                        {"modes", nlohmann::json::array()}};
  const int near_tokens = absl::GetFlag(FLAGS_near_tokens);
  std::cout << absl::StrCat("mode          perplexity  accuracy  ppl@", near_tokens, "  acc@",
                            near_tokens,
                            "  | length mean   p50   p90  hit-max  never-ended  exact  prefix\n");
  const int top_k = static_cast<int>(model->weights->config.num_experts_per_tok);
  const int intermediate = static_cast<int>(model->weights->config.intermediate_size);
  bool uniform = false, adaptive = false;
  for (const std::string& name : absl::GetFlag(FLAGS_baselines)) {
    if (name == "uniform") {
      uniform = true;
    } else if (name == "adaptive") {
      adaptive = true;
    } else {
      return Report(absl::InvalidArgumentError(
          absl::StrCat("--baselines: \"", name, "\" is not uniform or adaptive")));
    }
  }
  if ((uniform || adaptive) && tiers == nullptr) {
    return Report(absl::InvalidArgumentError(
        "--baselines compare with a tiered plan's expert bytes; --plan has no tiers"));
  }
  // One row: `mode` with `widths` as the pruned model's width policy; `counted` reads and
  // resets what the policy ran (null: full width).
  const auto run = [&](moe::EvalMode mode, const std::string& label,
                       const engine::ExpertWidthPolicy* widths,
                       const std::function<moe::WidthCounts()>& counted, bool tiered,
                       nlohmann::json extra) -> absl::Status {
    const moe::PhaseOptions phases = moe::PhaseOptionsFor(mode, &plan, widths, overlay.get());
    if (counted) counted();
    engine::PerplexityOptions scoring;
    scoring.context = absl::GetFlag(FLAGS_context);
    scoring.context_moe = phases.prefill;
    scoring.moe = phases.decode;
    absl::StatusOr<engine::PerplexityResult> score =
        engine::EvaluatePerplexity(*model->weights, *model->tokenizer, text, scoring);
    if (!score.ok()) return score.status();
    // The expert neurons the scoring run ran against full width (in conventional mode the
    // prompts' too), and for a tiered plan its routed pairs by tier.
    const moe::TierWidthPolicy::Counts tier_counts =
        tiered ? tiers->counts() : moe::TierWidthPolicy::Counts{};
    const moe::WidthCounts counts = counted ? counted() : moe::WidthCounts{};
    absl::StatusOr<std::vector<moe::Continuation>> generated =
        mode == moe::EvalMode::kFull
            ? reference
            : moe::GenerateGreedy(*model->weights, *model->tokenizer, *prompts, phases, generation);
    if (!generated.ok()) return generated.status();
    const moe::ScoreSummary near = moe::ScoreNearPrompt(*score, near_tokens);
    const moe::GenerationStats g = moe::Summarize(
        *generated, mode == moe::EvalMode::kFull ? nullptr : &*reference, generation.max_tokens);
    // Perplexities to 2 decimals, accuracies to 3, lengths to 1, shares to 2.
    std::cout << std::left << std::setw(12) << label << std::right << std::fixed
              << std::setprecision(2) << std::setw(12) << score->perplexity << std::setprecision(3)
              << std::setw(10) << score->accuracy << std::setprecision(2) << std::setw(8)
              << near.perplexity << std::setprecision(3) << std::setw(8) << near.accuracy << "  | "
              << std::setprecision(1) << std::setw(11) << g.mean_length << std::setw(6)
              << g.p50_length << std::setw(6) << g.p90_length << std::setprecision(2)
              << std::setw(9) << g.hit_max_share << std::setw(13) << g.never_ended_share
              << std::setw(7) << g.exact_agreement << std::setw(8) << g.prefix_agreement
              << std::endl;
    nlohmann::json tier_json = nullptr;
    const double byte_share = counts.ByteShare(top_k, intermediate);
    if (tier_counts.total() > 0) {
      const double pairs = static_cast<double>(tier_counts.total());
      tier_json = {{"pairs", tier_counts.total()},
                   {"hot_share", tier_counts.hot / pairs},
                   {"warm_share", tier_counts.warm / pairs},
                   {"cold_share", tier_counts.cold / pairs},
                   {"expert_bytes_vs_full_width", byte_share}};
      std::cout << absl::StrCat(
          "            tiers: hot ", absl::SixDigits(100 * tier_counts.hot / pairs), "%, warm ",
          absl::SixDigits(100 * tier_counts.warm / pairs), "%, cold ",
          absl::SixDigits(100 * tier_counts.cold / pairs), "% of pairs; expert bytes ",
          absl::SixDigits(100 * byte_share), "% of full width\n");
    } else if (counts.decisions > 0) {
      std::cout << absl::StrCat("            expert bytes ", absl::SixDigits(100 * byte_share),
                                "% of full width\n");
    }
    nlohmann::json row = {{"mode", std::string(moe::EvalModeName(mode))},
                          {"label", label},
                          {"tiers", tier_json},
                          {"expert_bytes_vs_full_width",
                           counts.decisions > 0 ? nlohmann::json(byte_share) : nlohmann::json(1.0)},
                          {"perplexity", score->perplexity},
                          {"nll", score->nll},
                          {"accuracy", score->accuracy},
                          {"scored_tokens", score->tokens},
                          {"near_prompt",
                           {{"tokens", near.tokens},
                            {"max_offset", near_tokens},
                            {"perplexity", near.perplexity},
                            {"accuracy", near.accuracy}}},
                          {"generation", ToJson(g)}};
    row.update(extra);
    doc["modes"].push_back(std::move(row));
    return absl::OkStatus();
  };
  for (moe::EvalMode mode : modes) {
    const std::string name(moe::EvalModeName(mode));
    if (mode == moe::EvalMode::kFull || tiers == nullptr) {
      if (absl::Status s = run(mode, name, nullptr, nullptr, false, nlohmann::json::object());
          !s.ok()) {
        return Report(s);
      }
      continue;
    }
    // The tiered plan, its routing recorded for the adaptive baseline's mass.
    moe::RoutingRecorder recorder(tiers.get(), intermediate);
    const auto tier_counts = [&] {
      const moe::WidthCounts c = tiers->counts().widths();
      tiers->ResetCounts();
      return c;
    };
    moe::WidthCounts plan_counts;
    std::vector<float> routing;  // the scoring run's, not the generation's
    const auto recorded = [&] {
      plan_counts = tier_counts();
      routing = recorder.weights();
      recorder.Clear();
      return plan_counts;
    };
    if (absl::Status s = run(mode, name, &recorder, recorded, true, nlohmann::json::object());
        !s.ok()) {
      return Report(s);
    }
    const double share = plan_counts.ByteShare(top_k, intermediate);
    if (uniform) {
      moe::UniformWidthPolicy policy(static_cast<int>(std::lround(share * intermediate)),
                                     intermediate);
      const auto counted = [&] {
        const moe::WidthCounts c = policy.counts();
        policy.ResetCounts();
        return c;
      };
      if (absl::Status s = run(mode, name + "/uniform", &policy, counted, false,
                               {{"baseline", "uniform"}, {"width", policy.width()}});
          !s.ok()) {
        return Report(s);
      }
    }
    if (adaptive) {
      const double mass = moe::AdaptiveMassForShare(routing, top_k, share);
      moe::AdaptiveTopKPolicy policy(mass, intermediate, model->weights->config.norm_topk_prob);
      const auto counted = [&] {
        const moe::WidthCounts c = policy.counts();
        policy.ResetCounts();
        return c;
      };
      if (absl::Status s = run(mode, name + "/adaptive", &policy, counted, false,
                               {{"baseline", "adaptive"}, {"mass", mass}});
          !s.ok()) {
        return Report(s);
      }
    }
  }
  std::cerr << absl::StrCat(prompts->size(), " prompts; ", absl::FormatDuration(util::Since(start)),
                            "\n");
  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    std::ofstream file(out);
    file << doc.dump(1) << "\n";
    if (!file) return Report(absl::PermissionDeniedError("cannot write " + out));
  }
  return 0;
}

}  // namespace tandem::cli
