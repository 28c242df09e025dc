// The fine-grained shipped model (models/tiny-fg-moe: Qwen2-MoE layout, 64 routed experts
// top-8 and a shared expert) through real processes, as tiny-moe is served: a full
// disaggregated cluster gives the PyTorch reference's greedy tokens; a pruned decoder (REAP
// keep 32 of 64, the shared expert always kept) fed by a full prefill equals colocated
// tandem-serve --plan token for token and holds half the routed experts; a streamed,
// mixed-width decoder (tiers over each token's leading pair, the other six at full width, read
// from an O_DIRECT pack into a cache of a quarter of the experts) equals colocated resident
// serving with the same plan, and so does one with int4 experts and top-k tiers (widths by
// rank).
#include <gtest/gtest.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tandem/client.h"
#include "tests/testing/cluster_client.h"
#include "tests/testing/kernels.h"
#include "tests/testing/mixed_width_model.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

constexpr int kTokens = 24;
constexpr char kModel[] = "tiny-fg-moe";

class FineGrainedClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::ExactKernelsInChildren();  // compared with the PyTorch reference
    model_dir_ = absl::StrCat(testing::SourceDir(), "/models/", kModel);
    manifest_ = testing::LoadGoldenManifest(kModel);
  }

  // A full prefill, a decode with `decode_flags` and a gateway over them in `set`.
  static absl::StatusOr<testing::ServiceSet::Cluster> StartCluster(
      testing::ServiceSet& set, std::vector<std::string> decode_flags) {
    decode_flags.push_back("--kv_blocks=160");
    return set.StartCluster({}, decode_flags);
  }

  std::vector<std::vector<int32_t>> GenerateAll(sdk::Client* client) {
    return testing::GreedyContinuations(client, manifest_, kTokens);
  }

  std::vector<int32_t> Reference(size_t k) const {
    return testing::ReferenceTokens(manifest_, k, kTokens);
  }

  // A decoder streaming `prepared`'s pack through a cache of `cache_bytes` with its plan
  // against colocated resident serving: the same tokens.
  testing::PlanServing StreamedAgainstColocated(const testing::MixedWidthModel& prepared,
                                                int64_t cache_bytes) {
    return testing::ServeStreamedBothWays(prepared.model_dir, prepared.plan, prepared.pack,
                                          cache_bytes, manifest_, kTokens, {"--kv_blocks=160"});
  }

  std::string model_dir_;
  nlohmann::json manifest_;
};

TEST_F(FineGrainedClusterTest, FullDisaggregatedClusterGivesTheReferencesGreedyTokens) {
  testing::ServiceSet set(model_dir_);
  auto cluster = StartCluster(set, {});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = testing::ConnectClient(cluster->gateway);
  ASSERT_NE(client, nullptr);
  const auto generated = GenerateAll(client.get());
  for (size_t k = 0; k < generated.size(); ++k) {
    EXPECT_EQ(generated[k], Reference(k)) << "prompt " << k;
  }
  auto models = client->ListModels();
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->models_size(), 1);
  EXPECT_EQ(models->models(0).name(), kModel);
}

TEST_F(FineGrainedClusterTest, PrunedDecoderEqualsColocatedPhaseAwareServing) {
  const testing::PlanServing runs = testing::ServePlanBothWays(
      model_dir_, manifest_, kTokens, "--plan=" + model_dir_ + "/pruning/reap-keep32.json",
      {"--kv_blocks=160"});
  testing::ExpectPrunedDecoderEqualsColocated(runs, manifest_, kTokens);
  EXPECT_EQ(runs.decode_experts, 6 * 32);  // 32 of 64 routed experts in each of 6 layers
  EXPECT_GT(runs.decode_bytes, 0);
  EXPECT_EQ(runs.decode_bytes * 2, runs.serve_bytes);  // the shared experts are not routed
}

TEST_F(FineGrainedClusterTest, StreamedMixedWidthDecoderEqualsColocatedResidentMixedWidth) {
  testing::TempDir work;
  auto prepared = testing::MakeMixedWidthModel(work.path(), kModel, "reap-keep32.json");
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  // 6 layers x 64 experts x 3 x 96 x 192 x 2 bytes, a quarter of it.
  const testing::PlanServing run =
      StreamedAgainstColocated(*prepared, 6 * 64 * 3 * 96 * 192 * 2 / 4);
  EXPECT_GT(run.cache_misses, 0);
  EXPECT_GT(run.warm_pairs, 0);
  EXPECT_EQ(run.decode_experts,
            0);  // every routed expert streams; the shared experts stay resident
}

// Top-k tiers with int4 experts: the reordered model quantized to int4, REAP keep 32 tiered with
// widths by rank (Warm narrows ranks 4-7 and skips the last, Cold keeps ranks 0, 2-4), its pack
// of int4 bundles streamed from O_DIRECT into a cache of a quarter of the pack: the
// disaggregated cluster's greedy tokens equal colocated resident serving of the same int4
// checkpoint and plan.
TEST_F(FineGrainedClusterTest, StreamedTopKTieredInt4DecoderEqualsColocatedResident) {
  testing::TempDir work;
  auto prepared = testing::MakeMixedWidthModel(
      work.path(), kModel, "reap-keep32.json", 4,
      "--hot_share 0.3 --warm_share 0.4 --warm_width 32 "
      "--warm_widths 96,96,96,96,64,64,32,0 --cold_widths 96,0,96,64,32,0,0,0");
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  const testing::PlanServing run = StreamedAgainstColocated(
      *prepared, static_cast<int64_t>(std::filesystem::file_size(prepared->pack) / 4));
  EXPECT_GT(run.cache_misses, 0);
  EXPECT_GT(run.cold_pairs, 0);
  EXPECT_GT(run.neurons, 0);
  EXPECT_EQ(run.decode_experts, 0);
}

}  // namespace
}  // namespace tandem
