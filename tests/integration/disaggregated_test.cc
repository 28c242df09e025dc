// The disaggregated path between real processes: tandem-decode reserves KV blocks, tandem-prefill
// runs the prompt through the full model and writes its KV blocks straight into them over UCX
// (TCP), and tandem-decode continues from that KV cache. Greedy continuations equal the PyTorch
// reference's (tests/golden/tiny-moe) for every golden prompt, one at a time and all at once;
// an unknown or expired reservation and a mismatched prompt are clear errors; blocks return.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/decode.grpc.pb.h"
#include "tandem/v1/prefill.grpc.pb.h"
#include "tests/testing/kernels.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

constexpr int kTokens = 24;

// KV over UCX/TCP with dead-peer detection (the default), or over shared memory between the
// two processes.
class DisaggregatedTest : public ::testing::TestWithParam<std::vector<std::string>> {
 protected:
  void SetUp() override {
    testing::ExactKernelsInChildren();  // compared with the PyTorch reference
    std::ifstream in(testing::SourceDir() + "/tests/golden/tiny-moe/manifest.json");
    manifest_ = nlohmann::json::parse(in);
    prefill_ = Start("tandem-prefill", GetParam());
    std::vector<std::string> decode_flags = GetParam();
    decode_flags.push_back("--kv_blocks=160");
    // Short enough for the expiry test, long enough for 2 x prompts clients to prefill in.
    decode_flags.push_back(absl::StrCat("--lease_ms=", 1500 * testing::TimeScale()));
    decode_ = Start("tandem-decode", decode_flags);
    ASSERT_FALSE(HasFailure());
    prefill_stub_ = v1::Prefill::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", prefill_.grpc_port), grpc::InsecureChannelCredentials()));
    decode_stub_ = v1::Decode::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", decode_.grpc_port), grpc::InsecureChannelCredentials()));
  }

  testing::Ports Start(const std::string& binary, const std::vector<std::string>& extra) {
    absl::StatusOr<testing::Ports> ports = services_.Start(binary, extra);
    EXPECT_TRUE(ports.ok()) << ports.status();
    return ports.ok() ? *ports : testing::Ports{};
  }

  std::string Log(const std::string& binary) { return services_.Log(binary); }

  std::vector<int32_t> Prompt(int k) const {
    return manifest_["prompts"][k]["token_ids"].get<std::vector<int32_t>>();
  }
  std::vector<int32_t> Greedy(int k) const {
    auto ids = manifest_["prompts"][k]["greedy_token_ids"].get<std::vector<int32_t>>();
    if (ids.size() > kTokens) ids.resize(kTokens);
    return ids;
  }

  static std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(timeout));
    return context;
  }

  // Reserve -> Prefill -> Decode for one prompt; the streamed token ids.
  absl::StatusOr<std::vector<int32_t>> Generate(const std::vector<int32_t>& prompt,
                                                const std::string& id) {
    v1::ReserveRequest reserve;
    reserve.set_request_id(id);
    reserve.set_prompt_tokens(static_cast<int>(prompt.size()));
    reserve.set_max_tokens(kTokens);
    v1::ReserveResponse reserved;
    grpc::Status s = decode_stub_->Reserve(Context(absl::Seconds(10)).get(), reserve, &reserved);
    if (!s.ok()) return absl::InternalError("Reserve: " + s.error_message());

    v1::PrefillRequest prefill;
    prefill.set_request_id(id);
    prefill.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
    prefill.mutable_sampling()->set_max_tokens(kTokens);
    *prefill.mutable_target() = reserved.target();
    v1::PrefillResponse prefilled;
    s = prefill_stub_->Prefill(Context(absl::Seconds(30)).get(), prefill, &prefilled);
    if (!s.ok()) return absl::InternalError("Prefill: " + s.error_message());
    if (prefilled.kv_bytes() <= 0) return absl::InternalError("Prefill wrote no KV bytes");

    v1::DecodeRequest decode;
    decode.set_request_id(id);
    decode.set_handle(reserved.handle());
    decode.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
    decode.set_first_token_id(prefilled.first_token_id());
    decode.mutable_sampling()->set_max_tokens(kTokens);
    auto context = Context(absl::Seconds(30));
    auto reader = decode_stub_->Decode(context.get(), decode);
    std::vector<int32_t> tokens;
    v1::GenerateStreamResponse chunk;
    bool finished = false;
    while (reader->Read(&chunk)) {
      tokens.insert(tokens.end(), chunk.token_ids().begin(), chunk.token_ids().end());
      if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        finished = true;
        if (chunk.usage().completion_tokens() != static_cast<int>(tokens.size())) {
          return absl::InternalError("usage does not count the tokens");
        }
      }
    }
    s = reader->Finish();
    if (!s.ok()) return absl::InternalError("Decode: " + s.error_message());
    if (!finished) return absl::InternalError("the stream ended without a finish reason");
    if (tokens.empty() || tokens.front() != prefilled.first_token_id()) {
      return absl::InternalError("the stream does not start with prefill's first token");
    }
    return tokens;
  }

  v1::InstanceInfo DecodeInfo() {
    v1::InstanceInfo info;
    EXPECT_TRUE(decode_stub_->GetInfo(Context(absl::Seconds(5)).get(), {}, &info).ok());
    return info;
  }

  testing::ServiceSet services_;
  nlohmann::json manifest_;
  testing::Ports prefill_, decode_;
  std::unique_ptr<v1::Prefill::Stub> prefill_stub_;
  std::unique_ptr<v1::Decode::Stub> decode_stub_;
};

TEST_P(DisaggregatedTest, GreedyGenerationsMatchTheReferenceOneAtATime) {
  for (size_t k = 0; k < manifest_["prompts"].size(); ++k) {
    auto tokens = Generate(Prompt(static_cast<int>(k)), absl::StrCat("one-", k));
    ASSERT_TRUE(tokens.ok()) << tokens.status() << "\n"
                             << Log("tandem-decode") << Log("tandem-prefill");
    EXPECT_EQ(*tokens, Greedy(static_cast<int>(k))) << "prompt " << k;
  }
  const v1::InstanceInfo info = DecodeInfo();
  EXPECT_EQ(info.free_kv_blocks(), info.total_kv_blocks());
}

TEST_P(DisaggregatedTest, GreedyGenerationsMatchTheReferenceAllAtOnce) {
  const int n = static_cast<int>(manifest_["prompts"].size());
  std::vector<absl::StatusOr<std::vector<int32_t>>> results(2 * n, absl::UnknownError("unset"));
  std::vector<std::thread> clients;
  for (int i = 0; i < 2 * n; ++i) {
    clients.emplace_back([&, i] { results[i] = Generate(Prompt(i % n), absl::StrCat("all-", i)); });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 2 * n; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_EQ(*results[i], Greedy(i % n)) << "client " << i;
  }
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        const v1::InstanceInfo info = DecodeInfo();
        return info.free_kv_blocks() == info.total_kv_blocks();
      },
      absl::Seconds(5)));
}

TEST_P(DisaggregatedTest, BadReservationsAreClearErrorsAndLeasesExpire) {
  v1::DecodeRequest decode;
  decode.set_handle("no-such-handle");
  decode.add_prompt_token_ids(1);
  v1::GenerateStreamResponse chunk;
  auto context = Context(absl::Seconds(5));
  auto reader = decode_stub_->Decode(context.get(), decode);
  while (reader->Read(&chunk)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);

  v1::ReserveRequest reserve;
  reserve.set_prompt_tokens(5);
  reserve.set_max_tokens(4);
  v1::ReserveResponse reserved;
  ASSERT_TRUE(decode_stub_->Reserve(Context(absl::Seconds(5)).get(), reserve, &reserved).ok());
  EXPECT_LT(DecodeInfo().free_kv_blocks(), DecodeInfo().total_kv_blocks());
  // A prompt of another length than reserved.
  decode.set_handle(reserved.handle());
  auto mismatch_context = Context(absl::Seconds(5));
  auto mismatch = decode_stub_->Decode(mismatch_context.get(), decode);
  while (mismatch->Read(&chunk)) {
  }
  EXPECT_EQ(mismatch->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // The lease (1.5 s here, unless slowed down) passes: the blocks come back.
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        const v1::InstanceInfo info = DecodeInfo();
        return info.free_kv_blocks() == info.total_kv_blocks();
      },
      absl::Seconds(10 * testing::TimeScale())));
  v1::ReserveRequest too_big;
  too_big.set_prompt_tokens(450);  // 450 + 100 tokens do not fit the 512-token context
  too_big.set_max_tokens(100);
  EXPECT_EQ(decode_stub_->Reserve(Context(absl::Seconds(5)).get(), too_big, &reserved).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// Scoring a prompt is a prefill without a target; decode takes the first token's
// log-probabilities from prefill and refuses ones that cannot be.
TEST_P(DisaggregatedTest, PromptScoringRunsOnPrefillAloneAndBadLogprobsAreRefused) {
  const auto prompt = manifest_["prompts"][0]["token_ids"].get<std::vector<int32_t>>();
  v1::PrefillRequest score;
  score.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
  score.mutable_sampling()->set_max_tokens(0);
  score.mutable_sampling()->set_prompt_logprobs(2);
  v1::PrefillResponse scored;
  ASSERT_TRUE(prefill_stub_->Prefill(Context(absl::Seconds(30)).get(), score, &scored).ok());
  EXPECT_EQ(scored.kv_bytes(), 0);
  ASSERT_EQ(scored.prompt_logprobs_size(), static_cast<int>(prompt.size()) - 1);
  for (int i = 0; i < scored.prompt_logprobs_size(); ++i) {
    EXPECT_EQ(scored.prompt_logprobs(i).token_id(), prompt[i + 1]);
    EXPECT_LE(scored.prompt_logprobs(i).logprob(), 0.0f);
    EXPECT_EQ(scored.prompt_logprobs(i).top_size(), 2);
  }
  // Scoring sends nothing, so a target is a mistake; generating needs one.
  score.mutable_target()->set_agent("x");
  EXPECT_EQ(prefill_stub_->Prefill(Context(absl::Seconds(5)).get(), score, &scored).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  score.clear_target();
  score.mutable_sampling()->set_max_tokens(4);
  EXPECT_EQ(prefill_stub_->Prefill(Context(absl::Seconds(5)).get(), score, &scored).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  score.mutable_sampling()->set_max_tokens(0);
  score.mutable_sampling()->clear_prompt_logprobs();
  EXPECT_EQ(prefill_stub_->Prefill(Context(absl::Seconds(5)).get(), score, &scored).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  auto refused = [&](const v1::DecodeRequest& decode) {
    auto context = Context(absl::Seconds(5));
    auto reader = decode_stub_->Decode(context.get(), decode);
    v1::GenerateStreamResponse chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  };
  v1::DecodeRequest decode;
  decode.set_handle("unused");
  decode.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
  decode.set_first_token_id(5);
  decode.mutable_sampling()->set_max_tokens(4);
  decode.mutable_sampling()->set_logprobs(1);
  grpc::Status missing = refused(decode);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(missing.error_message(), "first_token_logprobs"));
  decode.mutable_first_token_logprobs()->set_token_id(6);  // another token's
  EXPECT_EQ(refused(decode).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  decode.mutable_first_token_logprobs()->set_token_id(5);
  decode.mutable_first_token_logprobs()->set_logprob(0.5f);  // above 0
  EXPECT_EQ(refused(decode).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  decode.mutable_first_token_logprobs()->set_logprob(-1.0f);
  for (int i = 0; i < 2; ++i) decode.mutable_first_token_logprobs()->add_top()->set_token_id(1);
  EXPECT_EQ(refused(decode).error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // 2 > 1 asked
}

INSTANTIATE_TEST_SUITE_P(
    Kv, DisaggregatedTest,
    ::testing::Values(std::vector<std::string>{},
                      std::vector<std::string>{"--kv_transports=sm,tcp",
                                               "--kv_detect_dead_peers=false"}),
    [](const auto& info) { return info.param.empty() ? "Tcp" : "SharedMemory"; });

}  // namespace
}  // namespace tandem
