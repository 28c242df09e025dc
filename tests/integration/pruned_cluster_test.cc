// Phase-decoupled pruning through real processes: tandem-prefill runs the full model,
// tandem-decode --plan holds only the plan's experts and decodes from the KV prefill wrote,
// behind tandem-gateway. Its greedy tokens equal those of colocated tandem-serve --plan
// (prompts on the full pool, generated tokens on the plan's experts) for every golden prompt;
// they differ from the full model's somewhere (the plan takes effect); the decoder holds
// exactly the plan's share of the expert weights, by its metrics.
#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/http/http_server.h"
#include "nlohmann/json.hpp"
#include "tandem/client.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

constexpr int kTokens = 24;

// The value of the unlabelled-but-role sample `name` on a /metrics page; -1 when absent.
double Metric(int http_port, const std::string& name) {
  auto page = http::Fetch("127.0.0.1", http_port, "GET", "/metrics", "", 5000);
  if (!page.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(page->body, '\n')) {
    if (!absl::StartsWith(line, name + "{")) continue;
    double value;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) return value;
  }
  return -1;
}

class PrunedClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ifstream in(testing::SourceDir() + "/tests/golden/tiny-moe/manifest.json");
    manifest_ = nlohmann::json::parse(in);
    plan_ = "--plan=" + testing::SourceDir() + "/models/tiny-moe/pruning/reap-keep8.json";
  }

  std::unique_ptr<sdk::Client> Connect(const testing::Ports& ports) {
    auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", ports.grpc_port));
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Greedy continuations of every golden prompt through `client`.
  std::vector<std::vector<int32_t>> GenerateAll(sdk::Client* client) {
    std::vector<std::vector<int32_t>> out;
    for (const auto& prompt : manifest_["prompts"]) {
      const auto ids = prompt["token_ids"].get<std::vector<int32_t>>();
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

  nlohmann::json manifest_;
  std::string plan_;
};

TEST_F(PrunedClusterTest, PrunedDecoderFedByFullPrefillEqualsColocatedPhaseAwareServing) {
  std::vector<std::vector<int32_t>> disaggregated, colocated;
  double decode_bytes = -1, serve_bytes = -1, decode_experts = -1, serve_experts = -1;
  {
    testing::ServiceSet cluster;
    auto prefill = cluster.Start("tandem-prefill", {});
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    auto decode = cluster.Start("tandem-decode", {plan_, "--kv_blocks=160"});
    ASSERT_TRUE(decode.ok()) << decode.status();
    auto gateway =
        cluster.Start("tandem-gateway", {absl::StrCat("--prefill=127.0.0.1:", prefill->grpc_port),
                                         absl::StrCat("--decode=127.0.0.1:", decode->grpc_port)});
    ASSERT_TRUE(gateway.ok()) << gateway.status();
    auto client = Connect(*gateway);
    ASSERT_NE(client, nullptr);
    disaggregated = GenerateAll(client.get());
    decode_bytes = Metric(decode->http_port, "tandem_expert_weight_bytes");
    decode_experts = Metric(decode->http_port, "tandem_experts_resident");
  }
  {
    testing::ServiceSet colocated_set;
    auto serve = colocated_set.Start("tandem-serve", {plan_});
    ASSERT_TRUE(serve.ok()) << serve.status();
    auto client = Connect(*serve);
    ASSERT_NE(client, nullptr);
    colocated = GenerateAll(client.get());
    serve_bytes = Metric(serve->http_port, "tandem_expert_weight_bytes");
    serve_experts = Metric(serve->http_port, "tandem_experts_resident");
  }
  int differ_from_full = 0;
  for (size_t k = 0; k < colocated.size(); ++k) {
    ASSERT_EQ(colocated[k].size(), static_cast<size_t>(kTokens)) << "prompt " << k;
    EXPECT_EQ(disaggregated[k], colocated[k]) << "prompt " << k;
    auto full = manifest_["prompts"][k]["greedy_token_ids"].get<std::vector<int32_t>>();
    full.resize(kTokens);
    // The first token comes from the full prefill in both modes.
    EXPECT_EQ(colocated[k][0], full[0]) << "prompt " << k;
    differ_from_full += colocated[k] != full;
  }
  EXPECT_GT(differ_from_full, 0) << "the plan changed no continuation";
  // 8 of 16 experts in each of 6 layers; serve holds them all (prefill needs them).
  EXPECT_EQ(decode_experts, 48);
  EXPECT_EQ(serve_experts, 96);
  EXPECT_GT(decode_bytes, 0);
  EXPECT_EQ(decode_bytes * 2, serve_bytes);
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
}

}  // namespace
}  // namespace tandem
