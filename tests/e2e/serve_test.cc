// Colocated mode end to end: tandem-serve (the gateway API on an engine in the same process)
// gives the reference greedy tokens for every golden prompt, one at a time and 16 at once, and
// the same text streamed and unary.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tandem/client.h"
#include "tests/testing/kernels.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

constexpr int kTokens = 24;

class ServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::ExactKernelsInChildren();  // compared with the PyTorch reference
    std::ifstream in(testing::SourceDir() + "/tests/golden/tiny-moe/manifest.json");
    manifest_ = nlohmann::json::parse(in);
    const std::string port_file = dir_.path() + "/serve.ports";
    auto proc = testing::Subprocess::Start({testing::BinDir() + "/tandem-serve",
                                            "--model=" + testing::SourceDir() + "/models/tiny-moe",
                                            "--port_file=" + port_file, "--drain_timeout_s=2"},
                                           dir_.path() + "/serve.log");
    ASSERT_TRUE(proc.ok()) << proc.status();
    process_.emplace(*std::move(proc));
    auto ports = testing::WaitForPortFile(port_file, absl::Seconds(30));
    ASSERT_TRUE(ports.ok()) << ports.status();
    auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", ports->grpc_port));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  v1::GenerateRequest ByIds(int k) const {
    const auto ids = manifest_["prompts"][k]["token_ids"].get<std::vector<int32_t>>();
    v1::GenerateRequest request;
    request.mutable_prompt_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
    request.mutable_sampling()->set_max_tokens(kTokens);
    return request;
  }
  std::vector<int32_t> Greedy(int k) const {
    auto ids = manifest_["prompts"][k]["greedy_token_ids"].get<std::vector<int32_t>>();
    if (ids.size() > kTokens) ids.resize(kTokens);
    return ids;
  }

  testing::TempDir dir_;
  nlohmann::json manifest_;
  std::optional<testing::Subprocess> process_;
  std::unique_ptr<sdk::Client> client_;
};

TEST_F(ServeTest, GreedyMatchesTheReference) {
  const int n = static_cast<int>(manifest_["prompts"].size());
  for (int k = 0; k < n; ++k) {
    auto response = client_->Generate(ByIds(k));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(std::vector<int32_t>(response->token_ids().begin(), response->token_ids().end()),
              Greedy(k))
        << "prompt " << k;
    EXPECT_EQ(response->usage().completion_tokens(), response->token_ids_size());
  }
  std::vector<absl::StatusOr<v1::GenerateResponse>> results(16, absl::UnknownError("unset"));
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] { results[i] = client_->Generate(ByIds(i % n)); });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_EQ(std::vector<int32_t>(results[i]->token_ids().begin(), results[i]->token_ids().end()),
              Greedy(i % n));
  }
}

TEST_F(ServeTest, StreamedTextEqualsUnaryText) {
  v1::GenerateRequest request;
  request.set_prompt("She opened the door and");
  request.mutable_sampling()->set_max_tokens(kTokens);
  auto unary = client_->Generate(request);
  ASSERT_TRUE(unary.ok()) << unary.status();
  std::string streamed;
  ASSERT_TRUE(
      client_->GenerateStream(request, [&](const auto& chunk) { streamed += chunk.text(); }).ok());
  EXPECT_EQ(streamed, unary->text());
  EXPECT_FALSE(streamed.empty());
}

// `tandem serve` over TLS: a self-signed certificate for 127.0.0.1 made here with openssl; a
// client trusting it generates, a plaintext client cannot connect.
TEST(ServeTlsTest, TlsClientsGenerateAndPlaintextOnesCannotConnect) {
  testing::TempDir dir;
  const std::string cert = dir.path() + "/cert.pem", key = dir.path() + "/key.pem";
  const std::string command =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " +
      key + " -out " + cert + " > " + dir.path() + "/openssl.log 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << "openssl failed (scripts/setup.sh installs it)";
  const std::string port_file = dir.path() + "/serve.ports";
  auto proc = testing::Subprocess::Start(
      {testing::BinDir() + "/tandem", "serve",
       "--model=" + testing::SourceDir() + "/models/tiny-moe", "--port_file=" + port_file,
       "--tls_cert_file=" + cert, "--tls_key_file=" + key, "--drain_timeout_s=2"},
      dir.path() + "/serve.log");
  ASSERT_TRUE(proc.ok()) << proc.status();
  auto ports = testing::WaitForPortFile(port_file, absl::Seconds(30));
  ASSERT_TRUE(ports.ok()) << ports.status();
  const std::string endpoint = absl::StrCat("127.0.0.1:", ports->grpc_port);

  sdk::ClientOptions options;
  std::ifstream in(cert);
  options.tls_root_certs.assign(std::istreambuf_iterator<char>(in), {});
  auto client = sdk::Client::Connect(endpoint, options);
  ASSERT_TRUE(client.ok()) << client.status();
  v1::GenerateRequest request;
  request.set_prompt("The jury said");
  request.mutable_sampling()->set_max_tokens(8);
  auto response = (*client)->Generate(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->token_ids_size(), 8);

  auto plaintext = sdk::Client::Connect(endpoint, {}, absl::Seconds(2));
  EXPECT_FALSE(plaintext.ok());
}

}  // namespace
}  // namespace tandem
