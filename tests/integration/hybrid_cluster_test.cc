// The shipped hybrid model (models/tiny-hybrid-moe: Qwen3.5-MoE layout, Gated DeltaNet in three
// of every four layers, 64 routed experts top-8 and a gated shared expert) through real
// processes: a full disaggregated cluster, whose handoff carries each sequence's recurrent state
// with its KV blocks, gives the PyTorch reference's greedy tokens, again from the prefix cache's
// state snapshots when the prompts repeat; a pruned decoder (REAP keep 32 of 64) fed by a full
// prefill equals colocated tandem-serve --plan token for token and holds half the routed
// experts; and a streamed, mixed-width decoder of int4 experts (the reordered checkpoint
// quantized, top-k tiers with widths by rank, an O_DIRECT pack through a cache of a quarter of
// it) equals colocated resident serving of the same checkpoint and plan.
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
constexpr char kModel[] = "tiny-hybrid-moe";

using testing::MetricValue;

class HybridClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::ExactKernelsInChildren();  // compared with the PyTorch reference
    model_dir_ = absl::StrCat(testing::SourceDir(), "/models/", kModel);
    manifest_ = testing::LoadGoldenManifest(kModel);
  }

  std::vector<std::vector<int32_t>> GenerateAll(sdk::Client* client) {
    return testing::GreedyContinuations(client, manifest_, kTokens);
  }

  std::vector<int32_t> Reference(size_t k) const {
    return testing::ReferenceTokens(manifest_, k, kTokens);
  }

  std::string model_dir_;
  nlohmann::json manifest_;
};

TEST_F(HybridClusterTest, FullDisaggregatedClusterGivesTheReferencesGreedyTokens) {
  testing::ServiceSet set(model_dir_);
  auto cluster = set.StartCluster({}, {});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = testing::ConnectClient(cluster->gateway);
  ASSERT_NE(client, nullptr);
  const auto generated = GenerateAll(client.get());
  for (size_t k = 0; k < generated.size(); ++k) {
    EXPECT_EQ(generated[k], Reference(k)) << "prompt " << k;
  }
  // Every request's recurrent state went with its blocks: 6 DeltaNet layers of a conv tail
  // (3 x 384 floats) and a state (4 heads x 48 x 48 floats), 248,832 bytes a sequence.
  EXPECT_GE(MetricValue(cluster->prefill.http_port, "tandem_kv_transfer_bytes_total"),
            248832.0 * static_cast<double>(generated.size()));
  // The long prompt's blocks stayed cached with the state at its last block boundary: asked
  // again, the prefill resumes there and the tokens are the same.
  const int port = cluster->prefill.http_port;
  EXPECT_GT(MetricValue(port, "tandem_prefix_cache_blocks", "state=\"with_state\""), 0);
  const double hits = MetricValue(port, "tandem_prefix_cache_hit_tokens_total");
  EXPECT_EQ(GenerateAll(client.get()), generated);
  EXPECT_GT(MetricValue(port, "tandem_prefix_cache_hit_tokens_total"), hits);
}

TEST_F(HybridClusterTest, PrunedDecoderEqualsColocatedPhaseAwareServing) {
  const testing::PlanServing runs = testing::ServePlanBothWays(
      model_dir_, manifest_, kTokens, "--plan=" + model_dir_ + "/pruning/reap-keep32.json");
  testing::ExpectPrunedDecoderEqualsColocated(runs, manifest_, kTokens);
  EXPECT_EQ(runs.decode_experts, 8 * 32);  // 32 of 64 routed experts in each of 8 layers
  EXPECT_GT(runs.decode_bytes, 0);
  EXPECT_EQ(runs.decode_bytes * 2, runs.serve_bytes);  // the shared experts are not routed
}

TEST_F(HybridClusterTest, StreamedTopKTieredInt4DecoderEqualsColocatedResident) {
  testing::TempDir work;
  auto prepared = testing::MakeMixedWidthModel(
      work.path(), kModel, "reap-keep32.json", 4,
      "--hot_share 0.3 --warm_share 0.4 --warm_width 32 "
      "--warm_widths 64,64,64,64,48,48,32,0 --cold_widths 64,0,64,48,32,0,0,0");
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  const testing::PlanServing runs = testing::ServeStreamedBothWays(
      prepared->model_dir, prepared->plan, prepared->pack,
      static_cast<int64_t>(std::filesystem::file_size(prepared->pack) / 4), manifest_, kTokens);
  EXPECT_GT(runs.cache_misses, 0);
  EXPECT_GT(runs.warm_pairs, 0);
  EXPECT_GT(runs.cold_pairs, 0);
  EXPECT_GT(runs.neurons, 0);
  EXPECT_EQ(runs.decode_experts, 0);  // every routed expert streams
}

}  // namespace
}  // namespace tandem
