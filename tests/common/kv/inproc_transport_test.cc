// KV blocks moved between two pools through the in-process transport: a prompt that spans many
// blocks, written into a non-contiguous set of destination blocks, arrives intact (checksums
// per layer, K and V) and touches nothing else; bad spans, unknown regions and deadlines are
// clear errors.
#include "common/kv/inproc_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "common/kv/block_spans.h"

namespace tandem::kv {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<engine::KvBlockPool> Pool(int num_blocks, int head_dim = 32) {
  auto pool = engine::KvBlockPool::Create({/*num_layers=*/3, /*num_kv_heads=*/2, head_dim,
                                           /*block_size=*/16, num_blocks});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *std::move(pool);
}

// FNV-1a over one block of one layer's K or V pool.
uint64_t Checksum(const engine::KvBlockPool& pool, int layer, int kv, int block) {
  const float* base = (kv == 0 ? pool.k_pool(layer) : pool.v_pool(layer)) +
                      static_cast<size_t>(block) * pool.block_floats();
  const auto* bytes = reinterpret_cast<const unsigned char*>(base);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < pool.block_floats() * sizeof(float); ++i) {
    h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

class InProcessTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto p = InProcessTransport::Create(fabric_, "prefill-0");
    auto d = InProcessTransport::Create(fabric_, "decode-0");
    ASSERT_TRUE(p.ok() && d.ok());
    prefill_ = *std::move(p);
    decode_ = *std::move(d);
  }

  std::shared_ptr<InProcessFabric> fabric_ = std::make_shared<InProcessFabric>();
  std::unique_ptr<InProcessTransport> prefill_, decode_;
};

TEST_F(InProcessTransportTest, ManyBlocksIntoNonContiguousBlocksArriveIntact) {
  auto src = Pool(64), dst = Pool(48);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1, 1);
  float* data = src->data();
  for (size_t i = 0; i < src->size_bytes() / sizeof(float); ++i) data[i] = uniform(rng);

  // A 600-token prompt: 38 blocks, the first 30 consecutive, then scattered.
  std::vector<int32_t> from, to;
  for (int i = 0; i < 38; ++i) from.push_back(i + 5);
  for (int i = 0; i < 30; ++i) to.push_back(i + 10);
  for (int b : {47, 2, 8, 0, 45, 41, 3, 9}) to.push_back(b);
  auto spans = KvBlockCopySpans(*src, from, *dst, to);
  ASSERT_TRUE(spans.ok()) << spans.status();
  // The consecutive run merges: far fewer spans than 38 blocks x 3 layers x 2.
  EXPECT_LT(spans->size(), 3u * 2 * 12);

  auto local = prefill_->RegisterMemory(src->data(), src->size_bytes());
  auto remote = decode_->RegisterMemory(dst->data(), dst->size_bytes());
  ASSERT_TRUE(local.ok() && remote.ok());
  auto id = prefill_->PostWrite(*local, *remote, *spans);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(WaitForTransfer(*prefill_, *id, absl::Now() + absl::Seconds(5)), absl::OkStatus());
  prefill_->Release(*id);

  std::vector<bool> written(48, false);
  for (int b : to) written[b] = true;
  const uint64_t zero_block = Checksum(*Pool(1), 0, 0, 0);
  for (int layer = 0; layer < 3; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (size_t i = 0; i < from.size(); ++i) {
        EXPECT_EQ(Checksum(*dst, layer, kv, to[i]), Checksum(*src, layer, kv, from[i]))
            << "layer " << layer << " kv " << kv << " block " << from[i] << " -> " << to[i];
      }
      for (int b = 0; b < 48; ++b) {
        if (!written[b]) {
          EXPECT_EQ(Checksum(*dst, layer, kv, b), zero_block) << "block " << b;
        }
      }
    }
  }
}

TEST_F(InProcessTransportTest, SpansOutsideARegionAreInvalidArgument) {
  std::vector<char> a(100), b(50);
  auto local = prefill_->RegisterMemory(a.data(), a.size());
  auto remote = decode_->RegisterMemory(b.data(), b.size());
  ASSERT_TRUE(local.ok() && remote.ok());
  for (CopySpan bad : {CopySpan{0, 40, 20}, CopySpan{90, 0, 20}, CopySpan{0, 0, 0},
                       CopySpan{~uint64_t{0}, 0, 2}}) {
    auto id = prefill_->PostWrite(*local, *remote, {&bad, 1});
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  }
  // Writing from a region that is not this agent's is refused too.
  CopySpan ok{0, 0, 10};
  EXPECT_EQ(decode_->PostWrite(*local, *remote, {&ok, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(InProcessTransportTest, UnknownRegionsAndTransfersAreNotFound) {
  std::vector<char> a(64), b(64);
  auto local = prefill_->RegisterMemory(a.data(), a.size());
  auto remote = decode_->RegisterMemory(b.data(), b.size());
  ASSERT_TRUE(local.ok() && remote.ok());
  ASSERT_EQ(decode_->DeregisterMemory(*remote), absl::OkStatus());
  EXPECT_EQ(decode_->DeregisterMemory(*remote).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(prefill_->DeregisterMemory(*remote).code(), absl::StatusCode::kNotFound);
  CopySpan span{0, 0, 8};
  auto id = prefill_->PostWrite(*local, *remote, {&span, 1});
  EXPECT_EQ(id.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(id.status().message()), HasSubstr("decode-0"));
  EXPECT_EQ(prefill_->Poll(TransferId{12345}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(WaitForTransfer(*prefill_, TransferId{12345}, absl::Now()).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(InProcessTransportTest, AgentsAreUniqueAndLeavingDropsTheirRegions) {
  EXPECT_EQ(InProcessTransport::Create(fabric_, "decode-0").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(InProcessTransport::Create(fabric_, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<char> a(64), b(64);
  auto local = prefill_->RegisterMemory(a.data(), a.size());
  auto remote = decode_->RegisterMemory(b.data(), b.size());
  ASSERT_TRUE(local.ok() && remote.ok());
  decode_.reset();  // decode goes away
  CopySpan span{0, 0, 8};
  EXPECT_EQ(prefill_->PostWrite(*local, *remote, {&span, 1}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(InProcessTransport::Create(fabric_, "decode-0").ok());  // the name is free again
}

TEST(KvBlockCopySpansTest, MismatchedPoolsAndBadBlocksAreInvalidArgument) {
  auto a = Pool(8, 32), b = Pool(8, 64), c = Pool(8, 32);
  const std::vector<int32_t> one = {1}, two = {1, 2}, bad = {8};
  auto mismatch = KvBlockCopySpans(*a, one, *b, one);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mismatch.status().message()), HasSubstr("head_dim"));
  EXPECT_EQ(KvBlockCopySpans(*a, one, *c, two).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBlockCopySpans(*a, bad, *c, one).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::kv
