// The KV stream's layout and decode's inboxes: bytes land in the right blocks whatever block
// ids either side uses; each byte once, inside the reservation's stream, while it is open;
// commits tell complete from incomplete.
#include "common/kv/inbox.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/kv/kv_stream.h"
#include "tests/common/kv/kv_test_util.h"

namespace tandem::kv {
namespace {

using testing::BlockChecksums;
using ::testing::HasSubstr;
using testing::Pool;

TEST(KvStreamTest, ReadThenWriteMovesBlocksBetweenDifferentIds) {
  auto src = Pool(64), dst = Pool(48);
  testing::Randomize(*src, 1);
  std::vector<int32_t> from, to;
  testing::PromptBlocks(&from, &to);
  auto in = KvStream::Of(src.get(), from);
  auto out = KvStream::Of(dst.get(), to);
  ASSERT_TRUE(in.ok() && out.ok());
  ASSERT_EQ(in->size(), out->size());
  EXPECT_EQ(in->size(), KvStream::BytesFor(src->config(), 38));
  // Odd-sized pieces that straddle blocks, layers and K/V.
  std::vector<char> buffer;
  for (uint64_t offset = 0; offset < in->size();) {
    const uint64_t n = std::min<uint64_t>(in->size() - offset, 12345);
    buffer.resize(n);
    ASSERT_TRUE(in->Read(offset, absl::MakeSpan(buffer)).ok());
    ASSERT_TRUE(out->Write(offset, {buffer.data(), buffer.size()}).ok());
    offset += n;
  }
  EXPECT_EQ(BlockChecksums(*dst, to), BlockChecksums(*src, from));
  EXPECT_EQ(in->Read(in->size() - 1, absl::MakeSpan(buffer.data(), 2)).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(KvStream::Of(src.get(), {64}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvStream::Of(src.get(), {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvStreamTest, ARecurrentModelsStateSlotFollowsItsBlocks) {
  engine::KvCacheConfig config{2, 2, 32, 16, 16, kernels::KvDtype::kF32};
  config.state_bytes = 1000;  // not a multiple of anything the blocks use
  config.num_state_slots = 3;
  auto src = *engine::KvBlockPool::Create(config), dst = *engine::KvBlockPool::Create(config);
  testing::Randomize(*src, 3);
  const std::vector<int32_t> from = {4, 9, 1}, to = {0, 15, 7};
  auto in = KvStream::Of(src.get(), from, /*state_slot=*/2);
  auto out = KvStream::Of(dst.get(), to, /*state_slot=*/0);
  ASSERT_TRUE(in.ok() && out.ok());
  EXPECT_EQ(in->size(), KvStream::BytesFor(config, 3));
  EXPECT_EQ(in->size(), 3 * 2 * 2 * src->block_bytes() + 1000);
  std::vector<char> buffer;
  for (uint64_t offset = 0; offset < in->size();) {  // pieces straddling blocks and the state
    const uint64_t n = std::min<uint64_t>(in->size() - offset, 777);
    buffer.resize(n);
    ASSERT_TRUE(in->Read(offset, absl::MakeSpan(buffer)).ok());
    ASSERT_TRUE(out->Write(offset, {buffer.data(), buffer.size()}).ok());
    offset += n;
  }
  EXPECT_EQ(BlockChecksums(*dst, to), BlockChecksums(*src, from));
  EXPECT_EQ(std::memcmp(dst->state(0), src->state(2), 1000), 0);
  // A stream of a pool that keeps state needs the slot, and only such a pool takes one.
  EXPECT_THAT(KvStream::Of(src.get(), from).status().message(), HasSubstr("state slot"));
  EXPECT_EQ(KvStream::Of(src.get(), from, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvStream::Of(Pool(8).get(), {1}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class KvInboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = Pool(8);
    dst_ = Pool(8);
    testing::Randomize(*src_, 2);
    auto stream = KvStream::Of(src_.get(), {1, 2, 3});
    ASSERT_TRUE(stream.ok());
    bytes_.resize(stream->size());
    ASSERT_TRUE(stream->Read(0, absl::MakeSpan(bytes_)).ok());
    untouched_ = BlockChecksums(*dst_, {0, 1, 2, 3, 4, 5, 6, 7});
  }
  std::string_view Bytes(uint64_t offset, uint64_t n) const {
    return {bytes_.data() + offset, static_cast<size_t>(n)};
  }

  std::unique_ptr<engine::KvBlockPool> src_, dst_;
  std::vector<char> bytes_;
  std::vector<uint64_t> untouched_;
};

TEST_F(KvInboxTest, AStreamSentInAnyOrderLandsAndCommits) {
  KvInbox inbox(dst_.get());
  auto token = inbox.Open({5, 0, 7});
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->size(), kTokenBytes);
  const uint64_t n = bytes_.size(), half = n / 2 + 3;
  EXPECT_EQ(inbox.CheckComplete(*token).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(inbox.Write(*token, half, Bytes(half, n - half)).ok());
  EXPECT_EQ(inbox.Commit(*token, n).code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(inbox.Write(*token, 0, Bytes(0, half)).ok());
  EXPECT_EQ(inbox.Commit(*token, n - 1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(inbox.Commit(*token, n).ok());
  EXPECT_TRUE(inbox.CheckComplete(*token).ok());
  EXPECT_EQ(BlockChecksums(*dst_, {5, 0, 7}), BlockChecksums(*src_, {1, 2, 3}));
  // Complete: nothing more is taken.
  EXPECT_EQ(inbox.Write(*token, 0, Bytes(0, 8)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(inbox.Close(*token));
  EXPECT_FALSE(inbox.Close(*token));
  EXPECT_EQ(inbox.num_open(), 0);
}

TEST_F(KvInboxTest, EachByteOnceAndOnlyInsideTheStream) {
  KvInbox inbox(dst_.get());
  auto token = inbox.Open({4});
  ASSERT_TRUE(token.ok());
  const uint64_t n = KvStream::BytesFor(dst_->config(), 1);
  ASSERT_TRUE(inbox.Write(*token, 100, Bytes(100, 50)).ok());
  EXPECT_EQ(inbox.Write(*token, 120, Bytes(120, 10)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(inbox.Write(*token, 90, Bytes(90, 20)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(inbox.Write(*token, 149, Bytes(149, 2)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(inbox.Write(*token, 150, Bytes(150, 2)).ok());  // adjacent: fine
  EXPECT_EQ(inbox.Write(*token, n - 4, Bytes(0, 8)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(inbox.Write(*token, ~uint64_t{0} - 2, Bytes(0, 8)).code(),
            absl::StatusCode::kOutOfRange);
  // Duplicates do not count twice towards completion.
  EXPECT_EQ(inbox.Commit(*token, n).code(), absl::StatusCode::kDataLoss);
}

TEST_F(KvInboxTest, NothingLandsUnderAnUnknownOrClosedToken) {
  KvInbox inbox(dst_.get());
  auto token = inbox.Open({1, 2, 3});
  ASSERT_TRUE(token.ok());
  ASSERT_TRUE(inbox.Close(*token));
  // A late writer, and one that guesses.
  EXPECT_EQ(inbox.Write(*token, 0, Bytes(0, bytes_.size())).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(inbox.Write(std::string(kTokenBytes, 'x'), 0, Bytes(0, 64)).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(inbox.Commit(*token, bytes_.size()).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(inbox.Commit(*token, 1).message()), HasSubstr("ended"));
  EXPECT_EQ(BlockChecksums(*dst_, {0, 1, 2, 3, 4, 5, 6, 7}), untouched_);
}

TEST_F(KvInboxTest, TokensAreDistinctAndBlocksMustExist) {
  KvInbox inbox(dst_.get());
  auto a = inbox.Open({1});
  auto b = inbox.Open({1});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(inbox.Open({8}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(inbox.num_open(), 2);
}

}  // namespace
}  // namespace tandem::kv
