// A distilled pruned decoder (docs/distillation.md) through real processes, on the shipped
// tiny model's REAP keep-8 plan and its overlay: tandem-prefill runs the full model and hands
// its KV cache to tandem-decode --plan --overlay, whose KV geometry still matches (attention is
// frozen, so the handshake passes and the cluster serves); its greedy tokens equal colocated
// tandem-serve --plan --overlay (prompts on the base weights, generated tokens on the
// overlay's) for every golden prompt, and differ from the plan without the overlay somewhere.
// Both say which overlay they run on /metrics; a decoder given the overlay with another plan
// refuses to start and says why.
#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tandem/client.h"
#include "tests/testing/cluster_client.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

constexpr int kTokens = 24;

using testing::MetricValue;

class DistilledClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string root = testing::SourceDir();
    manifest_ = testing::LoadGoldenManifest();
    plan_ = "--plan=" + root + "/models/tiny-moe/pruning/reap-keep8.json";
    overlay_ = "--overlay=" + root + "/models/tiny-moe/distill/reap-keep8-handoff.safetensors";
  }

  std::vector<std::vector<int32_t>> GenerateAll(sdk::Client* client) {
    return testing::GreedyContinuations(client, manifest_, kTokens);
  }

  // Greedy continuations from colocated tandem-serve with `flags`, and its overlay metric.
  std::vector<std::vector<int32_t>> Colocated(const std::vector<std::string>& flags,
                                              const std::string& overlay_label,
                                              double* overlay_metric) {
    testing::ServiceSet set;
    auto serve = set.Start("tandem-serve", flags);
    EXPECT_TRUE(serve.ok()) << serve.status();
    if (!serve.ok()) return {};
    auto client = testing::ConnectClient(*serve);
    if (client == nullptr) return {};
    auto out = GenerateAll(client.get());
    *overlay_metric = MetricValue(serve->http_port, "tandem_decoder_overlay_info", overlay_label);
    return out;
  }

  nlohmann::json manifest_;
  std::string plan_, overlay_;
};

TEST_F(DistilledClusterTest, DistilledDecoderEqualsColocatedServingWithTheOverlay) {
  std::vector<std::vector<int32_t>> disaggregated;
  double decode_metric = -1, no_overlay_metric = -1;
  {
    testing::ServiceSet set;
    auto cluster = set.StartCluster({}, {plan_, overlay_});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    EXPECT_NE(set.Log("tandem-decode").find("decoding with overlay reap-keep8-handoff"),
              std::string::npos)
        << set.Log("tandem-decode");
    auto client = testing::ConnectClient(cluster->gateway);
    ASSERT_NE(client, nullptr);
    disaggregated = GenerateAll(client.get());
    decode_metric = MetricValue(cluster->decode.http_port, "tandem_decoder_overlay_info",
                                "overlay=\"reap-keep8-handoff\"");
    // The full prefill runs no overlay.
    no_overlay_metric = MetricValue(cluster->prefill.http_port, "tandem_decoder_overlay_info");
  }
  double serve_metric = -1, plain_metric = -1;
  const auto colocated =
      Colocated({plan_, overlay_}, "overlay=\"reap-keep8-handoff\"", &serve_metric);
  const auto plan_only = Colocated({plan_}, "overlay=\"none\"", &plain_metric);
  ASSERT_EQ(colocated.size(), disaggregated.size());
  ASSERT_EQ(plan_only.size(), disaggregated.size());
  int differ = 0;
  for (size_t k = 0; k < colocated.size(); ++k) {
    ASSERT_EQ(colocated[k].size(), static_cast<size_t>(kTokens)) << "prompt " << k;
    EXPECT_EQ(disaggregated[k], colocated[k]) << "prompt " << k;
    // The first token comes from the full prefill either way.
    EXPECT_EQ(colocated[k][0], plan_only[k][0]) << "prompt " << k;
    differ += colocated[k] != plan_only[k];
  }
  EXPECT_GT(differ, 0) << "the overlay changed no continuation";
  EXPECT_EQ(decode_metric, 1);
  EXPECT_EQ(serve_metric, 1);
  EXPECT_EQ(plain_metric, 1);
  EXPECT_EQ(no_overlay_metric, -1);
}

TEST_F(DistilledClusterTest, DecoderRefusesAnOverlayMadeForAnotherPlan) {
  testing::ServiceSet set;
  const std::string other =
      "--plan=" + testing::SourceDir() + "/models/tiny-moe/pruning/reap-keep4.json";
  auto decode = set.Start("tandem-decode", {other, overlay_});
  ASSERT_FALSE(decode.ok());
  EXPECT_NE(decode.status().message().find("--overlay: overlay "), std::string::npos)
      << decode.status();
  EXPECT_NE(decode.status().message().find("made for pruning plan \"reap-keep8.json\""),
            std::string::npos)
      << decode.status();
  auto without = set.Start("tandem-serve", {overlay_});
  ASSERT_FALSE(without.ok());
  EXPECT_NE(without.status().message().find("not the full model (no --plan)"), std::string::npos)
      << without.status();
}

}  // namespace
}  // namespace tandem
