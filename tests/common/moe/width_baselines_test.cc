// The equal-bytes baselines: uniform narrowing and adaptive top-k count their bytes as the
// tier policy does, adaptive top-k keeps the fewest leading experts carrying the mass and gives
// the rest's weight to them, and the mass solved from recorded routing reads the asked share.
#include "common/moe/width_baselines.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

namespace tandem::moe {
namespace {

using ::testing::ElementsAre;

TEST(UniformWidthPolicyTest, EveryExpertAtOneWidthAndItsBytes) {
  UniformWidthPolicy policy(/*width=*/30, /*intermediate=*/96);
  std::vector<int32_t> experts = {5, 1, 9, 2};
  std::vector<float> weights = {0.4f, 0.3f, 0.2f, 0.1f};
  std::vector<int> widths(4, 96);
  policy.Widths(0, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
  policy.Widths(1, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
  EXPECT_THAT(widths, ElementsAre(30, 30, 30, 30));
  EXPECT_THAT(weights, ElementsAre(0.4f, 0.3f, 0.2f, 0.1f));  // weights untouched
  EXPECT_EQ(policy.counts().decisions, 2);
  EXPECT_EQ(policy.counts().neurons, 2 * 4 * 30);
  EXPECT_DOUBLE_EQ(policy.counts().ByteShare(4, 96), 30.0 / 96);
  EXPECT_EQ(UniformWidthPolicy(0, 96).width(), 1);  // clamped
  EXPECT_EQ(UniformWidthPolicy(200, 96).width(), 96);
}

TEST(AdaptiveTopKPolicyTest, KeepsTheLeadingExpertsCarryingTheMass) {
  EXPECT_EQ(AdaptiveKept(std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}, 0.7), 2);
  EXPECT_EQ(AdaptiveKept(std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}, 0.71), 3);
  EXPECT_EQ(AdaptiveKept(std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}, 1.0), 4);
  EXPECT_EQ(AdaptiveKept(std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}, 0.0), 1);
  // Raw top-k probabilities (not renormalised): the mass is of their sum.
  EXPECT_EQ(AdaptiveKept(std::vector<float>{0.2f, 0.15f, 0.1f, 0.05f}, 0.7), 2);

  AdaptiveTopKPolicy policy(0.75, /*intermediate=*/96, /*normalised=*/true);
  std::vector<int32_t> experts = {5, 1, 9, 2};
  std::vector<float> weights = {0.4f, 0.3f, 0.2f, 0.1f};
  std::vector<int> widths(4, 96);
  policy.Widths(0, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
  EXPECT_THAT(widths, ElementsAre(96, 96, 96, 0));
  EXPECT_FLOAT_EQ(weights[0] + weights[1] + weights[2], 1.0f);
  EXPECT_FLOAT_EQ(weights[0] / weights[2], 2.0f);
  EXPECT_EQ(weights[3], 0.0f);
  weights = {0.9f, 0.05f, 0.03f, 0.02f};  // one expert carries the mass: it runs alone, at 1
  policy.Widths(0, experts, absl::MakeSpan(weights), absl::MakeSpan(widths));
  EXPECT_THAT(widths, ElementsAre(96, 0, 0, 0));
  EXPECT_THAT(weights, ElementsAre(1.0f, 0.0f, 0.0f, 0.0f));
  EXPECT_EQ(policy.counts().decisions, 2);
  EXPECT_EQ(policy.counts().neurons, (3 + 1) * 96);
  EXPECT_DOUBLE_EQ(policy.counts().ByteShare(4, 96), 4.0 / 8);
}

TEST(AdaptiveMassForShareTest, TheSolvedMassReadsTheAskedShare) {
  // Recorded top-8 routing: random descending softmax weights.
  std::mt19937 rng(7);
  std::normal_distribution<float> logit(0.0f, 1.5f);
  RoutingRecorder recorder(nullptr, 96);
  for (int d = 0; d < 2000; ++d) {
    std::vector<float> w(8);
    float sum = 0;
    for (float& x : w) sum += (x = std::exp(logit(rng)));
    for (float& x : w) x /= sum;
    std::sort(w.rbegin(), w.rend());
    std::vector<int32_t> experts = {0, 1, 2, 3, 4, 5, 6, 7};
    std::vector<int> widths(8, 0);
    recorder.Widths(0, experts, absl::MakeSpan(w), absl::MakeSpan(widths));
    EXPECT_THAT(widths, ::testing::Each(96));  // no inner policy: full width
  }
  ASSERT_EQ(recorder.weights().size(), 2000u * 8);
  for (double share : {0.3, 0.5, 0.62, 0.8}) {
    const double mass = AdaptiveMassForShare(recorder.weights(), 8, share);
    AdaptiveTopKPolicy policy(mass, 96, true);
    for (size_t d = 0; d < 2000; ++d) {
      std::vector<float> w(recorder.weights().begin() + d * 8,
                           recorder.weights().begin() + (d + 1) * 8);
      std::vector<int32_t> experts(8, 0);
      std::vector<int> widths(8, 0);
      policy.Widths(0, experts, absl::MakeSpan(w), absl::MakeSpan(widths));
    }
    // Within one expert of one decision in a thousand of the target.
    EXPECT_NEAR(policy.counts().ByteShare(8, 96), share, 1e-3) << share;
  }
  EXPECT_GT(AdaptiveMassForShare(recorder.weights(), 8, 1.0), 0.99);
  EXPECT_EQ(AdaptiveMassForShare({}, 8, 0.5), 1.0);  // nothing recorded: keep everything
}

}  // namespace
}  // namespace tandem::moe
