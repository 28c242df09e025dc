// Expert bundles copied to the GPU on a copy stream, in the load order, equal the pack's bytes
// (label gpu: skips without a CUDA device).
#include "common/moe/cuda/expert_copy.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/testing/subprocess.h"

namespace tandem::moe {
namespace {

TEST(CudaExpertCopierTest, CopiesArriveInOrderWithThePacksBytes) {
  auto config = model::ParseModelConfig(R"({"model_type": "mixtral", "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
      "vocab_size": 50, "max_position_embeddings": 64})");
  ASSERT_TRUE(config.ok());
  auto weights = engine::ModelWeights::Random(*config, 5);
  ASSERT_TRUE(weights.ok());
  testing::TempDir dir;
  const std::string pack = dir.path() + "/experts.pack";
  ASSERT_EQ(WriteExpertPack(**weights, pack), absl::OkStatus());
  auto copier = CudaExpertCopier::Create(pack, 1 << 20);
  if (copier.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "no CUDA device: " << copier.status();
  }
  ASSERT_TRUE(copier.ok()) << copier.status();
  auto host = HostBacking(pack);
  ASSERT_TRUE(host.ok());
  const std::vector<engine::ExpertLoad> loads = {{2, 96}, {0, 48}, {3, 24}};
  ASSERT_EQ((*copier)->BeginLayer(1, loads), absl::OkStatus());
  const int64_t bundle = (*host)->layout().bundle_bytes();
  for (const engine::ExpertLoad& load : loads) {
    auto device = (*copier)->Wait(load.expert);
    ASSERT_TRUE(device.ok()) << device.status();
    std::vector<std::byte> got(load.width * bundle), want(load.width * bundle);
    ASSERT_EQ(cudaMemcpy(got.data(), *device, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ((*host)->Read(1, load.expert, 0, load.width, want.data()), absl::OkStatus());
    EXPECT_EQ(got, want) << "expert " << load.expert;
  }
  EXPECT_EQ((*copier)->bytes_copied(), (96 + 48 + 24) * bundle);
  EXPECT_EQ((*copier)->Wait(1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*copier)->BeginLayer(1, {{{1, 97}}}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::moe
