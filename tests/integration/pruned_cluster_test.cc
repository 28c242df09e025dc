// Phase-decoupled pruning through real processes: tandem-prefill runs the full model,
// tandem-decode --plan holds only the plan's experts and decodes from the KV prefill wrote,
// behind tandem-gateway. Its greedy tokens equal those of colocated tandem-serve --plan
// (prompts on the full pool, generated tokens on the plan's experts) for every golden prompt;
// they differ from the full model's somewhere (the plan takes effect); the decoder holds
// exactly the plan's share of the expert weights, by its metrics. The same with a mixed-width
// plan on a reordered checkpoint, the decoder streaming its experts from an expert pack read
// with O_DIRECT into a cache of a quarter of them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/http/http_server.h"
#include "nlohmann/json.hpp"
#include "tandem/client.h"
#include "tests/testing/cluster_client.h"
#include "tests/testing/mixed_width_model.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

constexpr int kTokens = 24;

using testing::MetricValue;

class PrunedClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ifstream in(testing::SourceDir() + "/tests/golden/tiny-moe/manifest.json");
    manifest_ = nlohmann::json::parse(in);
    plan_ = "--plan=" + testing::SourceDir() + "/models/tiny-moe/pruning/reap-keep8.json";
  }

  // A full prefill, a decode with `decode_flags` and a gateway over them in `set`.
  static absl::StatusOr<testing::ServiceSet::Cluster> StartCluster(
      testing::ServiceSet& set, std::vector<std::string> decode_flags) {
    decode_flags.push_back("--kv_blocks=160");
    return set.StartCluster({}, decode_flags);
  }

  struct Generation {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;         // each generated token's
    std::vector<float> prompt_logprobs;  // prompt tokens 1..n-1
  };
  // Greedy continuations of every golden prompt through `client`, with log-probabilities.
  std::vector<Generation> GenerateAll(sdk::Client* client) {
    std::vector<Generation> out;
    for (const auto& prompt : manifest_["prompts"]) {
      const auto ids = prompt["token_ids"].get<std::vector<int32_t>>();
      v1::GenerateRequest request;
      request.mutable_prompt_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
      request.mutable_sampling()->set_max_tokens(kTokens);
      request.mutable_sampling()->set_logprobs(2);
      request.mutable_sampling()->set_prompt_logprobs(0);
      auto response = client->Generate(request);
      EXPECT_TRUE(response.ok()) << response.status();
      out.emplace_back();
      if (!response.ok()) continue;
      out.back().tokens.assign(response->token_ids().begin(), response->token_ids().end());
      for (const auto& lp : response->logprobs()) out.back().logprobs.push_back(lp.logprob());
      for (const auto& lp : response->prompt_logprobs()) {
        out.back().prompt_logprobs.push_back(lp.logprob());
      }
      EXPECT_EQ(out.back().logprobs.size(), out.back().tokens.size());
      EXPECT_EQ(out.back().prompt_logprobs.size(), ids.size() - 1);
    }
    return out;
  }

  // The same sequences' log-probabilities in two runs, within the engines' batch invariance.
  static void ExpectSameLogprobs(const std::vector<Generation>& a,
                                 const std::vector<Generation>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      ASSERT_EQ(a[k].logprobs.size(), b[k].logprobs.size()) << "prompt " << k;
      for (size_t t = 0; t < a[k].logprobs.size(); ++t) {
        EXPECT_NEAR(a[k].logprobs[t], b[k].logprobs[t], 1e-3) << "prompt " << k << " token " << t;
      }
      ASSERT_EQ(a[k].prompt_logprobs.size(), b[k].prompt_logprobs.size());
      for (size_t t = 0; t < a[k].prompt_logprobs.size(); ++t) {
        EXPECT_NEAR(a[k].prompt_logprobs[t], b[k].prompt_logprobs[t], 1e-3);
      }
    }
  }

  nlohmann::json manifest_;
  std::string plan_;
};

TEST_F(PrunedClusterTest, PrunedDecoderFedByFullPrefillEqualsColocatedPhaseAwareServing) {
  std::vector<Generation> disaggregated, colocated;
  double decode_bytes = -1, serve_bytes = -1, decode_experts = -1, serve_experts = -1;
  {
    testing::ServiceSet set;
    auto cluster = StartCluster(set, {plan_});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    const testing::Ports* decode = &cluster->decode;
    auto client = testing::ConnectClient(cluster->gateway);
    ASSERT_NE(client, nullptr);
    disaggregated = GenerateAll(client.get());
    // Scoring a prompt and its pruned continuation runs on the full prefill alone: the first
    // continuation token's log-probability is the one generation reported (prefill sampled
    // it); the pruned decoder's later ones are its own, and some differ from the full model's.
    const auto ids = manifest_["prompts"][0]["token_ids"].get<std::vector<int32_t>>();
    v1::GenerateRequest score;
    score.mutable_prompt_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
    for (int32_t t : disaggregated[0].tokens) score.mutable_prompt_token_ids()->add_ids(t);
    score.mutable_sampling()->set_max_tokens(0);
    score.mutable_sampling()->set_prompt_logprobs(0);
    auto scored = client->Generate(score);
    ASSERT_TRUE(scored.ok()) << scored.status();
    EXPECT_EQ(scored->token_ids_size(), 0);
    ASSERT_EQ(scored->prompt_logprobs_size(), static_cast<int>(ids.size() + kTokens - 1));
    const int first = static_cast<int>(ids.size()) - 1;
    EXPECT_NEAR(scored->prompt_logprobs(first).logprob(), disaggregated[0].logprobs[0], 1e-3);
    int pruned_differs = 0;
    for (int t = 1; t < kTokens; ++t) {
      pruned_differs += std::abs(scored->prompt_logprobs(first + t).logprob() -
                                 disaggregated[0].logprobs[t]) > 1e-2;
    }
    EXPECT_GT(pruned_differs, 0) << "the pruned decoder's log-probabilities are the full model's";
    decode_bytes = MetricValue(decode->http_port, "tandem_expert_weight_bytes");
    decode_experts = MetricValue(decode->http_port, "tandem_experts_resident");
  }
  {
    testing::ServiceSet colocated_set;
    auto serve = colocated_set.Start("tandem-serve", {plan_});
    ASSERT_TRUE(serve.ok()) << serve.status();
    auto client = testing::ConnectClient(*serve);
    ASSERT_NE(client, nullptr);
    colocated = GenerateAll(client.get());
    serve_bytes = MetricValue(serve->http_port, "tandem_expert_weight_bytes");
    serve_experts = MetricValue(serve->http_port, "tandem_experts_resident");
  }
  int differ_from_full = 0;
  for (size_t k = 0; k < colocated.size(); ++k) {
    ASSERT_EQ(colocated[k].tokens.size(), static_cast<size_t>(kTokens)) << "prompt " << k;
    EXPECT_EQ(disaggregated[k].tokens, colocated[k].tokens) << "prompt " << k;
    auto full = manifest_["prompts"][k]["greedy_token_ids"].get<std::vector<int32_t>>();
    full.resize(kTokens);
    // The first token comes from the full prefill in both modes.
    EXPECT_EQ(colocated[k].tokens[0], full[0]) << "prompt " << k;
    differ_from_full += colocated[k].tokens != full;
  }
  ExpectSameLogprobs(disaggregated, colocated);
  EXPECT_GT(differ_from_full, 0) << "the plan changed no continuation";
  // 8 of 16 experts in each of 6 layers; serve holds them all (prefill needs them).
  EXPECT_EQ(decode_experts, 48);
  EXPECT_EQ(serve_experts, 96);
  EXPECT_GT(decode_bytes, 0);
  EXPECT_EQ(decode_bytes * 2, serve_bytes);
}

TEST_F(PrunedClusterTest, StreamedMixedWidthDecoderEqualsColocatedResidentMixedWidth) {
  testing::TempDir work;
  auto prepared = testing::MakeMixedWidthModel(work.path());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  const std::string& reordered = prepared->model_dir;
  const std::string& pack = prepared->pack;
  const std::string plan = "--plan=" + prepared->plan;
  // 6 layers x 16 experts x 3 x 384 x 192 x 2 bytes, a quarter of it.
  const std::string cache = absl::StrCat("--expert_cache_bytes=", 6 * 16 * 3 * 384 * 192 * 2 / 4);

  std::vector<Generation> disaggregated, colocated;
  double misses = -1, loaded = -1, warm = -1, resident = -1;
  {
    testing::ServiceSet set(reordered);
    auto cluster = StartCluster(set, {plan, "--expert_pack=" + pack, cache});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    const testing::Ports* decode = &cluster->decode;
    auto client = testing::ConnectClient(cluster->gateway);
    ASSERT_NE(client, nullptr);
    disaggregated = GenerateAll(client.get());
    misses =
        MetricValue(decode->http_port, "tandem_expert_cache_requests_total", "result=\"miss\"");
    loaded = MetricValue(decode->http_port, "tandem_expert_load_bytes_total");
    warm = MetricValue(decode->http_port, "tandem_expert_pairs_total", "tier=\"warm\"");
    resident = MetricValue(decode->http_port, "tandem_experts_resident");
  }
  {
    testing::ServiceSet colocated_set(reordered);
    auto serve = colocated_set.Start("tandem-serve", {plan});
    ASSERT_TRUE(serve.ok()) << serve.status();
    auto client = testing::ConnectClient(*serve);
    ASSERT_NE(client, nullptr);
    colocated = GenerateAll(client.get());
  }
  ASSERT_EQ(disaggregated.size(), colocated.size());
  for (size_t k = 0; k < colocated.size(); ++k) {
    EXPECT_EQ(disaggregated[k].tokens, colocated[k].tokens) << "prompt " << k;
  }
  ExpectSameLogprobs(disaggregated, colocated);
  EXPECT_GT(misses, 0);
  EXPECT_GT(loaded, 0);
  EXPECT_GT(warm, 0);
  EXPECT_EQ(resident, 0);  // every expert streams; none loaded with the model
}

TEST_F(PrunedClusterTest, APlanThatDoesNotFitTheModelStopsTheDecoderWithAClearMessage) {
  testing::ServiceSet set;
  testing::TempDir dir;
  const std::string bad = dir.path() + "/plan.json";
  std::ofstream(bad)
      << R"({"numLayers": 6, "numExperts": 8, "criterion": "PRUNING_CRITERION_REAP"})";
  auto decode = set.Start("tandem-decode", {"--plan=" + bad});
  EXPECT_EQ(decode.status().code(), absl::StatusCode::kFailedPrecondition) << decode.status();
  const std::string log = set.Log("tandem-decode");
  EXPECT_NE(log.find("--plan: plan " + bad), std::string::npos) << log;
  EXPECT_NE(log.find("the model has 6 of 16"), std::string::npos) << log;

  // A plan with mixed-width tiers on a checkpoint whose neurons were not reordered.
  const std::string source = testing::SourceDir() + "/models/tiny-moe";
  const std::string tiered = dir.path() + "/tiered.json";
  ASSERT_EQ(std::system((testing::BinDir() + "/tandem tier --plan " + source +
                         "/pruning/reap-keep8.json --stats " + source +
                         "/pruning/calibration-valid.json --model " + source + " --out " + tiered +
                         " > " + dir.path() + "/cli.log 2>&1")
                            .c_str()),
            0);
  testing::ServiceSet again;
  auto unordered = again.Start("tandem-decode", {"--plan=" + tiered});
  EXPECT_EQ(unordered.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.Log("tandem-decode").find("importance order"), std::string::npos)
      << again.Log("tandem-decode");
}

}  // namespace
}  // namespace tandem
