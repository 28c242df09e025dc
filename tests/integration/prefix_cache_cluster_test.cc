// The prefix cache and KV-aware routing through real processes (docs/kv-cache.md "Prefix
// cache"): prompts served from cached blocks give the greedy tokens computed from scratch, in
// a disaggregated cluster (cached blocks shipped over UCX like computed ones) and in colocated
// tandem-serve; prefill reports its hits on /metrics; and with two prefill instances the
// gateway's KV-aware routing sends a repeated prompt where its blocks are, and says so.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tandem/v1/gateway.pb.h"
#include "tests/testing/cluster_client.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

constexpr int kTokens = 24;

using testing::MetricValue;

class PrefixCacheClusterTest : public ::testing::Test {
 protected:
  // Golden prompt 7 (201 tokens: 12 full blocks), the same again, and prompt 7 followed by
  // another prompt's tokens (a shared prefix); then every golden prompt.
  std::vector<std::vector<int32_t>> Prompts() const {
    std::vector<std::vector<int32_t>> prompts;
    const auto seven = manifest_["prompts"][7]["token_ids"].get<std::vector<int32_t>>();
    auto extended = seven;
    for (int32_t t : manifest_["prompts"][3]["token_ids"].get<std::vector<int32_t>>()) {
      extended.push_back(t);
    }
    prompts = {seven, seven, extended};
    for (const auto& p : manifest_["prompts"]) {
      prompts.push_back(p["token_ids"].get<std::vector<int32_t>>());
    }
    return prompts;
  }

  static std::vector<std::vector<int32_t>> Run(const testing::Ports& ports,
                                               const std::vector<std::vector<int32_t>>& prompts) {
    auto client = testing::ConnectClient(ports);
    std::vector<std::vector<int32_t>> out;
    if (client == nullptr) return out;
    for (const auto& ids : prompts) {
      v1::GenerateRequest request;
      request.mutable_prompt_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
      request.mutable_sampling()->set_max_tokens(kTokens);
      auto response = client->Generate(request);
      EXPECT_TRUE(response.ok()) << response.status();
      out.emplace_back();
      if (response.ok())
        out.back().assign(response->token_ids().begin(), response->token_ids().end());
    }
    return out;
  }

  const nlohmann::json manifest_ = testing::LoadGoldenManifest();
  const std::string model_ = testing::SourceDir() + "/models/tiny-moe";
};

TEST_F(PrefixCacheClusterTest, CachedPromptsGiveTheTokensComputedFromScratch) {
  const auto prompts = Prompts();
  std::vector<std::vector<int32_t>> scratch, disaggregated, colocated;
  {
    testing::ServiceSet set(model_);
    auto serve = set.Start("tandem-serve", {"--prefix_cache=false"});
    ASSERT_TRUE(serve.ok()) << serve.status();
    scratch = Run(*serve, prompts);
    EXPECT_EQ(MetricValue(serve->http_port, "tandem_prefix_cache_query_tokens_total"), 0);
  }
  {
    testing::ServiceSet set(model_);
    auto cluster = set.StartCluster({}, {"--kv_blocks=160"});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    disaggregated = Run(cluster->gateway, prompts);
    // The repeat and the extension take prompt 7's 12 blocks each; golden prompt 7 at the end
    // takes them again (the other golden prompts fill no block, or one that is not cached).
    EXPECT_EQ(MetricValue(cluster->prefill.http_port, "tandem_prefix_cache_hit_tokens_total"),
              3 * 192);
    EXPECT_GT(
        MetricValue(cluster->prefill.http_port, "tandem_prefix_cache_blocks", "state=\"cached\""),
        12);
  }
  {
    testing::ServiceSet set(model_);
    auto serve = set.Start("tandem-serve", {});  // the cache is on by default
    ASSERT_TRUE(serve.ok()) << serve.status();
    colocated = Run(*serve, prompts);
    EXPECT_GE(MetricValue(serve->http_port, "tandem_prefix_cache_hit_tokens_total"), 3 * 192);
  }
  ASSERT_EQ(scratch.size(), prompts.size());
  testing::ExpectSameContinuations(disaggregated, scratch, kTokens);
  testing::ExpectSameContinuations(colocated, scratch, kTokens);
}

// Two prefill instances, one decode, a gateway routing as `routing`; the same long prompt four
// times, one after another. Returns the prefix-cache hit tokens of both instances together.
double RepeatedPromptHits(const std::string& model, const std::vector<int32_t>& prompt,
                          const std::string& routing, double* prefix_decisions) {
  testing::ServiceSet set(model);
  auto a = set.Start("tandem-prefill", {});
  auto b = set.Start("tandem-prefill", {});
  auto decode = set.Start("tandem-decode", {"--kv_blocks=160"});
  if (!a.ok() || !b.ok() || !decode.ok()) {
    ADD_FAILURE() << "the cluster did not start";
    return -1;
  }
  auto gateway = set.Start(
      "tandem-gateway",
      {absl::StrCat("--prefill=127.0.0.1:", a->grpc_port, ",127.0.0.1:", b->grpc_port),
       absl::StrCat("--decode=127.0.0.1:", decode->grpc_port), "--prefill_routing=" + routing});
  if (!gateway.ok()) {
    ADD_FAILURE() << gateway.status();
    return -1;
  }
  // The gateway learns the instances' block size from its first health checks (500 ms apart).
  absl::SleepFor(absl::Milliseconds(1500));
  auto client = testing::ConnectClient(*gateway);
  if (client == nullptr) return -1;
  for (int i = 0; i < 4; ++i) {
    v1::GenerateRequest request;
    request.mutable_prompt_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
    request.mutable_sampling()->set_max_tokens(4);
    auto response = client->Generate(request);
    EXPECT_TRUE(response.ok()) << response.status();
  }
  *prefix_decisions = MetricValue(gateway->http_port, "tandem_gateway_routing_decisions_total",
                                  "reason=\"prefix\"");
  const double hits_a = MetricValue(a->http_port, "tandem_prefix_cache_hit_tokens_total");
  const double hits_b = MetricValue(b->http_port, "tandem_prefix_cache_hit_tokens_total");
  return hits_a + hits_b;
}

TEST_F(PrefixCacheClusterTest, KvAwareRoutingSendsARepeatedPromptWhereItsBlocksAre) {
  const auto prompt = manifest_["prompts"][7]["token_ids"].get<std::vector<int32_t>>();
  double kv_aware_decisions = 0, load_decisions = 0;
  // KV-aware: the first request computes it; the other three go to the same instance.
  EXPECT_EQ(RepeatedPromptHits(model_, prompt, "kv_aware", &kv_aware_decisions), 3 * 192);
  EXPECT_EQ(kv_aware_decisions, 3);
  // Load only: the prefix plays no part (where the prompts land depends on the rotation and
  // on when the health checks saw each queue, so the hits are not fixed).
  EXPECT_LE(RepeatedPromptHits(model_, prompt, "load", &load_decisions), 3 * 192);
  EXPECT_EQ(load_decisions, 0);
}

}  // namespace
}  // namespace tandem
