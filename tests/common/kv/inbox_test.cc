// The KV stream's layout and decode's inboxes: bytes land in the right blocks whatever block
// ids either side uses; each byte once, inside the reservation's stream, while it is open;
// commits tell complete from incomplete.
#include "common/kv/inbox.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/kv/kv_stream.h"
#include "tests/common/kv/kv_test_util.h"

namespace tandem::kv {
namespace {

using testing::BlockChecksums;
using ::testing::HasSubstr;
using testing::Pool;

// Moves `in` into `out` in pieces of `piece` bytes (odd sizes straddle blocks, layers, K/V and
// the state).
void Transfer(const KvStream& in, const KvStream& out, uint64_t piece) {
  std::vector<char> buffer;
  for (uint64_t offset = 0; offset < in.size();) {
    const uint64_t n = std::min<uint64_t>(in.size() - offset, piece);
    buffer.resize(n);
    ASSERT_TRUE(in.Read(offset, absl::MakeSpan(buffer)).ok());
    ASSERT_TRUE(out.Write(offset, {buffer.data(), buffer.size()}).ok());
    offset += n;
  }
}

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
  ASSERT_NO_FATAL_FAILURE(Transfer(*in, *out, 12345));
  EXPECT_EQ(BlockChecksums(*dst, to), BlockChecksums(*src, from));
  std::vector<char> buffer(2);
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
  ASSERT_NO_FATAL_FAILURE(Transfer(*in, *out, 777));
  EXPECT_EQ(BlockChecksums(*dst, to), BlockChecksums(*src, from));
  EXPECT_EQ(std::memcmp(dst->state(0), src->state(2), 1000), 0);
  // A stream of a pool that keeps state needs the slot, and only such a pool takes one.
  EXPECT_THAT(KvStream::Of(src.get(), from).status().message(), HasSubstr("state slot"));
  EXPECT_EQ(KvStream::Of(src.get(), from, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvStream::Of(Pool(8).get(), {1}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Window rings in the state slot: a stream carries the recurrent part whole and of each ring
// only the blocks a sequence of its blocks can have written (the first min(ring, blocks) of K
// and of V), landing where the same ring blocks are on the other side; the rest is untouched.
// The second ring's layer has a geometry of its own (one KV head rather than two: Gemma 4's
// sliding layers beside its global ones).
TEST(KvStreamTest, WindowRingsShipOnlyTheirWrittenBlocks) {
  engine::KvCacheConfig config{1, 2, 32, 16, 16, kernels::KvDtype::kF32};
  const int64_t block = static_cast<int64_t>(
      kernels::KvBlockBytes(config.dtype, config.block_size, config.num_kv_heads, config.head_dim));
  const int64_t half = static_cast<int64_t>(
      kernels::KvBlockBytes(config.dtype, config.block_size, 1, config.head_dim));
  // After 128 bytes of recurrent state.
  config.rings = {{128, 4, block}, {128 + 8 * block, 4, half}};
  config.state_bytes = 128 + 8 * block + 8 * half;
  config.num_state_slots = 2;
  auto src = *engine::KvBlockPool::Create(config), dst = *engine::KvBlockPool::Create(config);
  testing::Randomize(*src, 5);
  for (int64_t i = 0; i < config.state_bytes; ++i) {
    src->state(1)[i] = static_cast<std::byte>(i * 7 + 3);
    dst->state(0)[i] = std::byte{0xEE};
  }
  for (const int blocks : {1, 3, 6}) {
    std::vector<int32_t> from(blocks), to(blocks);
    for (int b = 0; b < blocks; ++b) from[b] = b, to[b] = 15 - b;
    auto in = KvStream::Of(src.get(), from, /*state_slot=*/1);
    auto out = KvStream::Of(dst.get(), to, /*state_slot=*/0);
    ASSERT_TRUE(in.ok() && out.ok());
    const int live = std::min(blocks, 4);
    EXPECT_EQ(in->size(),
              static_cast<uint64_t>(blocks * 2 * block + 128 + 2 * live * (block + half)))
        << blocks;
    EXPECT_EQ(in->size(), KvStream::BytesFor(config, blocks));
    ASSERT_NO_FATAL_FAILURE(Transfer(*in, *out, 1000));
    EXPECT_EQ(BlockChecksums(*dst, to), BlockChecksums(*src, from));
    // Byte i of the slot arrived iff it is in the recurrent part or a live ring block.
    for (int64_t i = 0; i < config.state_bytes; ++i) {
      bool shipped = i < 128;
      for (const engine::KvCacheConfig::Ring& ring : config.rings) {
        for (int v = 0; v < 2; ++v) {
          const int64_t begin = ring.offset + v * ring.blocks * ring.block_bytes;
          shipped |= i >= begin && i < begin + live * ring.block_bytes;
        }
      }
      if (shipped) {
        ASSERT_EQ(dst->state(0)[i], src->state(1)[i]) << blocks << " byte " << i;
      } else if (blocks == 1) {  // nothing has landed there yet
        ASSERT_EQ(dst->state(0)[i], std::byte{0xEE}) << "byte " << i;
      }
    }
  }
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
