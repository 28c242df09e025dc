// KV through the in-process transport into decode's inbox: a prompt spanning many blocks lands
// intact in a scattered set of blocks; what the receiver refuses is the sender's error; a
// reservation that ended gets nothing.
#include "common/kv/inproc_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/kv/inbox.h"
#include "common/kv/kv_stream.h"
#include "common/util/clock.h"
#include "tests/common/kv/kv_test_util.h"

namespace tandem::kv {
namespace {

using testing::BlockChecksums;
using ::testing::HasSubstr;

class InProcessTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto p = InProcessTransport::Create(fabric_, "prefill-0", 1000);
    auto d = InProcessTransport::Create(fabric_, "decode-0");
    ASSERT_TRUE(p.ok() && d.ok());
    prefill_ = *std::move(p);
    decode_ = *std::move(d);
    ASSERT_TRUE(decode_->SetReceiver(&inbox_).ok());
    testing::Randomize(*src_, 3);
  }
  absl::Status Send(const std::string& token, const KvStream& stream) {
    auto id = prefill_->PostSend(
        decode_->self(), token, stream.size(),
        [&](uint64_t offset, absl::Span<char> out) { return stream.Read(offset, out); });
    if (!id.ok()) return id.status();
    absl::Status status = WaitForTransfer(*prefill_, *id, util::Instant::Now() + absl::Seconds(5));
    prefill_->Release(*id);
    return status;
  }

  std::shared_ptr<InProcessFabric> fabric_ = std::make_shared<InProcessFabric>();
  std::unique_ptr<engine::KvBlockPool> src_ = testing::Pool(64), dst_ = testing::Pool(48);
  KvInbox inbox_{dst_.get()};
  std::unique_ptr<InProcessTransport> prefill_, decode_;
};

TEST_F(InProcessTransportTest, ManyBlocksIntoScatteredBlocksArriveIntact) {
  std::vector<int32_t> from, to;
  testing::PromptBlocks(&from, &to);
  const auto others = BlockChecksums(*dst_, testing::OtherBlocks(*dst_, to));
  auto token = inbox_.Open(to);
  auto stream = KvStream::Of(src_.get(), from);
  ASSERT_TRUE(token.ok() && stream.ok());
  ASSERT_EQ(Send(*token, *stream), absl::OkStatus());
  EXPECT_TRUE(inbox_.CheckComplete(*token).ok());
  EXPECT_EQ(BlockChecksums(*dst_, to), BlockChecksums(*src_, from));
  EXPECT_EQ(BlockChecksums(*dst_, testing::OtherBlocks(*dst_, to)), others);
}

TEST_F(InProcessTransportTest, AnEndedReservationGetsNothingAndTheSenderIsTold) {
  auto token = inbox_.Open({3, 4});
  auto stream = KvStream::Of(src_.get(), {10, 11});
  ASSERT_TRUE(token.ok() && stream.ok());
  const auto before = BlockChecksums(*dst_, {3, 4});
  inbox_.Close(*token);
  const absl::Status status = Send(*token, *stream);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("ended"));
  EXPECT_EQ(BlockChecksums(*dst_, {3, 4}), before);
}

TEST_F(InProcessTransportTest, ABadFillOrTheWrongSizeFails) {
  auto token = inbox_.Open({3});
  ASSERT_TRUE(token.ok());
  auto id = prefill_->PostSend(decode_->self(), *token, 100, [](uint64_t, absl::Span<char>) {
    return absl::DataLossError("disk on fire");
  });
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(prefill_->Poll(*id).status().code(), absl::StatusCode::kDataLoss);
  prefill_->Release(*id);
  auto stream = KvStream::Of(src_.get(), {1, 2});  // two blocks for a one-block reservation
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ(Send(*token, *stream).code(), absl::StatusCode::kInvalidArgument);  // the commit
}

TEST_F(InProcessTransportTest, UnknownAgentsAndTransfersAreErrors) {
  auto id = prefill_->PostSend({"nobody", ""}, std::string(kTokenBytes, 'x'), 10,
                               [](uint64_t, absl::Span<char>) { return absl::OkStatus(); });
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(prefill_->Poll(TransferId{77}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(InProcessTransport::Create(fabric_, "decode-0").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(InProcessTransport::Create(fabric_, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(decode_->SetReceiver(nullptr).ok());
  auto stream = KvStream::Of(src_.get(), {1});
  EXPECT_EQ(Send(std::string(kTokenBytes, 'x'), *stream).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::kv
