// Faults against real processes: a prefill stopped mid-transfer past the reservation's lease
// (SIGSTOP, then SIGCONT) while other requests reuse its blocks; decode killed or stopped
// mid-stream; prefill killed mid-transfer; the gateway killed after Reserve. (Network faults,
// hosts cut off while their processes live on, are tests/netns/netns_test.cc.) Each checks what a
// user sees (the greedy tokens of every request that succeeds equal the single-process engine's;
// failures are quick and say why) and that nothing leaks (decode's KV blocks in use return to
// zero).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/util/clock.h"
#include "tandem/client.h"
#include "tests/testing/hybrid_model.h"
#include "tests/testing/kernels.h"
#include "tests/testing/reference.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr char kPrompts[][96] = {
    "The jury said it did not believe the evidence was strong enough to convict",
    "It was a bright cold day in April, and the clocks of the old town hall",
    "She opened the door and looked out over the fields toward the river",
    "Most of the committee members agreed that the plan would cost more",
};

struct Outcome {
  absl::Status status;
  std::vector<int32_t> tokens;
  util::Instant first_token;
};

v1::GenerateRequest Greedy(const std::string& prompt, int max_tokens) {
  v1::GenerateRequest request;
  request.set_prompt(prompt);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_ignore_eos(true);
  return request;
}

class FaultTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The services' caches as the in-process reference's: float32 (the stall thresholds below
    // count float32 KV bytes too).
    testing::Float32KvInChildren();
    reference_ = testing::GreedyReference::LoadOrFail();
  }
  static void TearDownTestSuite() { delete reference_; }

  // The single-process engine's greedy tokens.
  static std::vector<int32_t> Reference(const std::string& prompt, int max_tokens) {
    return reference_ != nullptr ? reference_->Tokens(prompt, max_tokens) : std::vector<int32_t>{};
  }

  // Streams a greedy generation through the gateway on `port`.
  static Outcome Stream(int port, const std::string& prompt, int max_tokens,
                        std::function<void(int tokens)> on_tokens = nullptr) {
    Outcome out;
    sdk::ClientOptions options;
    options.timeout = absl::Seconds(60);
    auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", port), options);
    if (!client.ok()) {
      out.status = client.status();
      return out;
    }
    out.status = (*client)->GenerateStream(
        Greedy(prompt, max_tokens), [&](const v1::GenerateStreamResponse& chunk) {
          if (out.tokens.empty() && chunk.token_ids_size() > 0)
            out.first_token = util::Instant::Now();
          out.tokens.insert(out.tokens.end(), chunk.token_ids().begin(), chunk.token_ids().end());
          if (on_tokens) on_tokens(static_cast<int>(out.tokens.size()));
        });
    return out;
  }

  static double Metric(int http_port, const std::string& name, const std::string& label = "") {
    return testing::MetricValue(http_port, name, label);
  }
  static double UsedBlocks(int decode_http) {
    return Metric(decode_http, "tandem_kv_blocks", "state=\"used\"");
  }

  static void StalledPrefillCorruptsNoOtherRequest(
      testing::ServiceSet& set, const std::vector<std::string>& engine_flags, int64_t chunk,
      int64_t stop_after,
      const std::function<std::vector<int32_t>(const std::string& prompt, int tokens)>& reference);

  static testing::GreedyReference* reference_;
};

testing::GreedyReference* FaultTest::reference_ = nullptr;

// The reproduction: a prefill stopped in the middle of a transfer until past the lease,
// requests running meanwhile through a second prefill on the blocks the stalled transfer
// targeted (decode's free list hands the freed blocks out first), then the stalled prefill
// resumed. Its late bytes are dropped, not written: every other request's tokens equal the
// reference; the stalled request fails, saying why. (Through a gateway that knows both
// prefills the stalled request would instead be retried on the other: APrefillKilled... below.)
// `engine_flags` go to prefill and decode; `stop_after` bytes of its first transfer (in
// `chunk`-byte messages) before the first prefill stalls.
void FaultTest::StalledPrefillCorruptsNoOtherRequest(
    testing::ServiceSet& set, const std::vector<std::string>& engine_flags, int64_t chunk,
    int64_t stop_after,
    const std::function<std::vector<int32_t>(const std::string& prompt, int tokens)>& reference) {
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), engine_flags.begin(), engine_flags.end());
    return flags;
  };
  auto decode = set.Start("tandem-decode", with({"--lease_ms=1500", "--kv_blocks=40"}));
  ASSERT_TRUE(decode.ok()) << decode.status();
  auto stalled = set.Start("tandem-prefill",
                           with({absl::StrCat("--kv_chunk_bytes=", chunk),
                                 absl::StrCat("--testing_stop_after_kv_bytes=", stop_after)}));
  ASSERT_TRUE(stalled.ok()) << stalled.status();
  const pid_t stalled_pid = set.processes().back().pid();
  auto healthy = set.Start("tandem-prefill", with({}));
  ASSERT_TRUE(healthy.ok()) << healthy.status();
  const std::string to_decode = absl::StrCat("--decode=127.0.0.1:", decode->grpc_port);
  // Health checks far apart: the lease, not the gateway's abandoning of a silent prefill
  // (tests/netns), is what ends the stalled attempt here.
  auto via_stalled =
      set.Start("tandem-gateway", {absl::StrCat("--prefill=127.0.0.1:", stalled->grpc_port),
                                   to_decode, "--health_interval_s=5"});
  ASSERT_TRUE(via_stalled.ok()) << via_stalled.status();
  auto via_healthy = set.Start(
      "tandem-gateway", {absl::StrCat("--prefill=127.0.0.1:", healthy->grpc_port), to_decode});
  ASSERT_TRUE(via_healthy.ok()) << via_healthy.status();
  constexpr int kTokens = 100;

  // A short one: its reservation is just its prompt's two blocks, which the next reservation
  // (another prompt's) gets back as its own prompt blocks.
  Outcome stalled_request;
  std::thread first([&] { stalled_request = Stream(via_stalled->grpc_port, kPrompts[0], 4); });
  ASSERT_TRUE(testing::WaitUntil([&] { return testing::Stopped(stalled_pid); }, absl::Seconds(20)))
      << "the first prefill never stalled";
  // Past the lease the gateway gives the attempt up and releases the reservation.
  first.join();
  EXPECT_FALSE(stalled_request.status.ok());
  EXPECT_THAT(std::string(stalled_request.status.message()), HasSubstr("lease"))
      << stalled_request.status;
  EXPECT_TRUE(stalled_request.tokens.empty());

  // Others now decode on the freed blocks.
  std::vector<Outcome> outcomes(3);
  std::vector<std::thread> threads;
  std::atomic<int> started{0};
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      outcomes[i] = Stream(via_healthy->grpc_port, kPrompts[i + 1], kTokens, [&](int n) {
        if (n == 1) started.fetch_add(1);
      });
    });
  }
  ASSERT_TRUE(testing::WaitUntil([&] { return started.load() == 3; }, absl::Seconds(20)));
  const double dropped_before = Metric(decode->http_port, "tandem_kv_receive_dropped_bytes_total");
  ASSERT_EQ(kill(stalled_pid, SIGCONT), 0);  // its remaining KV goes out now
  for (auto& t : threads) t.join();
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(kPrompts[i + 1]);
    ASSERT_TRUE(outcomes[i].status.ok()) << outcomes[i].status;
    EXPECT_EQ(outcomes[i].tokens, reference(kPrompts[i + 1], kTokens));
  }
  // The stalled transfer's remaining messages arrived, and were dropped.
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        return Metric(decode->http_port, "tandem_kv_receive_dropped_bytes_total") >=
               dropped_before + static_cast<double>(chunk);
      },
      absl::Seconds(20)))
      << set.Log("tandem-prefill");
  EXPECT_TRUE(
      testing::WaitUntil([&] { return UsedBlocks(decode->http_port) == 0; }, absl::Seconds(10)));
}

TEST_F(FaultTest, APrefillStalledPastTheLeaseCorruptsNoOtherRequest) {
  testing::ServiceSet set;
  StalledPrefillCorruptsNoOtherRequest(set, {}, /*chunk=*/16384, /*stop_after=*/32768, Reference);
}

// The same on a hybrid model (tests/testing/hybrid_model.h), the prefill stalled inside the
// stream's last part, the sequence's recurrent state: the reservation's state slot goes to the
// next reservation with its blocks, and the late state bytes are dropped as the blocks' are.
TEST_F(FaultTest, AStalledPrefillsLateRecurrentStateCorruptsNoOtherRequest) {
  testing::TempDir dir;
  testing::WriteDummyHybridModel(dir.path());
  testing::ServiceSet colocated(dir.path());
  auto serve = colocated.Start("tandem-serve", testing::DummyHybridFlags());
  ASSERT_TRUE(serve.ok()) << serve.status();
  auto reference = [&](const std::string& prompt, int tokens) {
    return Stream(serve->grpc_port, prompt, tokens).tokens;
  };
  // A short prompt's stream here: its blocks' K/V (4 KiB a block: 16 tokens x 1 attention
  // layer x 2 heads x 16 x 4 bytes, K and V), then 16.5 KiB of state; the stall comes 10 KiB
  // in, inside the state.
  testing::ServiceSet set(dir.path());
  StalledPrefillCorruptsNoOtherRequest(set, testing::DummyHybridFlags(), /*chunk=*/2048,
                                       /*stop_after=*/10240, reference);
}

// Decode killed in the middle of a stream: the client hears within 5 s. Decode stopped (a
// silent host): the stream ends once it has shown no life for the idle timeout.
TEST_F(FaultTest, ADeadOrSilentDecodeEndsTheStreamQuickly) {
  for (const int signal : {SIGKILL, SIGSTOP}) {
    SCOPED_TRACE(signal == SIGKILL ? "SIGKILL" : "SIGSTOP");
    testing::ServiceSet set;
    auto decode = set.Start("tandem-decode", {"--heartbeat_ms=300"});
    ASSERT_TRUE(decode.ok()) << decode.status();
    const pid_t decode_pid = set.processes().back().pid();
    auto prefill = set.Start("tandem-prefill", {});
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    auto gateway =
        set.Start("tandem-gateway", {absl::StrCat("--prefill=127.0.0.1:", prefill->grpc_port),
                                     absl::StrCat("--decode=127.0.0.1:", decode->grpc_port),
                                     "--stream_idle_timeout_s=2"});
    ASSERT_TRUE(gateway.ok()) << gateway.status();
    util::Instant hit;
    const Outcome out = Stream(gateway->grpc_port, kPrompts[1], 480, [&](int n) {
      if (n == 3) {
        kill(decode_pid, signal);
        hit = util::Instant::Now();
      }
    });
    ASSERT_NE(hit, util::Instant());
    EXPECT_FALSE(out.status.ok());
    EXPECT_EQ(out.status.code(), absl::StatusCode::kUnavailable) << out.status;
    EXPECT_LT(util::Since(hit), absl::Seconds(5)) << out.status;
    if (signal == SIGSTOP) {
      EXPECT_THAT(std::string(out.status.message()), HasSubstr("sent nothing"));
      kill(decode_pid, SIGCONT);
    }
    EXPECT_LT(out.tokens.size(), 480u);
  }
}

// The gateway itself goes silent (SIGSTOP) mid-stream: the SDK, which hears a keep-alive at
// least every 2 s from a live gateway, ends the stream after its idle timeout.
TEST_F(FaultTest, ASilentGatewayIsNoticedByTheSdk) {
  testing::ServiceSet set;
  auto decode = set.Start("tandem-decode", {});
  ASSERT_TRUE(decode.ok()) << decode.status();
  auto prefill = set.Start("tandem-prefill", {});
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  auto gateway =
      set.Start("tandem-gateway", {absl::StrCat("--prefill=127.0.0.1:", prefill->grpc_port),
                                   absl::StrCat("--decode=127.0.0.1:", decode->grpc_port)});
  ASSERT_TRUE(gateway.ok()) << gateway.status();
  const pid_t gateway_pid = set.processes().back().pid();
  sdk::ClientOptions options;
  options.idle_timeout = absl::Seconds(3);
  auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", gateway->grpc_port), options);
  ASSERT_TRUE(client.ok()) << client.status();
  util::Instant hit;
  int tokens = 0;
  const absl::Status status =
      (*client)->GenerateStream(Greedy(kPrompts[1], 480), [&](const v1::GenerateStreamResponse& c) {
        tokens += c.token_ids_size();
        if (tokens >= 3 && hit == util::Instant()) {
          kill(gateway_pid, SIGSTOP);
          hit = util::Instant::Now();
        }
      });
  kill(gateway_pid, SIGCONT);
  ASSERT_NE(hit, util::Instant());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("idle_timeout"));
  EXPECT_LT(util::Since(hit), absl::Seconds(8));
}

// Prefill killed while its KV is on the way: the gateway retries the prompt on the other
// prefill with a fresh reservation, and the request completes as if nothing happened.
TEST_F(FaultTest, APrefillKilledMidTransferIsRetriedElsewhere) {
  testing::ServiceSet set;
  auto decode = set.Start("tandem-decode", {});
  ASSERT_TRUE(decode.ok()) << decode.status();
  auto doomed = set.Start("tandem-prefill", {"--host=127.0.0.1", "--kv_chunk_bytes=16384",
                                             "--testing_stop_after_kv_bytes=32768"});
  ASSERT_TRUE(doomed.ok()) << doomed.status();
  const pid_t doomed_pid = set.processes().back().pid();
  auto other = set.Start("tandem-prefill", {"--host=127.0.0.2"});
  ASSERT_TRUE(other.ok()) << other.status();
  auto gateway = set.Start(
      "tandem-gateway",
      {absl::StrCat("--prefill=127.0.0.1:", doomed->grpc_port, ",127.0.0.2:", other->grpc_port),
       absl::StrCat("--decode=127.0.0.1:", decode->grpc_port)});
  ASSERT_TRUE(gateway.ok()) << gateway.status();
  Outcome out;
  std::thread client([&] { out = Stream(gateway->grpc_port, kPrompts[2], 48); });
  ASSERT_TRUE(testing::WaitUntil([&] { return testing::Stopped(doomed_pid); }, absl::Seconds(20)));
  ASSERT_EQ(kill(doomed_pid, SIGKILL), 0);  // mid-transfer: part of its KV has landed
  client.join();
  ASSERT_TRUE(out.status.ok()) << out.status << set.Log("tandem-gateway");
  EXPECT_EQ(out.tokens, Reference(kPrompts[2], 48));
  EXPECT_TRUE(
      testing::WaitUntil([&] { return UsedBlocks(decode->http_port) == 0; }, absl::Seconds(10)));
}

// The gateway dies after Reserve (its prefill is stalled): nobody will ever claim or release
// the reservation; decode frees it when the lease ends, and drops the prefill's KV when it
// resumes.
TEST_F(FaultTest, AReservationWhoseGatewayDiedIsFreedAtTheLeaseEnd) {
  testing::ServiceSet set;
  auto decode = set.Start("tandem-decode", {"--lease_ms=1500"});
  ASSERT_TRUE(decode.ok()) << decode.status();
  auto prefill = set.Start("tandem-prefill",
                           {"--kv_chunk_bytes=16384", "--testing_stop_after_kv_bytes=32768"});
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  const pid_t prefill_pid = set.processes().back().pid();
  // Health checks far apart: the gateway must not abandon the stalled attempt (and release
  // its reservation) before it dies.
  auto gateway =
      set.Start("tandem-gateway",
                {absl::StrCat("--prefill=127.0.0.1:", prefill->grpc_port),
                 absl::StrCat("--decode=127.0.0.1:", decode->grpc_port), "--health_interval_s=5"});
  ASSERT_TRUE(gateway.ok()) << gateway.status();
  const pid_t gateway_pid = set.processes().back().pid();
  std::thread client([&] { (void)Stream(gateway->grpc_port, kPrompts[3], 16); });
  ASSERT_TRUE(testing::WaitUntil([&] { return testing::Stopped(prefill_pid); }, absl::Seconds(20)));
  ASSERT_GT(UsedBlocks(decode->http_port), 0);  // reserved
  ASSERT_EQ(kill(gateway_pid, SIGKILL), 0);
  client.join();
  const util::Instant killed = util::Instant::Now();
  EXPECT_TRUE(
      testing::WaitUntil([&] { return UsedBlocks(decode->http_port) == 0; }, absl::Seconds(10)));
  EXPECT_LT(util::Since(killed), absl::Seconds(4));
  EXPECT_GE(Metric(decode->http_port, "tandem_reservations_expired_total"), 1);
  ASSERT_EQ(kill(prefill_pid, SIGCONT), 0);
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return Metric(decode->http_port, "tandem_kv_receive_dropped_bytes_total") > 0; },
      absl::Seconds(20)));
  EXPECT_EQ(UsedBlocks(decode->http_port), 0);
}

}  // namespace
}  // namespace tandem
