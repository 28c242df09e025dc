// The cluster across real network boundaries: the gateway, prefill and decode instances each
// on a host of their own (a network namespace on a bridge: tests/testing/netns.h), gRPC and
// UCX's TCP transport crossing real interfaces, and the network failing while every process
// lives on: a prefill-to-decode link cut in the middle of a KV transfer, a decode host
// unreachable mid-stream, a prefill host unreachable and back, the gateway restarted while
// streams are open, the prefill-decode path cut and healed. Each checks what the client sees
// (tokens equal to the single-process engine's when it succeeds; a quick error saying why when
// it cannot), a bound on how long it waits, what the metrics counted, and that nothing leaks
// (KV blocks and running sequences back to zero on every instance). Each prints its timings
// ("netns timing: ..."), the figures of docs/reliability.md's partition table.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/util/clock.h"
#include "common/util/status.h"
#include "tandem/client.h"
#include "tests/testing/kernels.h"
#include "tests/testing/netns.h"
#include "tests/testing/reference.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using testing::VirtualNetwork;

constexpr char kPrompts[][96] = {
    "The jury said it did not believe the evidence was strong enough to convict",
    "It was a bright cold day in April, and the clocks of the old town hall",
    "She opened the door and looked out over the fields toward the river",
    "Most of the committee members agreed that the plan would cost more",
    "When the rain finally stopped, the children ran out into the street",
    "He had never seen so many people gathered in the square before noon",
    "The old man kept a small boat tied up at the end of the wooden pier",
    "After the meeting the two ministers walked together down the long hall",
};

// A prefill instance that stops itself (SIGSTOP) after 32 KiB of its first KV transfer (float32
// KV, 16 KiB messages): a prompt held mid-transfer for a fault to strike.
const std::vector<std::string> kStallsMidTransfer = {"--kv_chunk_bytes=16384",
                                                     "--testing_stop_after_kv_bytes=32768"};

// A line of the partition table: what one fault took.
void Timing(const std::string& fault, const std::string& what, absl::Duration took) {
  std::cout << "netns timing: " << fault << ": " << what << " " << absl::FormatDuration(took)
            << std::endl;
}

struct Outcome {
  absl::Status status;
  std::vector<int32_t> tokens;
  util::Instant done;
};

// One service on a host of its own.
struct Service {
  VirtualNetwork::Host host;
  testing::Ports ports;
  pid_t pid = -1;
  std::string grpc() const { return absl::StrCat(host.address, ":", ports.grpc_port); }
  double Metric(const std::string& name, const std::string& label = "") const {
    return testing::MetricValueAt(host.address, ports.http_port, name, label);
  }
  double UsedBlocks() const { return Metric("tandem_kv_blocks", "state=\"used\""); }
  double Running() const { return Metric("tandem_running_sequences"); }
};

struct Cluster {
  Service gateway;
  std::vector<Service> prefill, decode;
};

class NetnsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The services' caches as the in-process reference's: float32 (the stall threshold below
    // counts float32 KV bytes).
    testing::Float32KvInChildren();
    reference_ = testing::GreedyReference::LoadOrFail();
  }
  static void TearDownTestSuite() { delete reference_; }

  void SetUp() override {
    auto net = VirtualNetwork::Create();
    if (!net.ok()) GTEST_SKIP() << "no network namespaces here: " << net.status().message();
    net_ = *std::move(net);
    set_ = std::make_unique<testing::ServiceSet>();
  }
  void TearDown() override {
    if (HasFailure() && set_ != nullptr) {
      for (const char* binary : {"tandem-gateway", "tandem-prefill", "tandem-decode"}) {
        std::cout << "---- " << binary << " log ----\n" << set_->Log(binary);
      }
    }
    set_.reset();  // the services first: their namespaces go with the network
    net_.reset();
  }

  // Starts `binary` on a new host called `name`, listening on its address.
  absl::StatusOr<Service> Start(const std::string& name, const std::string& binary,
                                std::vector<std::string> flags) {
    Service service;
    ASSIGN_OR_RETURN(service.host, net_->AddHost(name));
    const std::vector<std::string> listen =
        VirtualNetwork::ListenFlags(service.host, binary != "tandem-gateway");
    flags.insert(flags.begin(), listen.begin(), listen.end());
    ASSIGN_OR_RETURN(service.ports, set_->Start(binary, flags, net_->Launcher(service.host)));
    service.pid = set_->processes().back().pid();
    return service;
  }

  // The gateway, then prefill and decode instances (one per entry of the flag lists), each on
  // its own host; the gateway knows them all.
  absl::StatusOr<Cluster> StartCluster(const std::vector<std::vector<std::string>>& prefill_flags,
                                       const std::vector<std::vector<std::string>>& decode_flags,
                                       std::vector<std::string> gateway_flags = {}) {
    Cluster cluster;
    std::vector<std::string> prefill, decode;
    for (size_t i = 0; i < prefill_flags.size(); ++i) {
      ASSIGN_OR_RETURN(Service s,
                       Start(absl::StrCat("prefill-", i), "tandem-prefill", prefill_flags[i]));
      prefill.push_back(s.grpc());
      cluster.prefill.push_back(std::move(s));
    }
    for (size_t i = 0; i < decode_flags.size(); ++i) {
      ASSIGN_OR_RETURN(Service s,
                       Start(absl::StrCat("decode-", i), "tandem-decode", decode_flags[i]));
      decode.push_back(s.grpc());
      cluster.decode.push_back(std::move(s));
    }
    gateway_flags.push_back("--prefill=" + absl::StrJoin(prefill, ","));
    gateway_flags.push_back("--decode=" + absl::StrJoin(decode, ","));
    gateway_flags_ = gateway_flags;
    ASSIGN_OR_RETURN(cluster.gateway, Start("gateway", "tandem-gateway", gateway_flags));
    return cluster;
  }

  // Streams a greedy generation through the gateway, from this process's host.
  static Outcome Stream(const Service& gateway, const std::string& prompt, int max_tokens,
                        std::function<void(int tokens)> on_tokens = nullptr) {
    Outcome out;
    sdk::ClientOptions options;
    options.timeout = absl::Seconds(60);
    auto client = sdk::Client::Connect(gateway.grpc(), options);
    if (!client.ok()) {
      out.status = client.status();
      out.done = util::Instant::Now();
      return out;
    }
    v1::GenerateRequest request;
    request.set_prompt(prompt);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    request.mutable_sampling()->set_ignore_eos(true);
    out.status = (*client)->GenerateStream(request, [&](const v1::GenerateStreamResponse& chunk) {
      out.tokens.insert(out.tokens.end(), chunk.token_ids().begin(), chunk.token_ids().end());
      if (on_tokens) on_tokens(static_cast<int>(out.tokens.size()));
    });
    out.done = util::Instant::Now();
    return out;
  }

  // The single-process engine's greedy tokens.
  static std::vector<int32_t> Reference(const std::string& prompt, int max_tokens) {
    return reference_ != nullptr ? reference_->Tokens(prompt, max_tokens) : std::vector<int32_t>{};
  }

  // Streams `prompt` (greedy) into `out` on `client`, and waits until the first prefill instance,
  // started with kStallsMidTransfer, has stopped itself in the middle of the prompt's KV
  // transfer: the first request goes there (the gateway's rotation starts with it).
  ::testing::AssertionResult StreamUntilStalled(const Cluster& cluster, const std::string& prompt,
                                                int max_tokens, Outcome* out,
                                                std::jthread* client) {
    *client = std::jthread([&cluster, prompt, max_tokens, out] {
      *out = Stream(cluster.gateway, prompt, max_tokens);
    });
    if (testing::WaitUntil([&] { return testing::Stopped(cluster.prefill[0].pid); },
                           absl::Seconds(20))) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "the first request did not stop " << cluster.prefill[0].host.name;
  }

  // What is still held anywhere (KV blocks in use, sequences running, prompts in prefill), as
  // "host: what" lines; empty when nothing is.
  static std::string Held(const Cluster& cluster) {
    std::string held;
    for (const Service& d : cluster.decode) {
      const double used = d.UsedBlocks(), running = d.Running();
      if (used != 0 || running != 0) {
        absl::StrAppend(&held, d.host.name, ": ", used, " KV blocks used, ", running,
                        " sequences running\n");
      }
    }
    for (const Service& p : cluster.prefill) {
      // Waiting, in the batch, or shipping their KV.
      const double prompts = p.Metric("tandem_prefill_queue_depth");
      if (prompts != 0) absl::StrAppend(&held, p.host.name, ": ", prompts, " prompts held\n");
    }
    return held;
  }
  // Waits up to `deadline` for nothing to be held; what still is, when something is.
  static std::string WaitAllFree(const Cluster& cluster, absl::Duration deadline) {
    std::string held;
    testing::WaitUntil([&] { return (held = Held(cluster)).empty(); }, deadline);
    return held;
  }

  static testing::GreedyReference* reference_;
  std::unique_ptr<VirtualNetwork> net_;
  std::unique_ptr<testing::ServiceSet> set_;
  std::vector<std::string> gateway_flags_;
};

testing::GreedyReference* NetnsTest::reference_ = nullptr;

// A prefill host's link to the decode host cut in the middle of a KV transfer (the prefill
// stops itself after 32 KiB, the cut is made, it resumes into the cut): the prefill gives up
// within the reservation's lease, the gateway releases that reservation and retries on the
// other prefill with a fresh one, and the client gets its full answer.
TEST_F(NetnsTest, AKvLinkCutMidTransferIsRetriedOnTheOtherPrefill) {
  auto cluster = StartCluster({kStallsMidTransfer, {}}, {{"--lease_ms=3000"}, {"--lease_ms=3000"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const Service& cut_prefill = cluster->prefill[0];
  Outcome out;
  std::jthread client;
  ASSERT_TRUE(StreamUntilStalled(*cluster, kPrompts[2], 48, &out, &client));
  const Service* target = nullptr;
  for (const Service& d : cluster->decode) {
    if (d.UsedBlocks() > 0) target = &d;
  }
  ASSERT_NE(target, nullptr) << "no decode instance holds the reservation";
  ASSERT_TRUE(net_->Cut(cut_prefill.host, target->host).ok());
  const util::Instant cut = util::Instant::Now();
  ASSERT_EQ(kill(cut_prefill.pid, SIGCONT), 0);
  client.join();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.tokens, Reference(kPrompts[2], 48));
  Timing("kv link cut", "answer complete after the cut", out.done - cut);
  EXPECT_LT(out.done - cut, absl::Seconds(3 + 4));  // the lease, then a prefill elsewhere
  EXPECT_GE(cluster->gateway.Metric("tandem_gateway_prefill_retries_total"), 1);
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return cut_prefill.Metric("tandem_kv_transfer_failures_total") >= 1; },
      absl::Seconds(10)));
  EXPECT_EQ(WaitAllFree(*cluster, absl::Seconds(10)), "");
  Timing("kv link cut", "everything free after the cut", util::Since(cut));
}

// A prefill host unreachable while it holds a prompt (stopped mid-transfer, cut off, resumed):
// the gateway abandons the attempt once the host has failed two health checks, long before the
// reservation's 30 s lease, and retries on the other prefill; the client gets its full answer.
TEST_F(NetnsTest, APrefillHostUnreachableMidPrefillIsAbandonedAndRetried) {
  auto cluster =
      StartCluster({kStallsMidTransfer, {}}, {{"--lease_ms=30000"}}, {"--health_interval_s=0.5"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const Service& away = cluster->prefill[0];
  Outcome out;
  std::jthread client;
  ASSERT_TRUE(StreamUntilStalled(*cluster, kPrompts[5], 48, &out, &client));
  ASSERT_TRUE(net_->Disconnect(away.host).ok());
  const util::Instant cut = util::Instant::Now();
  ASSERT_EQ(kill(away.pid, SIGCONT), 0);
  client.join();
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.tokens, Reference(kPrompts[5], 48));
  Timing("prefill host unreachable mid-prefill", "answer complete after the cut", out.done - cut);
  EXPECT_LT(out.done - cut, absl::Seconds(5));  // two health checks, then a prefill elsewhere
  EXPECT_GE(cluster->gateway.Metric("tandem_gateway_prefill_retries_total"), 1);

  ASSERT_TRUE(net_->Reconnect(away.host).ok());
  const util::Instant back = util::Instant::Now();
  EXPECT_EQ(WaitAllFree(*cluster, absl::Seconds(40)), "");
  Timing("prefill host unreachable mid-prefill", "everything free after the link is back",
         util::Since(back));
}

// A decode host unreachable in the middle of a stream (its link down; the process runs on):
// that stream ends with UNAVAILABLE within the gateway's idle timeout, a stream on the other
// decode host goes on to its full answer, and once the link is back the unreachable host holds
// nothing.
TEST_F(NetnsTest, ADecodeHostUnreachableMidStreamEndsOnlyItsStreams) {
  auto cluster = StartCluster({{}, {}}, {{"--heartbeat_ms=300"}, {"--heartbeat_ms=300"}},
                              {"--stream_idle_timeout_s=2"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  constexpr int kTokens = 480;  // the tiny model's context is 512
  std::atomic<int> a_tokens{0}, b_tokens{0};
  Outcome a, b;
  std::jthread stream_a(
      [&] { a = Stream(cluster->gateway, kPrompts[1], kTokens, [&](int n) { a_tokens = n; }); });
  ASSERT_TRUE(testing::WaitUntil([&] { return a_tokens >= 3; }, absl::Seconds(20)));
  int lost = -1;
  for (int i = 0; i < 2; ++i) {
    if (cluster->decode[i].Running() > 0) lost = i;
  }
  ASSERT_GE(lost, 0);
  const Service& unreachable = cluster->decode[lost];
  const Service& other = cluster->decode[1 - lost];
  // The gateway sends the next stream to the decode instance with the most free blocks.
  std::jthread stream_b(
      [&] { b = Stream(cluster->gateway, kPrompts[3], 400, [&](int n) { b_tokens = n; }); });
  ASSERT_TRUE(testing::WaitUntil([&] { return b_tokens >= 3; }, absl::Seconds(20)));
  ASSERT_GT(other.Running(), 0) << "the second stream is not on the other decode host";

  ASSERT_TRUE(net_->Disconnect(unreachable.host).ok());
  const util::Instant cut = util::Instant::Now();
  const int a_at_cut = a_tokens, b_at_cut = b_tokens;
  std::cout << "tokens at the cut: " << a_at_cut << " and " << b_at_cut << std::endl;
  stream_a.join();
  EXPECT_EQ(a.status.code(), absl::StatusCode::kUnavailable) << a.status;
  EXPECT_THAT(std::string(a.status.message()), HasSubstr("sent nothing"));
  EXPECT_LT(a.tokens.size(), static_cast<size_t>(kTokens));
  Timing("decode host unreachable", "its stream's error after the cut", a.done - cut);
  EXPECT_LT(a.done - cut, absl::Seconds(2 + 2));  // the idle timeout, and a margin
  stream_b.join();
  ASSERT_TRUE(b.status.ok()) << b.status;
  EXPECT_LT(b_at_cut, 400) << "the other stream had ended before the cut";
  EXPECT_EQ(b.tokens, Reference(kPrompts[3], 400));

  ASSERT_TRUE(net_->Reconnect(unreachable.host).ok());
  const util::Instant back = util::Instant::Now();
  EXPECT_EQ(WaitAllFree(*cluster, absl::Seconds(20)), "");
  Timing("decode host unreachable", "everything free after the link is back", util::Since(back));
  Outcome after = Stream(cluster->gateway, kPrompts[0], 16);
  EXPECT_TRUE(after.status.ok()) << after.status;
  EXPECT_EQ(after.tokens, Reference(kPrompts[0], 16));
}

// A prefill host unreachable while idle: the gateway marks it unhealthy within its health-check
// period and sends it nothing meanwhile (requests run on the other, at their usual speed); back,
// it is healthy again within a period and gets prompts again.
TEST_F(NetnsTest, APrefillHostUnreachableWhileIdleIsSkippedThenUsedAgain) {
  auto cluster = StartCluster({{}, {}}, {{}}, {"--health_interval_s=0.5"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const Service& gateway = cluster->gateway;
  auto healthy_prefill = [&] {
    return gateway.Metric("tandem_gateway_healthy_instances", "kind=\"prefill\"");
  };
  ASSERT_TRUE(testing::WaitUntil([&] { return healthy_prefill() == 2; }, absl::Seconds(10)));
  const Service& away = cluster->prefill[1];
  const double prompts_before = away.Metric("tandem_prefill_tokens_total");
  ASSERT_GE(prompts_before, 0);

  ASSERT_TRUE(net_->Disconnect(away.host).ok());
  const util::Instant cut = util::Instant::Now();
  ASSERT_TRUE(testing::WaitUntil([&] { return healthy_prefill() == 1; }, absl::Seconds(10)));
  Timing("prefill host unreachable", "marked unhealthy after the cut", util::Since(cut));
  EXPECT_LT(util::Since(cut),
            absl::Seconds(2));  // a round's deadline, then the next round
  // The unreachable host costs the other instances nothing: they answer within the same round.
  absl::SleepFor(absl::Seconds(1));  // two more rounds
  EXPECT_EQ(healthy_prefill(), 1);
  EXPECT_EQ(gateway.Metric("tandem_gateway_healthy_instances", "kind=\"decode\""), 1);
  for (int i = 0; i < 4; ++i) {
    const util::Instant start = util::Instant::Now();
    Outcome out = Stream(gateway, kPrompts[4 + i], 16);
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(out.tokens, Reference(kPrompts[4 + i], 16));
    EXPECT_LT(out.done - start, absl::Seconds(5)) << "a request waited on the unreachable host";
  }

  ASSERT_TRUE(net_->Reconnect(away.host).ok());
  const util::Instant back = util::Instant::Now();
  ASSERT_TRUE(testing::WaitUntil([&] { return healthy_prefill() == 2; }, absl::Seconds(10)));
  Timing("prefill host unreachable", "healthy again after the link is back", util::Since(back));
  EXPECT_LT(util::Since(back), absl::Seconds(3));
  EXPECT_EQ(away.Metric("tandem_prefill_tokens_total"), prompts_before)
      << "a prompt reached the host while it was unreachable";
  // Fresh prompts cost the same everywhere: the gateway's rotation reaches it again.
  for (int i = 0; i < 4 && away.Metric("tandem_prefill_tokens_total") == prompts_before; ++i) {
    Outcome out = Stream(gateway, kPrompts[i], 8);
    ASSERT_TRUE(out.status.ok()) << out.status;
  }
  EXPECT_GT(away.Metric("tandem_prefill_tokens_total"), prompts_before);
  EXPECT_EQ(WaitAllFree(*cluster, absl::Seconds(10)), "");
}

// The gateway killed while streams are open, then started again on the same host and ports:
// every client hears a clean error at once, the instances free everything, and the new
// gateway serves.
TEST_F(NetnsTest, AGatewayRestartedWhileStreamsAreOpen) {
  auto cluster = StartCluster({{}}, {{}, {}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::atomic<int> tokens[2] = {0, 0};
  Outcome outs[2];
  std::vector<std::jthread> streams;
  for (int i = 0; i < 2; ++i) {
    streams.emplace_back([&, i] {
      outs[i] = Stream(cluster->gateway, kPrompts[i], 480, [&, i](int n) { tokens[i] = n; });
    });
  }
  ASSERT_TRUE(
      testing::WaitUntil([&] { return tokens[0] >= 3 && tokens[1] >= 3; }, absl::Seconds(20)));
  ASSERT_EQ(kill(cluster->gateway.pid, SIGKILL), 0);
  const util::Instant killed = util::Instant::Now();
  for (int i = 0; i < 2; ++i) {
    streams[i].join();
    EXPECT_EQ(outs[i].status.code(), absl::StatusCode::kUnavailable) << outs[i].status;
    EXPECT_LT(outs[i].done - killed, absl::Seconds(2));
    Timing("gateway restarted", "a client's error after the kill", outs[i].done - killed);
  }
  EXPECT_EQ(WaitAllFree(*cluster, absl::Seconds(10)), "");
  Timing("gateway restarted", "everything free after the kill", util::Since(killed));

  std::vector<std::string> flags = VirtualNetwork::ListenFlags(cluster->gateway.host, false);
  flags.push_back(absl::StrCat("--grpc_port=", cluster->gateway.ports.grpc_port));
  flags.push_back(absl::StrCat("--http_port=", cluster->gateway.ports.http_port));
  flags.insert(flags.end(), gateway_flags_.begin(), gateway_flags_.end());
  auto restarted = set_->Start("tandem-gateway", flags, net_->Launcher(cluster->gateway.host));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  Outcome after = Stream(cluster->gateway, kPrompts[2], 16);
  ASSERT_TRUE(after.status.ok()) << after.status;
  EXPECT_EQ(after.tokens, Reference(kPrompts[2], 16));
  Timing("gateway restarted", "serving again after the kill", after.done - killed);
}

// The path between the only prefill and the only decode host cut, then healed: requests fail
// cleanly during the cut (with a reason, within their lease: nowhere else to go) and succeed
// after it; nothing leaks.
TEST_F(NetnsTest, ACutBetweenPrefillAndDecodeFailsCleanlyAndHeals) {
  auto cluster = StartCluster({{}}, {{"--lease_ms=3000"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<int32_t> reference = Reference(kPrompts[0], 16);
  Outcome before = Stream(cluster->gateway, kPrompts[0], 16);
  ASSERT_TRUE(before.status.ok()) << before.status;
  EXPECT_EQ(before.tokens, reference);

  ASSERT_TRUE(net_->Cut(cluster->prefill[0].host, cluster->decode[0].host).ok());
  const util::Instant cut = util::Instant::Now();
  Outcome during = Stream(cluster->gateway, kPrompts[0], 16);
  EXPECT_FALSE(during.status.ok());
  Timing("prefill-decode path cut", "the client's error after the cut", during.done - cut);
  EXPECT_LT(during.done - cut, absl::Seconds(3 + 2)) << during.status;
  EXPECT_TRUE(during.tokens.empty());
  EXPECT_THAT(std::string(during.status.message()), HasSubstr("prefill")) << during.status;
  EXPECT_EQ(WaitAllFree(*cluster, absl::Seconds(10)), "");

  ASSERT_TRUE(net_->Heal(cluster->prefill[0].host, cluster->decode[0].host).ok());
  const util::Instant healed = util::Instant::Now();
  Outcome after;
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        after = Stream(cluster->gateway, kPrompts[0], 16);
        return after.status.ok();
      },
      absl::Seconds(30)))
      << after.status;
  Timing("prefill-decode path cut", "serving again after the heal", util::Since(healed));
  EXPECT_EQ(after.tokens, reference);
  EXPECT_EQ(WaitAllFree(*cluster, absl::Seconds(10)), "");
}

}  // namespace
}  // namespace tandem
