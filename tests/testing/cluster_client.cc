#include "tests/testing/cluster_client.h"

#include <gtest/gtest.h>

#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::testing {

std::unique_ptr<sdk::Client> ConnectClient(const Ports& ports) {
  auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", ports.grpc_port));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

nlohmann::json LoadGoldenManifest(const std::string& model) {
  std::ifstream in(absl::StrCat(SourceDir(), "/tests/golden/", model, "/manifest.json"));
  nlohmann::json manifest = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(manifest.is_discarded()) << "no golden manifest for " << model;
  return manifest;
}

std::vector<std::vector<int32_t>> GreedyContinuations(sdk::Client* client,
                                                      const nlohmann::json& manifest,
                                                      int max_tokens, bool ignore_eos) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& prompt : manifest["prompts"]) {
    const auto ids = prompt["token_ids"].get<std::vector<int32_t>>();
    v1::GenerateRequest request;
    request.mutable_prompt_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
    request.mutable_sampling()->set_max_tokens(max_tokens);
    request.mutable_sampling()->set_ignore_eos(ignore_eos);
    auto response = client->Generate(request);
    EXPECT_TRUE(response.ok()) << response.status();
    out.emplace_back();
    if (response.ok()) {
      out.back().assign(response->token_ids().begin(), response->token_ids().end());
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> ColocatedContinuations(
    const std::string& model_dir, const std::vector<std::string>& serve_flags,
    const nlohmann::json& manifest, int max_tokens) {
  ServiceSet set(model_dir);
  auto serve = set.Start("tandem-serve", serve_flags);
  if (!serve.ok()) {
    ADD_FAILURE() << serve.status();
    return {};
  }
  auto client = ConnectClient(*serve);
  if (client == nullptr) return {};
  return GreedyContinuations(client.get(), manifest, max_tokens);
}

std::vector<int32_t> ReferenceTokens(const nlohmann::json& manifest, size_t k, int max_tokens) {
  auto ids = manifest["prompts"][k]["greedy_token_ids"].get<std::vector<int32_t>>();
  if (ids.size() > static_cast<size_t>(max_tokens)) ids.resize(max_tokens);
  return ids;
}

PlanServing ServePlanBothWays(const std::string& model_dir, const nlohmann::json& manifest,
                              int max_tokens, const std::string& plan_flag,
                              std::vector<std::string> decode_flags) {
  PlanServing runs;
  decode_flags.push_back(plan_flag);
  {
    ServiceSet set(model_dir);
    auto cluster = set.StartCluster({}, decode_flags);
    if (!cluster.ok()) {
      ADD_FAILURE() << cluster.status();
      return runs;
    }
    auto client = ConnectClient(cluster->gateway);
    if (client == nullptr) return runs;
    runs.disaggregated = GreedyContinuations(client.get(), manifest, max_tokens);
    const int port = cluster->decode.http_port;
    runs.decode_experts = MetricValue(port, "tandem_experts_resident");
    runs.decode_bytes = MetricValue(port, "tandem_expert_weight_bytes");
    runs.cache_misses = MetricValue(port, "tandem_expert_cache_requests_total", "result=\"miss\"");
    runs.warm_pairs = MetricValue(port, "tandem_expert_pairs_total", "tier=\"warm\"");
    runs.cold_pairs = MetricValue(port, "tandem_expert_pairs_total", "tier=\"cold\"");
    runs.neurons = MetricValue(port, "tandem_expert_neurons_total");
  }
  ServiceSet set(model_dir);
  auto serve = set.Start("tandem-serve", {plan_flag});
  if (!serve.ok()) {
    ADD_FAILURE() << serve.status();
    return runs;
  }
  auto client = ConnectClient(*serve);
  if (client == nullptr) return runs;
  runs.colocated = GreedyContinuations(client.get(), manifest, max_tokens);
  runs.serve_bytes = MetricValue(serve->http_port, "tandem_expert_weight_bytes");
  return runs;
}

PlanServing ServeStreamedBothWays(const std::string& model_dir, const std::string& plan,
                                  const std::string& pack, int64_t cache_bytes,
                                  const nlohmann::json& manifest, int max_tokens,
                                  std::vector<std::string> decode_flags) {
  decode_flags.push_back("--expert_pack=" + pack);
  decode_flags.push_back(absl::StrCat("--expert_cache_bytes=", cache_bytes));
  PlanServing runs =
      ServePlanBothWays(model_dir, manifest, max_tokens, "--plan=" + plan, std::move(decode_flags));
  ExpectSameContinuations(runs.disaggregated, runs.colocated, max_tokens);
  return runs;
}

void ExpectPrunedDecoderEqualsColocated(const PlanServing& runs, const nlohmann::json& manifest,
                                        int tokens) {
  ASSERT_EQ(runs.colocated.size(), manifest["prompts"].size());
  ASSERT_EQ(runs.disaggregated.size(), runs.colocated.size());
  int differ_from_full = 0;
  for (size_t k = 0; k < runs.colocated.size(); ++k) {
    const std::vector<int32_t> reference = ReferenceTokens(manifest, k, tokens);
    ASSERT_EQ(runs.colocated[k].size(), static_cast<size_t>(tokens)) << "prompt " << k;
    EXPECT_EQ(runs.disaggregated[k], runs.colocated[k]) << "prompt " << k;
    EXPECT_EQ(runs.colocated[k][0], reference[0]) << "prompt " << k;  // from the full prefill
    differ_from_full += runs.colocated[k] != reference;
  }
  EXPECT_GT(differ_from_full, 0) << "the plan changed no continuation";
}

void ExpectSameContinuations(const std::vector<std::vector<int32_t>>& got,
                             const std::vector<std::vector<int32_t>>& want, int tokens) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(want[k].size(), static_cast<size_t>(tokens)) << "prompt " << k;
    EXPECT_EQ(got[k], want[k]) << "prompt " << k;
  }
}

}  // namespace tandem::testing
