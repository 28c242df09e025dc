// The expert store on a small random model: the packed layout (bundles of gate row, up row and
// down column, prefix reads), host and O_DIRECT file backings returning the same bytes, the
// file's bytes read counted in whole aligned blocks, and the resident cache — loads and
// widenings that read only the missing bundles and equal the model's weights, hits, a byte
// bound never exceeded, pinned experts never evicted, and priority-aware replacement.
#include "common/moe/expert_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "tests/testing/subprocess.h"

namespace tandem::moe {
namespace {

constexpr int kHidden = 64, kInter = 96, kLayers = 2, kExperts = 4;

class ExpertStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = model::ParseModelConfig(absl::StrCat(
        R"({"model_type": "mixtral", "hidden_size": )", kHidden, R"(, "intermediate_size": )",
        kInter, R"(, "num_hidden_layers": )", kLayers,
        R"(, "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": )", kExperts,
        R"(, "num_experts_per_tok": 2, "vocab_size": 50, "max_position_embeddings": 64})"));
    ASSERT_TRUE(config.ok()) << config.status();
    auto weights = engine::ModelWeights::Random(*config, 11);
    ASSERT_TRUE(weights.ok());
    weights_ = *std::move(weights);
    // A real file on a disk-backed file system (O_DIRECT): the build tree.
    path_ = absl::StrCat(testing::BinDir(), "/expert_store_test.", getpid(), ".pack");
    ASSERT_EQ(WriteExpertPack(*weights_, path_), absl::OkStatus());
  }
  void TearDown() override { std::filesystem::remove(path_); }

  // Checks that `r` holds the first r.width neurons of (layer, expert).
  void ExpectPrefix(const ResidentExpert& r, int layer, int expert) {
    const engine::ExpertWeights& w = weights_->layers[layer].experts[expert];
    ASSERT_EQ(r.gate.rows, r.width);
    ASSERT_EQ(r.down.cols, r.width);
    for (int i = 0; i < r.width; ++i) {
      EXPECT_TRUE(std::equal(r.gate.row(i), r.gate.row(i) + kHidden, w.gate.row(i))) << i;
      EXPECT_TRUE(std::equal(r.up.row(i), r.up.row(i) + kHidden, w.up.row(i))) << i;
      for (int j = 0; j < kHidden; j += 7) EXPECT_EQ(r.down.row(j)[i], w.down.row(j)[i]);
    }
  }

  static constexpr int64_t kFullBytes = int64_t{3} * kInter * kHidden * 2;
  std::unique_ptr<engine::ModelWeights> weights_;
  std::string path_;
};

TEST_F(ExpertStoreTest, PackLayoutAndBackingsReadTheSameBundles) {
  auto host = HostBacking(path_);
  ASSERT_TRUE(host.ok()) << host.status();
  const PackLayout& layout = (*host)->layout();
  EXPECT_EQ(layout.bundle_bytes(), 3 * kHidden * 2);
  EXPECT_EQ(layout.expert_stride() % PackLayout::kAlignment, 0);
  EXPECT_EQ(std::filesystem::file_size(path_), static_cast<uintmax_t>(layout.file_bytes()));

  // Bundle i of expert (1, 2): gate row i, up row i, down column i.
  std::vector<uint16_t> bundles(3 * kHidden * 5);
  ASSERT_EQ((*host)->Read(1, 2, 10, 5, reinterpret_cast<std::byte*>(bundles.data())),
            absl::OkStatus());
  const engine::ExpertWeights& w = weights_->layers[1].experts[2];
  for (int k = 0; k < 5; ++k) {
    const uint16_t* bundle = bundles.data() + k * 3 * kHidden;
    EXPECT_TRUE(std::equal(bundle, bundle + kHidden, w.gate.row(10 + k)));
    EXPECT_TRUE(std::equal(bundle + kHidden, bundle + 2 * kHidden, w.up.row(10 + k)));
    for (int j = 0; j < kHidden; ++j) EXPECT_EQ(bundle[2 * kHidden + j], w.down.row(j)[10 + k]);
  }
  EXPECT_EQ((*host)->bytes_read(), 5 * layout.bundle_bytes());
  EXPECT_EQ((*host)->Read(1, 2, 90, 7, reinterpret_cast<std::byte*>(bundles.data())).code(),
            absl::StatusCode::kInvalidArgument);

  auto direct = DirectFileBacking(path_);
  if (direct.status().code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << direct.status();
  }
  ASSERT_TRUE(direct.ok()) << direct.status();
  std::vector<uint16_t> again(bundles.size());
  ASSERT_EQ((*direct)->Read(1, 2, 10, 5, reinterpret_cast<std::byte*>(again.data())),
            absl::OkStatus());
  ASSERT_EQ((*host)->Read(1, 2, 10, 5, reinterpret_cast<std::byte*>(bundles.data())),
            absl::OkStatus());
  EXPECT_EQ(again, bundles);
  // Bundles [10, 15) of 384 bytes: bytes [3840, 5760) of the expert, blocks [0, 8192).
  EXPECT_EQ((*direct)->bytes_read(), 8192);
}

TEST_F(ExpertStoreTest, CacheLoadsWidensAndHitsWithTheRightBytes) {
  auto backing = DirectFileBacking(path_);
  if (!backing.ok()) backing = HostBacking(path_);  // a file system without O_DIRECT
  ASSERT_TRUE(backing.ok()) << backing.status();
  auto cache = ExpertCache::Create(backing->get(), 4 * kFullBytes);
  ASSERT_TRUE(cache.ok()) << cache.status();
  ExpertCache& c = **cache;
  const int64_t bundle = (*backing)->layout().bundle_bytes();

  auto narrow = c.Acquire(0, 3, 24);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  ExpectPrefix(**narrow, 0, 3);
  EXPECT_EQ(c.stats().misses, 1);
  EXPECT_EQ(c.stats().bytes_loaded, 24 * bundle);
  // Widening reads bundles [24, 80) only.
  auto wide = c.Acquire(0, 3, 80);
  ASSERT_TRUE(wide.ok());
  ExpectPrefix(**wide, 0, 3);
  EXPECT_EQ(c.stats().widenings, 1);
  EXPECT_EQ(c.stats().bytes_loaded, 80 * bundle);
  EXPECT_EQ(c.resident_bytes(), int64_t{3} * 80 * kHidden * 2);
  // Narrower than resident: a hit, nothing read.
  auto hit = c.Acquire(0, 3, 50);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ((*hit)->width, 80);
  EXPECT_EQ(c.stats().hits, 1);
  EXPECT_EQ(c.stats().bytes_loaded, 80 * bundle);
  EXPECT_EQ(c.Acquire(0, 3, kInter + 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Acquire(2, 0, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExpertCache::Create(backing->get(), kFullBytes - 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ExpertStoreTest, BoundNeverExceededPinnedKeptAndPriorityDecides) {
  auto backing = HostBacking(path_);
  ASSERT_TRUE(backing.ok());
  auto cache = ExpertCache::Create(backing->get(), kFullBytes * 5 / 2);  // 2.5 full experts
  ASSERT_TRUE(cache.ok());
  ExpertCache& c = **cache;
  // A stream of steps, each using two experts at assorted widths.
  for (int step = 0; step < 60; ++step) {
    for (int k = 0; k < 2; ++k) {
      const int layer = (step + k) % kLayers, expert = (step * 3 + k) % kExperts;
      const int width = 16 + (step * 37 + k * 11) % (kInter - 15);
      auto r = c.Acquire(layer, expert, width);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_GE((*r)->width, width);
      ASSERT_LE(c.resident_bytes(), c.capacity_bytes());
    }
    c.UnpinAll();
  }
  EXPECT_GT(c.stats().evictions, 0);

  // Two pinned full experts leave room for half of one more.
  c.UnpinAll();
  ASSERT_TRUE(c.Acquire(0, 0, kInter).ok());
  ASSERT_TRUE(c.Acquire(0, 1, kInter).ok());
  EXPECT_EQ(c.Acquire(0, 2, kInter).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c.resident_width(0, 0), kInter);
  EXPECT_EQ(c.resident_width(0, 1), kInter);

  // Priority: expert (1, 3) weighs 100x; after one use each it outlives (1, 2).
  c.UnpinAll();
  std::vector<std::vector<double>> weights(kLayers, std::vector<double>(kExperts, 1.0));
  weights[1][3] = 100;
  c.SetPriorityWeights(weights);
  ASSERT_TRUE(c.Acquire(1, 3, kInter).ok());
  ASSERT_TRUE(c.Acquire(1, 2, kInter).ok());
  c.UnpinAll();
  ASSERT_TRUE(c.Acquire(1, 0, kInter).ok());  // evicts the others, (1, 3) last
  EXPECT_EQ(c.resident_width(1, 3), kInter);
  EXPECT_EQ(c.resident_width(1, 2), 0);
}

// A header whose sizes overflow the pack's offsets (int64) or an int is refused before any
// offset is computed (UBSan reported the overflow in PackLayout::expert_stride and file_bytes);
// so are reads whose end overflows an int. Also in tests/fuzz/corpus/expert_pack.
TEST_F(ExpertStoreTest, HostileHeadersAndReadsAreRefusedWithoutOverflow) {
  const std::string bad = absl::StrCat(testing::BinDir(), "/expert_store_test.", getpid(), ".bad");
  for (const char* header :
       {"layers 1 experts 1 hidden 2147483647 intermediate 2147483647",
        "layers 2147483647 experts 2147483647 hidden 1 intermediate 1",
        "layers 1 experts 1 hidden 1 intermediate 4294967297",
        "layers 1 experts 1 hidden -1 intermediate 1", "layers 1 experts 1 hidden 1"}) {
    SCOPED_TRACE(header);
    std::string text = absl::StrCat("tandem-expert-pack v1 ", header, "\n");
    text.resize(2 * PackLayout::kAlignment, '\0');
    std::ofstream(bad, std::ios::binary) << text;
    EXPECT_EQ(HostBacking(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
  std::filesystem::remove(bad);

  auto host = HostBacking(path_);
  ASSERT_TRUE(host.ok()) << host.status();
  std::vector<std::byte> out(1);
  EXPECT_EQ((*host)->Read(0, 0, 1, std::numeric_limits<int>::max(), out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::moe
