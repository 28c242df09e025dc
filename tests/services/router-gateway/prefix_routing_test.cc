#include "services/router-gateway/prefix_routing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace tandem::gateway {
namespace {

using ::testing::ElementsAre;

std::vector<int32_t> Range(int first, int n) {
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) out[i] = first + i;
  return out;
}

TEST(PrefixBlockKeysTest, ChainsFullBlocksOnly) {
  const std::vector<int32_t> prompt = Range(0, 35);
  const std::vector<uint64_t> keys = PrefixBlockKeys(prompt, 16);
  ASSERT_EQ(keys.size(), 2u);  // the partial third block has no key
  // A longer prompt with the same start shares the keys of the shared blocks.
  std::vector<int32_t> longer = Range(0, 64);
  EXPECT_THAT(PrefixBlockKeys(longer, 16),
              ::testing::ElementsAre(keys[0], keys[1], testing::_, testing::_));
  // A change in block 0 changes every key after it: keys stand for whole prefixes.
  longer[3] = 1000;
  const std::vector<uint64_t> changed = PrefixBlockKeys(longer, 16);
  EXPECT_NE(changed[0], keys[0]);
  EXPECT_NE(changed[1], keys[1]);
  // The same block after another prefix is another key.
  EXPECT_NE(PrefixBlockKeys(Range(16, 16), 16)[0], keys[1]);
  EXPECT_TRUE(PrefixBlockKeys(prompt, 0).empty());
}

TEST(PrefixModelTest, OverlapCountsLeadingBlocksOnly) {
  PrefixModel model(100);
  const std::vector<uint64_t> keys = PrefixBlockKeys(Range(0, 64), 16);
  EXPECT_EQ(model.Overlap(keys), 0);
  model.Add(absl::MakeConstSpan(keys).first(2));
  EXPECT_EQ(model.Overlap(keys), 2);
  // A held block after a missing one does not count.
  PrefixModel gap(100);
  gap.Add({keys[1], keys[2]});
  EXPECT_EQ(gap.Overlap(keys), 0);
}

TEST(PrefixModelTest, EvictsLeastRecentlySentBeyondCapacity) {
  PrefixModel model(3);
  const std::vector<uint64_t> a = PrefixBlockKeys(Range(0, 32), 16);    // 2 blocks
  const std::vector<uint64_t> b = PrefixBlockKeys(Range(500, 32), 16);  // 2 blocks
  model.Add(a);
  model.Add(b);  // 4 > 3: a's first block goes
  EXPECT_EQ(model.size(), 3u);
  EXPECT_EQ(model.Overlap(a), 0);
  EXPECT_EQ(model.Overlap(b), 2);
  model.Add({b[0]});  // b's first block is now the newest
  model.Add(PrefixBlockKeys(Range(900, 32), 16));
  EXPECT_EQ(model.Overlap(b), 1);
  model.SetCapacity(1);
  EXPECT_EQ(model.size(), 1u);
  // Moved models keep working.
  PrefixModel moved = std::move(model);
  moved.SetCapacity(10);
  moved.Add(a);
  EXPECT_EQ(moved.Overlap(a), 2);
  EXPECT_EQ(moved.size(), 3u);
}

TEST(RankPrefillTest, CostWeighsCachedTokensAgainstQueuedTokens) {
  // 1000-token prompt. Instance 0 holds 800 of it and has 500 queued: cost 200 + 500 = 700.
  // Instance 1 holds none and has nothing queued: cost 1000.
  std::vector<PrefillCandidate> c(2);
  c[0].cached_tokens = 800;
  c[0].queued_tokens = 500;
  PrefillRanking r = RankPrefill(c, 1000, PrefillRouting::kKvAware, 1.0);
  EXPECT_THAT(r.order, ElementsAre(0, 1));
  EXPECT_EQ(r.reason, RoutingReason::kPrefix);
  // With 900 queued, instance 0 costs 1100: the empty one wins, against the prefix.
  c[0].queued_tokens = 900;
  r = RankPrefill(c, 1000, PrefillRouting::kKvAware, 1.0);
  EXPECT_THAT(r.order, ElementsAre(1, 0));
  EXPECT_EQ(r.reason, RoutingReason::kLoadOverPrefix);
  // Weight 0: the prefix alone decides.
  r = RankPrefill(c, 1000, PrefillRouting::kKvAware, 0.0);
  EXPECT_THAT(r.order, ElementsAre(0, 1));
  // Load routing ignores the prefix.
  c[0].queued_tokens = 10;
  r = RankPrefill(c, 1000, PrefillRouting::kLoad, 1.0);
  EXPECT_THAT(r.order, ElementsAre(1, 0));
  EXPECT_EQ(r.reason, RoutingReason::kLoadOverPrefix);
}

TEST(RankPrefillTest, HealthAndRoomComeBeforeCost) {
  std::vector<PrefillCandidate> c(3);
  c[0].cached_tokens = 1000;
  c[0].healthy = false;
  c[1].cached_tokens = 1000;
  c[1].room = false;
  c[2].queued_tokens = 5000;
  const PrefillRanking r = RankPrefill(c, 1000, PrefillRouting::kKvAware, 1.0);
  EXPECT_THAT(r.order, ElementsAre(2, 1, 0));
  EXPECT_EQ(r.reason, RoutingReason::kLoad);  // nobody with room holds any of it
}

TEST(RankPrefillTest, TiesKeepTheRotationAndLoadBreaksThem) {
  std::vector<PrefillCandidate> c(3);
  EXPECT_THAT(RankPrefill(c, 100, PrefillRouting::kKvAware, 1.0).order, ElementsAre(0, 1, 2));
  c[0].queue_depth = 2;  // another gateway's prompts: equal cost, more depth
  EXPECT_THAT(RankPrefill(c, 100, PrefillRouting::kKvAware, 1.0).order, ElementsAre(1, 2, 0));
  EXPECT_THAT(RankPrefill(c, 100, PrefillRouting::kLoad, 1.0).order, ElementsAre(1, 2, 0));
  EXPECT_TRUE(RankPrefill({}, 100, PrefillRouting::kLoad, 1.0).order.empty());
}

TEST(ParsePrefillRoutingTest, NamesTheFlag) {
  EXPECT_EQ(*ParsePrefillRouting("kv_aware"), PrefillRouting::kKvAware);
  EXPECT_EQ(*ParsePrefillRouting("load"), PrefillRouting::kLoad);
  const absl::Status bad = ParsePrefillRouting("random").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), ::testing::HasSubstr("--prefill_routing"));
}

}  // namespace
}  // namespace tandem::gateway
