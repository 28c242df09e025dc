// KV over real UCX active messages between agents on loopback, over TCP and over shared
// memory, into decode's inbox: a prompt spanning many blocks lands intact in a scattered set
// of blocks, streams larger than the send window are reassembled, a reservation that ended
// gets nothing, `fill` never runs after Release, shared memory really carries the bytes when
// asked to, and a dead peer or a bad target is an error within a deadline, never a hang. Also
// across processes.
#include "common/kv/ucx_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "common/kv/inbox.h"
#include "common/kv/kv_stream.h"
#include "common/util/clock.h"
#include "nlohmann/json.hpp"
#include "tests/common/kv/kv_test_util.h"
#include "tests/testing/subprocess.h"

namespace tandem::kv {
namespace {

using testing::BlockChecksums;
using ::testing::HasSubstr;

struct Mode {
  const char* name;
  const char* transports;
  bool detect_dead_peers;
  bool shared_memory;  // the bytes must travel through shared memory
};

std::string ModeName(const ::testing::TestParamInfo<Mode>& info) { return info.param.name; }

// Whether UCX's description of an endpoint has a shared-memory lane (posix, sysv, cma, knem,
// xpmem) for active messages.
bool HasSharedMemoryLane(const std::string& description) {
  for (const char* tl : {"posix/", "sysv/", "cma/", "knem/", "xpmem/"}) {
    if (absl::StrContains(description, tl)) return true;
  }
  return false;
}

class UcxTransportTest : public ::testing::TestWithParam<Mode> {
 protected:
  std::unique_ptr<UcxTransport> Make(size_t chunk = size_t{256} << 10, int window = 16) {
    UcxTransportOptions options;
    options.transports = GetParam().transports;
    options.detect_dead_peers = GetParam().detect_dead_peers;
    options.chunk_bytes = chunk;
    options.window = window;
    auto t = UcxTransport::Create(options);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }
  // Sends `stream` to `token` at `to`; the transfer's outcome.
  static absl::Status Send(UcxTransport& from, const KvPeer& to, const std::string& token,
                           const KvStream& stream) {
    auto id = from.PostSend(to, token, stream.size(), [&](uint64_t offset, absl::Span<char> out) {
      return stream.Read(offset, out);
    });
    if (!id.ok()) return id.status();
    absl::Status status = WaitForTransfer(from, *id, util::Instant::Now() + absl::Seconds(30));
    from.Release(*id);
    return status;
  }
};

TEST_P(UcxTransportTest, ManyBlocksIntoScatteredBlocksArriveIntact) {
  auto prefill = Make(/*chunk=*/5000, /*window=*/3), decode = Make();
  ASSERT_TRUE(prefill && decode);
  EXPECT_NE(prefill->self().agent, decode->self().agent);
  auto src = testing::Pool(80, 4, 64), dst = testing::Pool(64, 4, 64);
  testing::Randomize(*src, 11);
  KvInbox inbox(dst.get());
  ASSERT_TRUE(decode->SetReceiver(&inbox).ok());
  std::vector<int32_t> from, to;
  testing::PromptBlocks(&from, &to);
  const auto others = BlockChecksums(*dst, testing::OtherBlocks(*dst, to));
  auto token = inbox.Open(to);
  auto stream = KvStream::Of(src.get(), from);
  ASSERT_TRUE(token.ok() && stream.ok());
  ASSERT_EQ(Send(*prefill, decode->self(), *token, *stream), absl::OkStatus());
  EXPECT_TRUE(inbox.CheckComplete(*token).ok());
  EXPECT_EQ(BlockChecksums(*dst, to), BlockChecksums(*src, from));
  EXPECT_EQ(BlockChecksums(*dst, testing::OtherBlocks(*dst, to)), others);

  auto lanes = prefill->DescribePeer(decode->self().agent);
  ASSERT_TRUE(lanes.ok()) << lanes.status();
  if (GetParam().shared_memory) {
    EXPECT_TRUE(HasSharedMemoryLane(*lanes)) << "no shared-memory lane:\n" << *lanes;
  } else {
    EXPECT_FALSE(HasSharedMemoryLane(*lanes)) << *lanes;
  }
  ASSERT_TRUE(decode->SetReceiver(nullptr).ok());
}

// A 9 MiB stream in 64 KiB messages, at most 4 in flight.
TEST_P(UcxTransportTest, StreamsLargerThanTheWindowAreReassembled) {
  auto prefill = Make(/*chunk=*/64 << 10, /*window=*/4), decode = Make();
  ASSERT_TRUE(prefill && decode);
  // 4 layers, 2 heads of 64, blocks of 16 tokens: 8 KiB a piece, 64 KiB a block over all.
  auto src = testing::Pool(160, 4, 64), dst = testing::Pool(160, 4, 64);
  testing::Randomize(*src, 12);
  KvInbox inbox(dst.get());
  ASSERT_TRUE(decode->SetReceiver(&inbox).ok());
  std::vector<int32_t> blocks;
  for (int b = 159; b >= 16; --b) blocks.push_back(b);
  auto token = inbox.Open(blocks);
  auto stream = KvStream::Of(src.get(), blocks);
  ASSERT_TRUE(token.ok() && stream.ok());
  EXPECT_GE(stream->size(), uint64_t{9} << 20);
  ASSERT_EQ(Send(*prefill, decode->self(), *token, *stream), absl::OkStatus());
  EXPECT_EQ(BlockChecksums(*dst, blocks), BlockChecksums(*src, blocks));
  ASSERT_TRUE(decode->SetReceiver(nullptr).ok());
}

// The reservation ended before its KV came (a stalled prefill): nothing lands, and the sender
// hears why.
TEST_P(UcxTransportTest, AReservationThatEndedGetsNothing) {
  auto prefill = Make(), decode = Make();
  ASSERT_TRUE(prefill && decode);
  auto src = testing::Pool(8), dst = testing::Pool(8);
  testing::Randomize(*src, 13);
  KvInbox inbox(dst.get());
  ASSERT_TRUE(decode->SetReceiver(&inbox).ok());
  auto token = inbox.Open({1, 2});
  auto stream = KvStream::Of(src.get(), {3, 4});
  ASSERT_TRUE(token.ok() && stream.ok());
  const auto before = BlockChecksums(*dst, {0, 1, 2, 3, 4, 5, 6, 7});
  ASSERT_TRUE(inbox.Close(*token));
  const absl::Status status = Send(*prefill, decode->self(), *token, *stream);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("refused the KV"));
  EXPECT_EQ(BlockChecksums(*dst, {0, 1, 2, 3, 4, 5, 6, 7}), before);
  // A receiver that takes nothing says so.
  ASSERT_TRUE(decode->SetReceiver(nullptr).ok());
  EXPECT_EQ(Send(*prefill, decode->self(), *token, *stream).code(), absl::StatusCode::kUnavailable);
}

TEST_P(UcxTransportTest, FillNeverRunsAfterRelease) {
  auto prefill = Make(/*chunk=*/4096, /*window=*/1), decode = Make();
  ASSERT_TRUE(prefill && decode);
  auto dst = testing::Pool(200);
  KvInbox inbox(dst.get());
  ASSERT_TRUE(decode->SetReceiver(&inbox).ok());
  auto token = inbox.Open(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  ASSERT_TRUE(token.ok());
  auto fills = std::make_shared<std::atomic<int>>(0);
  auto id = prefill->PostSend(decode->self(), *token, uint64_t{100} << 20,
                              [fills](uint64_t, absl::Span<char> out) {
                                fills->fetch_add(1);
                                std::fill(out.begin(), out.end(), 'x');
                                return absl::OkStatus();
                              });
  ASSERT_TRUE(id.ok()) << id.status();
  absl::SleepFor(absl::Milliseconds(20));
  prefill->Release(*id);
  const int at_release = fills->load();
  EXPECT_GE(at_release, 1);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(fills->load(), at_release);
  EXPECT_EQ(prefill->Poll(*id).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(decode->SetReceiver(nullptr).ok());
}

TEST_P(UcxTransportTest, BadTargetsAreClearErrors) {
  auto a = Make(), b = Make();
  ASSERT_TRUE(a && b);
  auto fill = [](uint64_t, absl::Span<char>) { return absl::OkStatus(); };
  EXPECT_EQ(a->PostSend(b->self(), "short", 10, fill).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto bad = a->PostSend({"not-an-address", ""}, std::string(kTokenBytes, 't'), 10, fill);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("host:port"));
  EXPECT_EQ(a->PostSend(b->self(), std::string(kTokenBytes, 't'), 0, fill).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Poll(TransferId{999}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a->DescribePeer("127.0.0.1:9").status().code(), absl::StatusCode::kNotFound);
}

// The peer goes away: sends to it fail (UNAVAILABLE when dead peers are detected) or run into
// their deadline; they never hang.
TEST_P(UcxTransportTest, DeadPeerIsAnErrorWithinTheDeadline) {
  auto a = Make(), b = Make();
  ASSERT_TRUE(a && b);
  auto src = testing::Pool(8), dst = testing::Pool(8);
  KvInbox inbox(dst.get());
  ASSERT_TRUE(b->SetReceiver(&inbox).ok());
  auto token = inbox.Open({1});
  auto stream = KvStream::Of(src.get(), {1});
  ASSERT_TRUE(token.ok() && stream.ok());
  ASSERT_EQ(Send(*a, b->self(), *token, *stream), absl::OkStatus());
  const KvPeer gone = b->self();
  b.reset();
  const util::Instant start = util::Instant::Now();
  absl::Status status;
  for (int attempt = 0; attempt < 10 && status.ok(); ++attempt) {
    auto id = a->PostSend(gone, *token, stream->size(), [&](uint64_t offset, absl::Span<char> out) {
      return stream->Read(offset, out);
    });
    status =
        id.ok() ? WaitForTransfer(*a, *id, util::Instant::Now() + absl::Seconds(2)) : id.status();
    if (id.ok()) a->Release(*id);
  }
  EXPECT_FALSE(status.ok()) << "sends to a dead peer kept succeeding";
  EXPECT_LT(util::Since(start), absl::Seconds(30));
  if (GetParam().detect_dead_peers) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  }
}

INSTANTIATE_TEST_SUITE_P(Loopback, UcxTransportTest,
                         ::testing::Values(Mode{"Tcp", "tcp", true, false},
                                           Mode{"SharedMemory", "sm,tcp", false, true}),
                         ModeName);

// A target without the receiver's worker address connects through its listener (UCX's sockaddr
// API) instead; over TCP that moves the same bytes. Listener endpoints that fail are dropped.
TEST(UcxListenerTest, TargetsWithoutAWorkerAddressConnectThroughTheListener) {
  UcxTransportOptions options;
  options.transports = "tcp";
  auto a = UcxTransport::Create(options);
  auto b = UcxTransport::Create(options);
  ASSERT_TRUE(a.ok() && b.ok());
  auto src = testing::Pool(8), dst = testing::Pool(8);
  testing::Randomize(*src, 14);
  KvInbox inbox(dst.get());
  ASSERT_TRUE((*b)->SetReceiver(&inbox).ok());
  auto token = inbox.Open({5, 6});
  auto stream = KvStream::Of(src.get(), {1, 2});
  ASSERT_TRUE(token.ok() && stream.ok());
  auto id = (*a)->PostSend(
      {(*b)->self().agent, ""}, *token, stream->size(),
      [&](uint64_t offset, absl::Span<char> out) { return stream->Read(offset, out); });
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(WaitForTransfer(**a, *id, util::Instant::Now() + absl::Seconds(20)), absl::OkStatus());
  (*a)->Release(*id);
  EXPECT_EQ(BlockChecksums(*dst, {5, 6}), BlockChecksums(*src, {1, 2}));
  EXPECT_EQ((*b)->num_accepted(), 1);
  a->reset();  // its endpoint fails at b, which drops it
  EXPECT_TRUE(
      ::tandem::testing::WaitUntil([&] { return (*b)->num_accepted() == 0; }, absl::Seconds(20)));
  ASSERT_TRUE((*b)->SetReceiver(nullptr).ok());
}

// The real shape: the receiver is another process. It opens an inbox and publishes where to
// send; this process sends a prompt's blocks; the receiver's own checksums of what landed
// must match ours. Over shared memory, the bytes must have gone through it.
struct CrossProcessMode {
  const char* name;
  const char* transports;
};

class UcxCrossProcessTest : public ::testing::TestWithParam<CrossProcessMode> {};

TEST_P(UcxCrossProcessTest, SendsIntoAnotherProcess) {
  const std::string transports = GetParam().transports;
  ::tandem::testing::TempDir dir;
  const std::string out = dir.path() + "/peer.json";
  auto peer = ::tandem::testing::Subprocess::Start(
      {KV_UCX_PEER, "--out", out, "--transports", transports}, dir.path() + "/peer.log");
  ASSERT_TRUE(peer.ok()) << peer.status();
  ASSERT_TRUE(
      ::tandem::testing::WaitUntil([&] { return std::filesystem::exists(out); }, absl::Seconds(30)))
      << "the peer never published its target";
  std::ifstream in(out);
  const auto published = nlohmann::json::parse(in);
  const KvPeer target{published["agent"].get<std::string>(),
                      absl::HexStringToBytes(published["address"].get<std::string>())};
  const std::string token = absl::HexStringToBytes(published["token"].get<std::string>());
  const auto to = published["blocks"].get<std::vector<int32_t>>();

  UcxTransportOptions options;
  options.transports = transports;
  options.detect_dead_peers = transports == "tcp";
  auto writer = UcxTransport::Create(options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  auto src = testing::Pool(64, 4, 64);
  testing::Randomize(*src, 5);
  const std::vector<int32_t> from = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 40, 41, 42};
  ASSERT_EQ(from.size(), to.size());
  auto stream = KvStream::Of(src.get(), from);
  ASSERT_TRUE(stream.ok());
  auto id = (*writer)->PostSend(
      target, token, stream->size(),
      [&](uint64_t offset, absl::Span<char> out) { return stream->Read(offset, out); });
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(WaitForTransfer(**writer, *id, util::Instant::Now() + absl::Seconds(20)),
            absl::OkStatus());
  (*writer)->Release(*id);
  auto lanes = (*writer)->DescribePeer(target.agent);
  ASSERT_TRUE(lanes.ok()) << lanes.status();
  EXPECT_EQ(HasSharedMemoryLane(*lanes), transports != "tcp") << *lanes;

  ASSERT_TRUE(::tandem::testing::WaitUntil([&] { return std::filesystem::exists(out + ".sums"); },
                                           absl::Seconds(30)));
  std::ifstream sums_in(out + ".sums");
  const auto theirs = nlohmann::json::parse(sums_in).get<std::vector<uint64_t>>();
  EXPECT_EQ(theirs, BlockChecksums(*src, from));
  ASSERT_TRUE(::tandem::testing::WaitUntil([&] { return !peer->Running(); }, absl::Seconds(10)));
  auto exit = peer->Stop(SIGTERM, absl::Seconds(10));
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0);
}

INSTANTIATE_TEST_SUITE_P(Loopback, UcxCrossProcessTest,
                         ::testing::Values(CrossProcessMode{"Tcp", "tcp"},
                                           CrossProcessMode{"SharedMemory", "sm,tcp"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tandem::kv
