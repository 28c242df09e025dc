#include "tests/testing/cluster_client.h"

#include <gtest/gtest.h>

#include <fstream>

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
                                                      int max_tokens) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& prompt : manifest["prompts"]) {
    const auto ids = prompt["token_ids"].get<std::vector<int32_t>>();
    v1::GenerateRequest request;
    request.mutable_prompt_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
    request.mutable_sampling()->set_max_tokens(max_tokens);
    auto response = client->Generate(request);
    EXPECT_TRUE(response.ok()) << response.status();
    out.emplace_back();
    if (response.ok()) {
      out.back().assign(response->token_ids().begin(), response->token_ids().end());
    }
  }
  return out;
}

}  // namespace tandem::testing
