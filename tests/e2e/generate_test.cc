// End to end through the public API: the C++ SDK -> tandem-gateway -> tandem-prefill (full
// model, KV written over UCX) -> tandem-decode (continuous batching) -> back. Greedy generations
// equal the single-process engine's (`tandem generate`, i.e. Generator) and the PyTorch
// reference's token for token, for every golden prompt, one at a time and 16 at once; streaming
// and unary agree; a client that cancels frees decode's blocks; with one of two prefill
// instances dead the gateway keeps serving.
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/engine/generator.h"
#include "common/util/clock.h"
#include "nlohmann/json.hpp"
#include "tandem/client.h"
#include "tandem/v1/decode.grpc.pb.h"
#include "tests/testing/kernels.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

using testing::Subprocess;

constexpr int kTokens = 24;

class GenerateEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::UseExactKernels();  // compared with the PyTorch reference
    std::ifstream in(testing::SourceDir() + "/tests/golden/tiny-moe/manifest.json");
    manifest_ = nlohmann::json::parse(in);
    prefill_ = Start("tandem-prefill", {});
    decode_ = Start("tandem-decode", {"--kv_blocks=320"});
    ASSERT_FALSE(HasFailure());
  }

  void StartGateway(std::vector<std::string> prefills) {
    std::string prefill_flag = "--prefill=";
    for (size_t i = 0; i < prefills.size(); ++i) {
      absl::StrAppend(&prefill_flag, i ? "," : "", prefills[i]);
    }
    gateway_ = Start("tandem-gateway",
                     {prefill_flag, absl::StrCat("--decode=127.0.0.1:", decode_.grpc_port)});
    ASSERT_FALSE(HasFailure());
    auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", gateway_.grpc_port));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  testing::Ports Start(const std::string& binary, std::vector<std::string> extra) {
    const std::string name = absl::StrCat(binary, "-", processes_.size());
    const std::string port_file = dir_.path() + "/" + name + ".ports";
    std::vector<std::string> argv = {testing::BinDir() + "/" + binary,
                                     "--model=" + testing::SourceDir() + "/models/tiny-moe",
                                     "--port_file=" + port_file, "--drain_timeout_s=2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto proc = Subprocess::Start(argv, dir_.path() + "/" + name + ".log");
    EXPECT_TRUE(proc.ok()) << proc.status();
    if (!proc.ok()) return {};
    processes_.push_back(*std::move(proc));
    auto ports = testing::WaitForPortFile(port_file, absl::Seconds(30));
    EXPECT_TRUE(ports.ok()) << binary << ": " << ports.status();
    return ports.ok() ? *ports : testing::Ports{};
  }

  std::vector<int32_t> Prompt(int k) const {
    return manifest_["prompts"][k]["token_ids"].get<std::vector<int32_t>>();
  }
  std::vector<int32_t> Greedy(int k) const {
    auto ids = manifest_["prompts"][k]["greedy_token_ids"].get<std::vector<int32_t>>();
    if (ids.size() > kTokens) ids.resize(kTokens);
    return ids;
  }
  static v1::GenerateRequest ByIds(const std::vector<int32_t>& ids) {
    v1::GenerateRequest request;
    request.mutable_prompt_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
    request.mutable_sampling()->set_max_tokens(kTokens);
    return request;
  }

  int DecodeFreeBlocksMissing() {
    auto stub = v1::Decode::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", decode_.grpc_port), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::InstanceInfo info;
    if (!stub->GetInfo(&context, {}, &info).ok()) return -1;
    return info.total_kv_blocks() - info.free_kv_blocks();
  }

  testing::TempDir dir_;
  nlohmann::json manifest_;
  std::vector<Subprocess> processes_;
  testing::Ports prefill_, decode_, gateway_;
  std::unique_ptr<sdk::Client> client_;
};

TEST_F(GenerateEndToEndTest, GreedyMatchesTheReferenceAndTheSingleProcessEngine) {
  StartGateway({absl::StrCat("127.0.0.1:", prefill_.grpc_port)});
  const int n = static_cast<int>(manifest_["prompts"].size());
  for (int k = 0; k < n; ++k) {
    auto response = client_->Generate(ByIds(Prompt(k)));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(std::vector<int32_t>(response->token_ids().begin(), response->token_ids().end()),
              Greedy(k))
        << "prompt " << k;
    EXPECT_NE(response->finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  }
  // Text in, text out, against the engine in this process (what `tandem generate` prints).
  auto generator =
      engine::Generator::Load(*testing::OpenModelDir(testing::SourceDir() + "/models/tiny-moe"));
  ASSERT_TRUE(generator.ok()) << generator.status();
  for (const std::string prompt : {"The jury said", "She opened the door and"}) {
    engine::SamplingParams params;
    params.max_tokens = kTokens;
    auto local = (*generator)->Generate(prompt, params);
    ASSERT_TRUE(local.ok());
    v1::GenerateRequest request;
    request.set_prompt(prompt);
    request.mutable_sampling()->set_max_tokens(kTokens);
    auto remote = client_->Generate(request);
    ASSERT_TRUE(remote.ok()) << remote.status();
    EXPECT_EQ(std::vector<int32_t>(remote->token_ids().begin(), remote->token_ids().end()),
              local->output_ids);
    EXPECT_EQ(remote->text(), local->text);
    std::string streamed;
    std::vector<int32_t> streamed_ids;
    ASSERT_TRUE(client_
                    ->GenerateStream(request,
                                     [&](const v1::GenerateStreamResponse& chunk) {
                                       streamed += chunk.text();
                                       streamed_ids.insert(streamed_ids.end(),
                                                           chunk.token_ids().begin(),
                                                           chunk.token_ids().end());
                                     })
                    .ok());
    EXPECT_EQ(streamed, local->text);
    EXPECT_EQ(streamed_ids, local->output_ids);
  }
  EXPECT_EQ(DecodeFreeBlocksMissing(), 0);
}

TEST_F(GenerateEndToEndTest, SixteenConcurrentClientsGetTheReferenceTokens) {
  StartGateway({absl::StrCat("127.0.0.1:", prefill_.grpc_port)});
  const int n = static_cast<int>(manifest_["prompts"].size());
  std::vector<absl::StatusOr<v1::GenerateResponse>> results(16, absl::UnknownError("unset"));
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] { results[i] = client_->Generate(ByIds(Prompt(i % n))); });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_EQ(std::vector<int32_t>(results[i]->token_ids().begin(), results[i]->token_ids().end()),
              Greedy(i % n))
        << "client " << i;
  }
  EXPECT_TRUE(testing::WaitUntil([&] { return DecodeFreeBlocksMissing() == 0; }, absl::Seconds(5)));
}

TEST_F(GenerateEndToEndTest, OneDeadPrefillInstanceOfTwoDoesNotStopService) {
  // The second prefill address has nothing listening.
  StartGateway({"127.0.0.1:1", absl::StrCat("127.0.0.1:", prefill_.grpc_port)});
  for (int i = 0; i < 4; ++i) {
    auto response = client_->Generate(ByIds(Prompt(i)));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(std::vector<int32_t>(response->token_ids().begin(), response->token_ids().end()),
              Greedy(i));
  }
  EXPECT_TRUE(testing::WaitUntil([&] { return DecodeFreeBlocksMissing() == 0; }, absl::Seconds(5)));
}

// The client cancels mid-stream: CANCELLED at once, and decode frees the sequence's blocks.
TEST_F(GenerateEndToEndTest, ClientCancellationFreesDecodeBlocks) {
  StartGateway({absl::StrCat("127.0.0.1:", prefill_.grpc_port)});
  v1::GenerateRequest request = ByIds(Prompt(7));
  request.mutable_sampling()->set_max_tokens(300);
  request.mutable_sampling()->set_ignore_eos(true);
  sdk::Cancellation cancel;
  int chunks = 0;
  const absl::Status status = client_->GenerateStream(
      request,
      [&](const auto&) {
        if (++chunks == 3) cancel.Cancel();
      },
      &cancel);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_LT(chunks, 300);
  EXPECT_TRUE(testing::WaitUntil([&] { return DecodeFreeBlocksMissing() == 0; }, absl::Seconds(5)));
}

// Decode dies mid-stream: the client's stream ends with an error within seconds, not a hang.
TEST_F(GenerateEndToEndTest, KillingDecodeMidStreamEndsTheClientStreamWithAnError) {
  StartGateway({absl::StrCat("127.0.0.1:", prefill_.grpc_port)});
  v1::GenerateRequest request = ByIds(Prompt(7));
  request.mutable_sampling()->set_max_tokens(300);
  request.mutable_sampling()->set_ignore_eos(true);
  std::atomic<int> chunks{0};
  util::Instant killed_at = util::Instant::Never();
  const absl::Status status = client_->GenerateStream(request, [&](const auto&) {
    if (++chunks == 3) {
      ASSERT_EQ(kill(decode_.pid, SIGKILL), 0);
      killed_at = util::Instant::Now();
    }
  });
  ASSERT_GE(chunks.load(), 3);
  EXPECT_FALSE(status.ok());
  EXPECT_LT(util::Since(killed_at), absl::Seconds(10)) << status;
  EXPECT_LT(chunks.load(), 300);
}

// A dead decode instance fails its health checks and goes to the back of the order.
TEST_F(GenerateEndToEndTest, OneDeadDecodeInstanceOfTwoDoesNotStopService) {
  gateway_ =
      Start("tandem-gateway", {absl::StrCat("--prefill=127.0.0.1:", prefill_.grpc_port),
                               absl::StrCat("--decode=127.0.0.1:1,127.0.0.1:", decode_.grpc_port)});
  ASSERT_FALSE(HasFailure());
  auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", gateway_.grpc_port));
  ASSERT_TRUE(client.ok()) << client.status();
  for (int i = 0; i < 4; ++i) {
    auto response = (*client)->Generate(ByIds(Prompt(i)));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(std::vector<int32_t>(response->token_ids().begin(), response->token_ids().end()),
              Greedy(i));
  }
}

TEST_F(GenerateEndToEndTest, NoLivePrefillIsUnavailableWithAReason) {
  StartGateway({"127.0.0.1:1"});
  auto response = client_->Generate(ByIds(Prompt(0)));
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(response.status().message().find("prefill"), std::string::npos) << response.status();
  // The reservation made for it is released, not left to its lease.
  EXPECT_TRUE(testing::WaitUntil([&] { return DecodeFreeBlocksMissing() == 0; }, absl::Seconds(5)));
}

}  // namespace
}  // namespace tandem
