// Tiers on a hand-built case: pairs cut by cumulative share of routed tokens, dominant experts
// by the router-weight heuristic and by masking loss, only pairs of retained experts, the
// widths and weights the policy gives each tier, plan validation, and bad options.
#include "common/moe/tiers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/moe/pruning_plan.h"
#include "tests/common/moe/hand_built_tiers.h"

namespace tandem::moe {
namespace {

using tandem::v1::PairTier;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

model::ModelConfig Config() {
  auto config = model::ParseModelConfig(R"({"model_type": "mixtral", "hidden_size": 32,
      "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 4,
      "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
      "vocab_size": 50, "max_position_embeddings": 64})");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// The same four experts routed top-3 (Qwen2-MoE layout), top-k weights renormalised or not.
model::ModelConfig TopThreeConfig(bool norm_topk_prob) {
  auto config = model::ParseModelConfig(absl::StrCat(
      R"({"model_type": "qwen2_moe", "hidden_size": 32, "intermediate_size": 64,
      "moe_intermediate_size": 24, "shared_expert_intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
      "num_experts": 4, "num_experts_per_tok": 3, "vocab_size": 50,
      "max_position_embeddings": 64, "norm_topk_prob": )",
      norm_topk_prob ? "true" : "false", "}"));
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// tests/common/moe/hand_built_tiers.h: 100 routed tokens over four experts.
CalibrationStats Stats() { return testing::HandBuiltStats(); }

tandem::v1::PruningPlan Plan(std::vector<int> retained) { return testing::HandBuiltPlan(retained); }

// (tier, dominant) of each pair, in order.
std::vector<std::pair<PairTier, int>> Tiers(const tandem::v1::PruningPlan& plan) {
  std::vector<std::pair<PairTier, int>> out;
  for (const auto& pair : plan.layers(0).pairs()) out.push_back({pair.tier(), pair.dominant()});
  return out;
}

TEST(AssignTiersTest, CumulativeSharesAndRouterWeightDominance) {
  tandem::v1::PruningPlan plan = Plan({0, 1, 2, 3});
  ASSERT_EQ(AssignTiers(Stats(), {.hot_share = 0.5, .warm_share = 0.3, .warm_width = 6}, nullptr,
                        Config(), &plan),
            absl::OkStatus());
  // Pairs in order (0,1) (0,2) (0,3) (1,2) (1,3) (2,3). (0,1) starts at share 0: Hot; (0,2)
  // at 0.5: Warm; (1,2) at 0.8 and (2,3) at 0.95: Cold; unseen pairs: Cold.
  EXPECT_THAT(Tiers(plan), ElementsAre(std::pair{tandem::v1::PAIR_TIER_HOT, 1},
                                       std::pair{tandem::v1::PAIR_TIER_WARM, 0},
                                       std::pair{tandem::v1::PAIR_TIER_COLD, 0},
                                       std::pair{tandem::v1::PAIR_TIER_COLD, 2},
                                       std::pair{tandem::v1::PAIR_TIER_COLD, 1},
                                       std::pair{tandem::v1::PAIR_TIER_COLD, 2}));
  EXPECT_EQ(plan.layers(0).pairs(0).count(), 50);
  EXPECT_EQ(plan.tiers().warm_width(), 6);
  EXPECT_EQ(ValidatePlan(plan, Config()), absl::OkStatus());
  // Cache priorities: (0,1) Hot adds 50 to both; (0,2) Warm 30 to 0; (1,2) Cold 15 to 2;
  // (2,3) Cold 5 to 2.
  EXPECT_THAT(CachePriorities(plan)[0], ElementsAre(81, 51, 21, 1));
}

TEST(AssignTiersTest, MaskingLossDominanceAndRetainedPairsOnly) {
  tandem::v1::PruningPlan plan = Plan({0, 2, 3});  // expert 1 pruned
  const std::vector<std::vector<double>> loss = {{0.1, 9.0, 0.5, 0.7}};
  ASSERT_EQ(
      AssignTiers(
          Stats(),
          {.hot_share = 0.8, .warm_share = 0.2, .dominance = tandem::v1::DOMINANCE_MASKING_LOSS},
          &loss, Config(), &plan),
      absl::OkStatus());
  // Pairs (0,2) 30, (0,3) 0, (2,3) 5 of 35 routed tokens among retained experts.
  ASSERT_EQ(plan.layers(0).pairs_size(), 3);
  EXPECT_THAT(Tiers(plan), ElementsAre(std::pair{tandem::v1::PAIR_TIER_HOT, 2},
                                       std::pair{tandem::v1::PAIR_TIER_COLD, 3},
                                       std::pair{tandem::v1::PAIR_TIER_WARM, 3}));
  EXPECT_EQ(plan.tiers().warm_width(), 12);  // default: half of 24
}

TEST(AssignTiersTest, BadOptionsAndTamperedPlansAreRefused) {
  tandem::v1::PruningPlan plan = Plan({0, 1, 2, 3});
  EXPECT_EQ(
      AssignTiers(Stats(), {.hot_share = 0.7, .warm_share = 0.5}, nullptr, Config(), &plan).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignTiers(Stats(), {.warm_width = 24}, nullptr, Config(), &plan).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignTiers(Stats(), {.dominance = tandem::v1::DOMINANCE_MASKING_LOSS}, nullptr,
                        Config(), &plan)
                .code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(AssignTiers(Stats(), {}, nullptr, Config(), &plan), absl::OkStatus());
  tandem::v1::PruningPlan missing = plan;
  missing.mutable_layers(0)->mutable_pairs()->RemoveLast();
  EXPECT_THAT(ValidatePlan(missing, Config()).message(), HasSubstr("pair 5 should be (2, 3)"));
  tandem::v1::PruningPlan foreign = plan;
  foreign.mutable_layers(0)->mutable_pairs(0)->set_dominant(3);
  EXPECT_THAT(ValidatePlan(foreign, Config()).message(), HasSubstr("dominant"));
  tandem::v1::PruningPlan no_tiers = plan;
  no_tiers.clear_tiers();
  EXPECT_THAT(ValidatePlan(no_tiers, Config()).message(), HasSubstr("no tiers"));
}

TEST(TierWidthPolicyTest, WidthsAndWeightsOfEachTier) {
  tandem::v1::PruningPlan plan = Plan({0, 1, 2, 3});
  ASSERT_EQ(AssignTiers(Stats(), {.hot_share = 0.5, .warm_share = 0.3, .warm_width = 6}, nullptr,
                        Config(), &plan),
            absl::OkStatus());
  auto policy = TierWidthPolicy::Create(plan, Config());
  ASSERT_TRUE(policy.ok()) << policy.status();
  std::vector<int32_t> experts = {1, 0};  // Hot
  std::vector<float> weights = {0.6f, 0.4f};
  std::vector<int> widths = {24, 24};
  (*policy)->Widths(0, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
  EXPECT_THAT(widths, ElementsAre(24, 24));
  EXPECT_THAT(weights, ElementsAre(0.6f, 0.4f));
  experts = {2, 0};  // Warm, dominant 0 (the second)
  (*policy)->Widths(0, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
  EXPECT_THAT(widths, ElementsAre(6, 24));
  EXPECT_THAT(weights, ElementsAre(0.6f, 0.4f));
  experts = {1, 2};  // Cold, dominant 2: only it runs, with weight 1
  (*policy)->Widths(0, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
  EXPECT_THAT(widths, ElementsAre(0, 24));
  EXPECT_THAT(weights, ElementsAre(0.0f, 1.0f));
  const TierWidthPolicy::Counts counts = (*policy)->counts();
  EXPECT_EQ(counts.hot, 1);
  EXPECT_EQ(counts.warm, 1);
  EXPECT_EQ(counts.cold, 1);
  EXPECT_EQ(counts.neurons, 48 + 30 + 24);
  EXPECT_EQ(TierWidthPolicy::Create(Plan({0, 1, 2, 3}), Config()).status().code(),
            absl::StatusCode::kInvalidArgument);  // no tiers
}

// Top-k with k > 2: the tier is the two leading experts' (by router weight), whatever the
// third is; the third runs at full width; a Cold pair's auxiliary is dropped and what runs is
// scaled back to the routed total (1 when renormalised, the top-k mass otherwise).
TEST(TierWidthPolicyTest, TopKTiersTheLeadingPairAndRunsTheRestAtFullWidth) {
  for (bool normalised : {true, false}) {
    SCOPED_TRACE(normalised ? "norm_topk_prob" : "raw top-k probabilities");
    const model::ModelConfig config = TopThreeConfig(normalised);
    tandem::v1::PruningPlan plan = Plan({0, 1, 2, 3});
    ASSERT_EQ(AssignTiers(Stats(), {.hot_share = 0.5, .warm_share = 0.3, .warm_width = 6}, nullptr,
                          config, &plan),
              absl::OkStatus());
    auto policy = TierWidthPolicy::Create(plan, config);
    ASSERT_TRUE(policy.ok()) << policy.status();
    std::vector<int32_t> experts = {0, 1, 3};  // leading pair (0, 1): Hot
    // Renormalised weights sum to one; raw top-k probabilities to less.
    const std::vector<float> routed = normalised ? std::vector<float>{0.5f, 0.375f, 0.125f}
                                                 : std::vector<float>{0.4f, 0.3f, 0.1f};
    std::vector<float> weights = routed;
    std::vector<int> widths = {24, 24, 24};
    (*policy)->Widths(0, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
    EXPECT_THAT(widths, ElementsAre(24, 24, 24));
    EXPECT_EQ(weights, routed);
    experts = {0, 2, 1};  // (0, 2): Warm, dominant 0; expert 1 third, at full width
    (*policy)->Widths(0, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
    EXPECT_THAT(widths, ElementsAre(24, 6, 24));
    EXPECT_EQ(weights, routed);
    experts = {2, 1, 0};  // (1, 2): Cold, dominant 2; the auxiliary 1 is dropped
    const float total = normalised ? 1.0f : 0.8f;
    (*policy)->Widths(0, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
    EXPECT_THAT(widths, ElementsAre(24, 0, 24));
    EXPECT_FLOAT_EQ(weights[1], 0.0f);
    EXPECT_FLOAT_EQ(weights[0] + weights[2], total);
    EXPECT_FLOAT_EQ(weights[0] / weights[2], 4.0f);  // their ratio is kept
    EXPECT_EQ((*policy)->counts().neurons, 72 + 54 + 48);
  }
  // Top-1 routing has no pairs to tier.
  auto top1 = model::ParseModelConfig(R"({"model_type": "mixtral", "hidden_size": 32,
      "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 4,
      "num_local_experts": 4, "num_experts_per_tok": 1, "vocab_size": 50})");
  ASSERT_TRUE(top1.ok());
  tandem::v1::PruningPlan plan = Plan({0, 1, 2, 3});
  EXPECT_THAT(AssignTiers(Stats(), {}, nullptr, *top1, &plan).message(), HasSubstr("k >= 2"));
}

// The top-k rule with the plan's own widths by rank (top-3, hand-built): rank 0 is the leading
// pair's dominant whichever the router put first, rank 1 its other expert, rank 2 the third;
// skipped ranks give their weight to what runs; the byte share the calibration predicts.
TEST(TierWidthPolicyTest, TopKWidthsByRankFollowTheLeadingPairsTier) {
  const model::ModelConfig config = TopThreeConfig(/*norm_topk_prob=*/true);
  tandem::v1::PruningPlan plan = Plan({0, 1, 2, 3});
  ASSERT_EQ(AssignTiers(Stats(),
                        {.hot_share = 0.5,
                         .warm_share = 0.3,
                         .warm_width = 6,
                         .hot_widths = {24, 24, 12},
                         .warm_widths = {24, 12, 0},
                         .cold_widths = {24, 0, 0}},
                        nullptr, config, &plan),
            absl::OkStatus());
  EXPECT_THAT(plan.tiers().warm_widths(), ElementsAre(24, 12, 0));
  auto policy = TierWidthPolicy::Create(plan, config);
  ASSERT_TRUE(policy.ok()) << policy.status();
  const std::vector<float> routed = {0.5f, 0.3f, 0.2f};
  std::vector<float> weights = routed;
  std::vector<int> widths(3, 24);
  // (0, 1) Hot, dominant 1 though the router ranks 0 first: 1 is rank 0, 0 rank 1, 3 rank 2.
  std::vector<int32_t> experts = {0, 1, 3};
  (*policy)->Widths(0, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
  EXPECT_THAT(widths, ElementsAre(24, 24, 12));
  EXPECT_EQ(weights, routed);
  // (0, 2) Warm, dominant 0: 0 full, 2 narrow, the third (3) skipped; 0 and 2 carry its weight.
  experts = {2, 0, 3};
  (*policy)->Widths(0, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
  EXPECT_THAT(widths, ElementsAre(12, 24, 0));
  EXPECT_FLOAT_EQ(weights[0], 0.625f);
  EXPECT_FLOAT_EQ(weights[1], 0.375f);
  EXPECT_EQ(weights[2], 0.0f);
  // (2, 3) Cold, dominant 2 (second in the router's order): only 2 runs, with weight exactly 1.
  weights = routed;
  experts = {3, 2, 1};
  (*policy)->Widths(0, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
  EXPECT_THAT(widths, ElementsAre(0, 24, 0));
  EXPECT_THAT(weights, ElementsAre(0.0f, 1.0f, 0.0f));
  const TierWidthPolicy::Counts counts = (*policy)->counts();
  EXPECT_EQ(counts.hot + counts.warm + counts.cold, 3);
  EXPECT_EQ(counts.neurons, 60 + 36 + 24);
  // Calibration: Hot (0,1) 50 tokens at 60/72, Warm (0,2) 30 at 36/72, Cold (1,2) 15 and (2,3) 5
  // at 24/72.
  EXPECT_DOUBLE_EQ(CalibrationByteShare(plan, config),
                   (50.0 * 60 + 30.0 * 36 + 20.0 * 24) / (100.0 * 72));
  // Without lists the pair rule, ranks after the pair full: (50*72 + 30*54 + 20*48) / 7200.
  tandem::v1::PruningPlan pair_rule = Plan({0, 1, 2, 3});
  ASSERT_EQ(AssignTiers(Stats(), {.hot_share = 0.5, .warm_share = 0.3, .warm_width = 6}, nullptr,
                        config, &pair_rule),
            absl::OkStatus());
  EXPECT_DOUBLE_EQ(CalibrationByteShare(pair_rule, config),
                   (50.0 * 72 + 30.0 * 54 + 20.0 * 48) / 7200.0);
}

TEST(TierWidthPolicyTest, BadWidthsByRankAreRefused) {
  const model::ModelConfig config = TopThreeConfig(true);
  for (const auto& [options, message] : std::vector<std::pair<TierOptions, std::string>>{
           {{.hot_widths = {24, 24}}, "hot widths give 2 ranks"},
           {{.warm_widths = {0, 24, 24}}, "warm width of rank 0 is 0"},
           {{.cold_widths = {24, 25, 0}}, "cold width of rank 1 is 25"},
           {{.cold_widths = {24, -1, 0}}, "cold width of rank 1 is -1"}}) {
    tandem::v1::PruningPlan plan = Plan({0, 1, 2, 3});
    EXPECT_THAT(AssignTiers(Stats(), options, nullptr, config, &plan).message(),
                HasSubstr(message));
  }
}

}  // namespace
}  // namespace tandem::moe
