// The stated routing of dummy models: Zipf popularity over a per-layer ranking, drawn without
// replacement, reproducible and independent of batching.
#include "common/engine/synthetic_router.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace tandem::engine {
namespace {

int Argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

TEST(ZipfRouterTest, SpecsParseAndBadOnesAreInvalidArgument) {
  auto uniform = ZipfRouter::FromSpec("uniform", 2, 8, 1);
  ASSERT_TRUE(uniform.ok());
  EXPECT_EQ((*uniform)->exponent(), 0.0);
  auto zipf = ZipfRouter::FromSpec("zipf:1.5", 2, 8, 1);
  ASSERT_TRUE(zipf.ok());
  EXPECT_EQ((*zipf)->exponent(), 1.5);
  for (const char* bad : {"", "zipf", "zipf:", "zipf:x", "zipf:-1", "zipf:11", "trace"}) {
    auto r = ZipfRouter::FromSpec(bad, 2, 8, 1);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ZipfRouter::Create(0, 8, 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ZipfRouterTest, PopularityIsZipfOverAShuffledRanking) {
  auto r = ZipfRouter::Create(3, 8, 1.0, 42);
  ASSERT_TRUE(r.ok());
  double harmonic = 0;
  for (int k = 1; k <= 8; ++k) harmonic += 1.0 / k;
  for (int l = 0; l < 3; ++l) {
    std::vector<double> p;
    for (int e = 0; e < 8; ++e) p.push_back((*r)->Probability(l, e));
    std::sort(p.rbegin(), p.rend());
    for (int k = 0; k < 8; ++k) EXPECT_NEAR(p[k], 1.0 / (k + 1) / harmonic, 1e-6);
  }
}

// The first of the Gumbel-top-k draws picks expert e with probability p_e.
TEST(ZipfRouterTest, FirstChoicesFollowThePopularity) {
  for (double s : {0.0, 1.2}) {
    auto r = ZipfRouter::Create(2, 8, s, 9);
    ASSERT_TRUE(r.ok());
    std::vector<int> counts(8);
    std::vector<float> logits(8);
    constexpr int kDraws = 40000;
    for (int i = 0; i < kDraws; ++i) {
      (*r)->Logits(1, i % 1000, i / 1000, absl::MakeSpan(logits));
      ++counts[Argmax(logits)];
    }
    for (int e = 0; e < 8; ++e) {
      EXPECT_NEAR(counts[e] / double{kDraws}, (*r)->Probability(1, e), 0.01)
          << "s=" << s << " expert " << e;
    }
  }
}

TEST(ZipfRouterTest, DeterministicInTokenAndPositionOnly) {
  auto a = ZipfRouter::Create(2, 8, 1.0, 5);
  auto b = ZipfRouter::Create(2, 8, 1.0, 5);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> x(8), y(8), z(8);
  (*a)->Logits(1, 77, 12, absl::MakeSpan(x));
  (*b)->Logits(1, 77, 12, absl::MakeSpan(y));
  EXPECT_EQ(x, y);
  (*a)->Logits(1, 77, 13, absl::MakeSpan(z));
  EXPECT_NE(x, z);
  (*a)->Logits(0, 77, 12, absl::MakeSpan(z));
  EXPECT_NE(x, z);
}

}  // namespace
}  // namespace tandem::engine
