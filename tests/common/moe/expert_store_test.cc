// The expert store on a small random model, with bf16, int8 and int4 experts: the packed layout
// (bundles of whole panels and quantization groups, prefix reads), host and O_DIRECT file
// backings returning the same bytes, the file's bytes read counted in whole aligned blocks, and
// the resident cache — loads and widenings that read only the missing bundles and equal the
// model's weights, hits, a byte bound never exceeded, pinned experts never evicted, and
// priority-aware replacement.
#include "common/moe/expert_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "tests/testing/subprocess.h"

namespace tandem::moe {
namespace {

constexpr int kHidden = 64, kInter = 96, kLayers = 2, kExperts = 4;

// "" (bf16), or the quantization_config of int8 / int4 experts in groups of 32.
class ExpertStoreTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    const int bits = GetParam();
    const std::string quantization =
        bits == 0 ? ""
                  : absl::StrCat(R"(, "quantization_config": {"quant_method": "tandem", "bits": )",
                                 bits, R"(, "group_size": 32, "modules": ["experts"]})");
    auto config = model::ParseModelConfig(absl::StrCat(
        R"({"model_type": "mixtral", "hidden_size": )", kHidden, R"(, "intermediate_size": )",
        kInter, R"(, "num_hidden_layers": )", kLayers,
        R"(, "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": )", kExperts,
        R"(, "num_experts_per_tok": 2, "vocab_size": 50, "max_position_embeddings": 64)",
        quantization, "}"));
    ASSERT_TRUE(config.ok()) << config.status();
    auto weights = engine::ModelWeights::Random(*config, 11);
    ASSERT_TRUE(weights.ok());
    weights_ = *std::move(weights);
    layout_ = PackLayout::For(weights_->config);
    ASSERT_EQ(layout_.Check(), "");
    // A real file on a disk-backed file system (O_DIRECT): the build tree.
    path_ = absl::StrCat(testing::BinDir(), "/expert_store_test.", getpid(), ".pack");
    ASSERT_EQ(WriteExpertPack(*weights_, path_), absl::OkStatus());
  }
  void TearDown() override { std::filesystem::remove(path_); }

  // Checks that `r` holds the first r.width neurons of (layer, expert).
  void ExpectPrefix(const ResidentExpert& r, int layer, int expert) {
    const engine::ExpertWeights& w = weights_->layers[layer].moe.experts[expert];
    ASSERT_EQ(r.gate.rows(), r.width);
    ASSERT_EQ(r.up.rows(), r.width);
    ASSERT_EQ(r.down.cols(), r.width);
    ASSERT_EQ(r.down.rows(), kHidden);
    for (int i = 0; i < r.width; ++i) {
      for (int j = 0; j < kHidden; ++j) {
        ASSERT_EQ(r.gate.at(i, j), w.gate.at(i, j)) << i << "," << j;
        ASSERT_EQ(r.up.at(i, j), w.up.at(i, j)) << i << "," << j;
        ASSERT_EQ(r.down.at(j, i), w.down.at(j, i)) << j << "," << i;
      }
    }
  }

  int64_t FullBytes() const { return int64_t{layout_.bundles()} * layout_.bundle_bytes(); }

  std::unique_ptr<engine::ModelWeights> weights_;
  PackLayout layout_;
  std::string path_;
};

TEST_P(ExpertStoreTest, PackLayoutAndBackingsReadTheSameBundles) {
  auto host = HostBacking(path_);
  ASSERT_TRUE(host.ok()) << host.status();
  const PackLayout& layout = (*host)->layout();
  EXPECT_EQ(layout.format, layout_.format);
  EXPECT_EQ(layout.group, layout_.group);
  EXPECT_EQ(layout.expert_stride() % PackLayout::kAlignment, 0);
  EXPECT_EQ(std::filesystem::file_size(path_), static_cast<uintmax_t>(layout.file_bytes()));
  // A bundle holds exactly its neurons' bytes: 3 x hidden values each, plus scales.
  const int n = layout.bundle_neurons();
  const int64_t values = int64_t{3} * n * kHidden * WeightFormatBits(layout.format) / 8;
  const int64_t scales = GetParam() == 0 ? 0 : int64_t{3} * n * kHidden / 32 * 2;
  EXPECT_EQ(layout.bundle_bytes(), values + scales);

  // The first bundles of expert (1, 2), appended to an empty expert, are its first neurons.
  const int count = layout.bundles() - 1;
  std::vector<std::byte> bundles(count * layout.bundle_bytes());
  ASSERT_EQ((*host)->Read(1, 2, 0, count, bundles.data()), absl::OkStatus());
  ResidentExpert prefix;
  AppendBundles(layout, bundles.data(), 0, count, &prefix);
  EXPECT_EQ(prefix.width, count * n);
  ExpectPrefix(prefix, 1, 2);
  EXPECT_EQ((*host)->bytes_read(), count * layout.bundle_bytes());
  EXPECT_EQ((*host)->Read(1, 2, 1, layout.bundles(), bundles.data()).code(),
            absl::StatusCode::kInvalidArgument);

  auto direct = DirectFileBacking(path_);
  if (direct.status().code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << direct.status();
  }
  ASSERT_TRUE(direct.ok()) << direct.status();
  std::vector<std::byte> again(layout.bundle_bytes());
  ASSERT_EQ((*direct)->Read(1, 2, 1, 1, again.data()), absl::OkStatus());
  EXPECT_TRUE(std::equal(again.begin(), again.end(), bundles.begin() + layout.bundle_bytes()));
  // Bundle 1: bytes [b, 2b) of the expert, in whole 4096-byte blocks.
  const int64_t b = layout.bundle_bytes();
  EXPECT_EQ((*direct)->bytes_read(),
            (2 * b + PackLayout::kAlignment - 1) / PackLayout::kAlignment * PackLayout::kAlignment -
                b / PackLayout::kAlignment * PackLayout::kAlignment);
}

TEST_P(ExpertStoreTest, CacheLoadsWidensAndHitsWithTheRightBytes) {
  auto backing = DirectFileBacking(path_);
  if (!backing.ok()) backing = HostBacking(path_);  // a file system without O_DIRECT
  ASSERT_TRUE(backing.ok()) << backing.status();
  auto cache = ExpertCache::Create(backing->get(), 4 * FullBytes());
  ASSERT_TRUE(cache.ok()) << cache.status();
  ExpertCache& c = **cache;
  const int64_t bundle = layout_.bundle_bytes();

  auto narrow = c.Acquire(0, 3, 24);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  ExpectPrefix(**narrow, 0, 3);
  EXPECT_EQ((*narrow)->width, layout_.BundlesFor(24) * layout_.bundle_neurons());
  EXPECT_EQ(c.stats().misses, 1);
  EXPECT_EQ(c.stats().bytes_loaded, layout_.BundlesFor(24) * bundle);
  // Widening reads the missing bundles only.
  auto wide = c.Acquire(0, 3, 70);
  ASSERT_TRUE(wide.ok());
  ExpectPrefix(**wide, 0, 3);
  EXPECT_EQ(c.stats().widenings, 1);
  EXPECT_EQ(c.stats().bytes_loaded, layout_.BundlesFor(70) * bundle);
  EXPECT_EQ(c.resident_bytes(), layout_.BundlesFor(70) * bundle);
  EXPECT_EQ(c.resident_bytes(), (*wide)->bytes());
  // Narrower than resident: a hit, nothing read.
  auto hit = c.Acquire(0, 3, 50);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ((*hit)->width, layout_.BundlesFor(70) * layout_.bundle_neurons());
  EXPECT_EQ(c.stats().hits, 1);
  EXPECT_EQ(c.stats().bytes_loaded, layout_.BundlesFor(70) * bundle);
  EXPECT_EQ(c.Acquire(0, 3, kInter + 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Acquire(2, 0, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExpertCache::Create(backing->get(), FullBytes() - 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(ExpertStoreTest, BoundNeverExceededPinnedKeptAndPriorityDecides) {
  auto backing = HostBacking(path_);
  ASSERT_TRUE(backing.ok());
  auto cache = ExpertCache::Create(backing->get(), FullBytes() * 5 / 2);  // 2.5 full experts
  ASSERT_TRUE(cache.ok());
  ExpertCache& c = **cache;
  // A stream of steps, each using two experts at assorted widths.
  for (int step = 0; step < 60; ++step) {
    for (int k = 0; k < 2; ++k) {
      const int layer = (step + k) % kLayers, expert = (step * 3 + k) % kExperts;
      const int width = 1 + (step * 37 + k * 11) % kInter;
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
TEST_P(ExpertStoreTest, HostileHeadersAndReadsAreRefusedWithoutOverflow) {
  const std::string bad = absl::StrCat(testing::BinDir(), "/expert_store_test.", getpid(), ".bad");
  for (const char* header :
       {"v2 layers 1 experts 1 hidden 2147483632 intermediate 2147483632 format bf16 group 0",
        "v2 layers 2147483647 experts 2147483647 hidden 16 intermediate 16 format bf16 group 0",
        "v2 layers 1 experts 1 hidden 16 intermediate 4294967297 format bf16 group 0",
        "v2 layers 1 experts 1 hidden -1 intermediate 16 format bf16 group 0",
        "v2 layers 1 experts 1 hidden 16 intermediate 16 format int4 group 16",
        "v2 layers 1 experts 1 hidden 16 intermediate 48 format int8 group 32",
        "v2 layers 1 experts 1 hidden 16 intermediate 17 format bf16 group 0",
        "v2 layers 1 experts 1 hidden 16 intermediate 16 format fp8 group 0",
        "v2 layers 1 experts 1 hidden 16", "v1 layers 1 experts 1 hidden 1 intermediate 1"}) {
    SCOPED_TRACE(header);
    std::string text = absl::StrCat("tandem-expert-pack ", header, "\n");
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

INSTANTIATE_TEST_SUITE_P(Formats, ExpertStoreTest, ::testing::Values(0, 8, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? std::string("bf16")
                                                  : absl::StrCat("int", info.param);
                         });

}  // namespace
}  // namespace tandem::moe
