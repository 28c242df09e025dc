// Expert bundles copied to the GPU on a copy stream, in the load order, equal the pack's bytes,
// for bf16 and int4 experts (label gpu: skips without a CUDA device).
#include "common/kernels/cuda/pinned_copier.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/engine/forward.h"
#include "common/moe/expert_store.h"
#include "tests/testing/subprocess.h"

namespace tandem::kernels::cuda {
namespace {

TEST(PinnedCopierTest, ExpertPrefixesArriveInOrderWithThePacksBytes) {
  for (const char* quantization :
       {"", R"(, "quantization_config": {"quant_method": "tandem", "bits": 4,
                 "group_size": 32, "modules": ["experts"]})"}) {
    auto config = model::ParseModelConfig(absl::StrCat(
        R"({"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 50,
            "max_position_embeddings": 64)",
        quantization, "}"));
    ASSERT_TRUE(config.ok()) << config.status();
    auto weights = engine::ModelWeights::Random(*config, 5);
    ASSERT_TRUE(weights.ok());
    testing::TempDir dir;
    const std::string pack = dir.path() + "/experts.pack";
    ASSERT_EQ(moe::WriteExpertPack(**weights, pack), absl::OkStatus());
    auto copier = PinnedCopier::Create(pack, 1 << 20);
    if (copier.status().code() == absl::StatusCode::kUnavailable) {
      GTEST_SKIP() << "no CUDA device: " << copier.status();
    }
    ASSERT_TRUE(copier.ok()) << copier.status();
    auto host = moe::HostBacking(pack);
    ASSERT_TRUE(host.ok());
    const moe::PackLayout& layout = (*host)->layout();
    const std::vector<engine::ExpertLoad> loads = {{2, 96}, {0, 48}, {3, 24}};
    std::vector<PinnedCopier::Range> ranges;
    int64_t bytes = 0;
    for (const engine::ExpertLoad& load : loads) {
      const moe::ByteRange range = layout.Prefix(1, load.expert, load.width);
      ranges.push_back({load.expert, range.offset, range.bytes});
      bytes += range.bytes;
    }
    ASSERT_EQ((*copier)->Begin(ranges), absl::OkStatus());
    for (const engine::ExpertLoad& load : loads) {
      auto device = (*copier)->Wait(load.expert);
      ASSERT_TRUE(device.ok()) << device.status();
      const int bundles = layout.BundlesFor(load.width);
      std::vector<std::byte> got(bundles * layout.bundle_bytes()), want(got.size());
      ASSERT_EQ(cudaMemcpy(got.data(), *device, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ((*host)->Read(1, load.expert, 0, bundles, want.data()), absl::OkStatus());
      EXPECT_EQ(got, want) << "expert " << load.expert;
    }
    EXPECT_EQ((*copier)->bytes_copied(), bytes);
    EXPECT_EQ((*copier)->Wait(1).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*copier)->Begin({{{1, layout.file_bytes() - 10, 11}}}).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*copier)->Begin({{{1, 0, (1 << 20) + 1}}}).code(),
              absl::StatusCode::kResourceExhausted);
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
