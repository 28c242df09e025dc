// Choosing tiers by a budget on a hand-built case: the candidate grid (the pair rule with
// top-2, widths by rank with top-k), and against an evaluator whose loss falls with the bytes,
// the cheapest candidate within an accuracy budget or the least loss within a bytes budget;
// every candidate screened, the choice checked on the whole text (an optimistic screen does
// not get a plan over the budget chosen); bad and impossible budgets refused.
#include "common/moe/tier_search.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "tests/common/moe/hand_built_tiers.h"

namespace tandem::moe {
namespace {

using ::testing::HasSubstr;

model::ModelConfig TopKConfig(int k) {
  auto config = model::ParseModelConfig(absl::StrCat(
      R"({"model_type": "qwen2_moe", "hidden_size": 32, "intermediate_size": 64,
      "moe_intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 4,
      "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": )",
      k, R"(, "vocab_size": 50, "max_position_embeddings": 64, "norm_topk_prob": true})"));
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

CalibrationStats Stats() { return testing::HandBuiltStats(); }

tandem::v1::PruningPlan Base() { return testing::HandBuiltPlan(); }

// Accuracy 0.2 at full width, losing 0.4 of it per share of bytes not run.
constexpr double kFull = 0.2;
double AccuracyAt(double share) { return kFull * (1 - 0.4 * (1 - share)); }

struct Counting {
  model::ModelConfig config;
  double screen_optimism = 0;  // the screening text's accuracy this much above the whole's
  int calls = 0, checks = 0;
  TierEvaluator evaluator() {
    return
        [this](const tandem::v1::PruningPlan& plan, bool screening) -> absl::StatusOr<TierScore> {
          ++calls;
          checks += !screening && plan.has_tiers();
          const double share = CalibrationByteShare(plan, config);
          const double optimism = screening && plan.has_tiers() ? screen_optimism : 0;
          return TierScore{share, AccuracyAt(share) + optimism, 1.0};
        };
  }
};

TEST(TierCandidatesTest, PairRuleForTopTwoAndWidthsByRankForTopK) {
  // Per share setting: skipping (t in [1, k) x two narrow widths), then four narrowings.
  const std::vector<TierOptions> two = TierCandidates(TopKConfig(2));
  ASSERT_EQ(two.size(), 5u * (1 * 2 + 4));
  EXPECT_TRUE(two[0].warm_widths.empty());  // the pair rule
  EXPECT_TRUE(two[1].warm_widths.empty());
  EXPECT_EQ(two[1].warm_width, 6);
  EXPECT_EQ(two[3].warm_widths, (std::vector<int>{24, 12}));  // narrowing (1/2, 1/3)
  EXPECT_EQ(two[3].cold_widths, (std::vector<int>{12, 8}));
  const std::vector<TierOptions> three = TierCandidates(TopKConfig(3));
  ASSERT_EQ(three.size(), 5u * (2 * 2 + 4));
  // t = 2, narrow a quarter: Warm narrows ranks 1-2, Cold skips them.
  EXPECT_EQ(three[3].warm_widths, (std::vector<int>{24, 6, 6}));
  EXPECT_EQ(three[3].cold_widths, (std::vector<int>{24, 0, 0}));
  EXPECT_EQ(three[3].hot_widths, (std::vector<int>{24, 24, 24}));
}

TEST(SelectTiersTest, CheapestWithinAnAccuracyBudget) {
  for (int k : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("top-", k));
    Counting counting{TopKConfig(k)};
    for (double budget : {0.05, 0.1, 0.2}) {
      counting.calls = counting.checks = 0;
      auto selection = SelectTiers(Stats(), Base(), counting.config, {.max_accuracy_loss = budget},
                                   counting.evaluator());
      ASSERT_TRUE(selection.ok()) << selection.status();
      // Brute force over the grid: the fewest bytes whose loss is within the budget.
      double best = 2;
      for (const TierOptions& o : TierCandidates(counting.config)) {
        tandem::v1::PruningPlan plan = Base();
        ASSERT_EQ(AssignTiers(Stats(), o, nullptr, counting.config, &plan), absl::OkStatus());
        const double share = CalibrationByteShare(plan, counting.config);
        if ((kFull - AccuracyAt(share)) / kFull <= budget) best = std::min(best, share);
      }
      EXPECT_DOUBLE_EQ(selection->chosen.byte_share, best) << budget;
      EXPECT_LE(selection->chosen.accuracy_loss, budget);
      EXPECT_DOUBLE_EQ(CalibrationByteShare(selection->plan, counting.config), best);
      EXPECT_TRUE(selection->plan.has_tiers());
      EXPECT_DOUBLE_EQ(selection->full.accuracy, kFull);
      // The untiered plan twice, every distinct candidate screened, one check (an exact screen).
      EXPECT_LE(counting.calls, 2 + static_cast<int>(TierCandidates(counting.config).size()) + 1);
      EXPECT_EQ(counting.checks, 1);
      EXPECT_FALSE(selection->chosen.screening);
      EXPECT_EQ(static_cast<int>(selection->trials.size()) + 2, counting.calls);
    }
  }
}

TEST(SelectTiersTest, AnOptimisticScreenIsCheckedOnTheWholeText) {
  const model::ModelConfig config = TopKConfig(3);
  std::vector<double> shares;
  for (const TierOptions& o : TierCandidates(config)) {
    tandem::v1::PruningPlan plan = Base();
    ASSERT_EQ(AssignTiers(Stats(), o, nullptr, config, &plan), absl::OkStatus());
    shares.push_back(CalibrationByteShare(plan, config));
  }
  std::sort(shares.begin(), shares.end());
  shares.erase(std::unique(shares.begin(), shares.end()), shares.end());
  ASSERT_GE(shares.size(), 4u);
  // A budget the middle share s2 just meets, and a screen flattering every tiered plan so that
  // the next cheaper share s1 passes it: s1 is checked first and fails on the whole text.
  const double s1 = shares[shares.size() / 2 - 1], s2 = shares[shares.size() / 2];
  const double budget = 0.4 * (1 - s2) + 1e-9;
  Counting counting{config, kFull * 0.4 * (s2 - s1) + 1e-9};
  auto selection =
      SelectTiers(Stats(), Base(), config, {.max_accuracy_loss = budget}, counting.evaluator());
  ASSERT_TRUE(selection.ok()) << selection.status();
  EXPECT_DOUBLE_EQ(selection->chosen.byte_share, s2);
  EXPECT_LE(selection->chosen.accuracy_loss, budget);
  EXPECT_GT(counting.checks, 1);
  EXPECT_LE(counting.checks, kChecks);
  // Flattered beyond what kChecks checks can get past: no choice, and a message saying so.
  Counting flattered{config, 0.05};
  auto none =
      SelectTiers(Stats(), Base(), config, {.max_accuracy_loss = 0.02}, flattered.evaluator());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("on the whole text"));
}

TEST(SelectTiersTest, LeastLossWithinABytesBudget) {
  Counting counting{TopKConfig(3)};
  auto selection =
      SelectTiers(Stats(), Base(), counting.config, {.max_byte_share = 0.8}, counting.evaluator());
  ASSERT_TRUE(selection.ok()) << selection.status();
  double best = 0;
  for (const TierOptions& o : TierCandidates(counting.config)) {
    tandem::v1::PruningPlan plan = Base();
    ASSERT_EQ(AssignTiers(Stats(), o, nullptr, counting.config, &plan), absl::OkStatus());
    const double share = CalibrationByteShare(plan, counting.config);
    if (share <= 0.8) best = std::max(best, share);
  }
  EXPECT_DOUBLE_EQ(selection->chosen.byte_share, best);
  EXPECT_LE(selection->chosen.byte_share, 0.8);
  EXPECT_LT(best, 0.8);  // not the full model
}

TEST(SelectTiersTest, BadAndImpossibleBudgetsAreRefused) {
  Counting counting{TopKConfig(3)};
  EXPECT_EQ(SelectTiers(Stats(), Base(), counting.config, {}, counting.evaluator()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SelectTiers(Stats(), Base(), counting.config,
                        {.max_accuracy_loss = 0.1, .max_byte_share = 0.5}, counting.evaluator())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // No candidate runs every byte, so none loses nothing.
  auto none =
      SelectTiers(Stats(), Base(), counting.config, {.max_accuracy_loss = 0}, counting.evaluator());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("screening text"));
  auto tiny =
      SelectTiers(Stats(), Base(), counting.config, {.max_byte_share = 0.01}, counting.evaluator());
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kFailedPrecondition);
  // An evaluator's error is the selection's.
  auto failing = SelectTiers(Stats(), Base(), counting.config, {.max_accuracy_loss = 0.1},
                             [](const tandem::v1::PruningPlan&, bool) -> absl::StatusOr<TierScore> {
                               return absl::UnavailableError("scoring failed");
                             });
  EXPECT_EQ(failing.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::moe
