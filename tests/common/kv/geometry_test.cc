#include "common/kv/geometry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::kv {
namespace {

using ::testing::HasSubstr;

model::ModelConfig TinyConfig() {
  model::ModelConfig config;
  config.num_hidden_layers = 6;
  config.num_key_value_heads = 2;
  config.head_dim = 32;
  config.rope_theta = 10000;
  config.max_position_embeddings = 512;
  return config;
}

TEST(KvGeometryTest, RecurrentStateIsPartOfTheGeometry) {
  // Qwen3.5's Gated DeltaNet layers keep no K/V: the geometry counts the attention layers and
  // the bytes of a sequence's recurrent state, which travel after its blocks.
  auto dir = testing::OpenModelDir(testing::SourceDir() + "/tests/golden/arch/qwen3_5_moe_hybrid");
  absl::StatusOr<InstanceModel> model = LoadInstanceModel(*dir, 16);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->geometry.num_layers(), 1);
  EXPECT_EQ(model->geometry.state_bytes(), model->config.RecurrentStateBytes());
  EXPECT_GT(model->geometry.state_bytes(), 0);
  auto other = model->geometry;
  other.set_state_bytes(other.state_bytes() / 2);
  absl::Status status = CheckCompatible(model->geometry, other);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("state_bytes"));
  EXPECT_EQ(MakeKvGeometry(TinyConfig(), 16, kernels::KvDtype::kF32).state_bytes(), 0);
}

TEST(KvGeometryTest, WindowRingsArePartOfTheGeometry) {
  // gpt-oss's windowed layers (0 and 2 of 3) keep rings in the state slot: the geometry counts
  // the one paged layer and the rings' bytes, and a peer paging every layer does not pair.
  auto dir =
      testing::OpenModelDir(testing::SourceDir() + "/tests/golden/arch/gpt_oss_sinks_windows");
  absl::StatusOr<InstanceModel> rings = LoadInstanceModel(*dir, 16, kernels::KvDtype::kBf16);
  absl::StatusOr<InstanceModel> paged =
      LoadInstanceModel(*dir, 16, kernels::KvDtype::kBf16, /*window_rings=*/false);
  ASSERT_TRUE(rings.ok() && paged.ok()) << rings.status() << paged.status();
  EXPECT_EQ(rings->geometry.num_layers(), 1);
  // Two rings of ceil((7 - 1 + 256) / 16) = 17 blocks of 16 x 2 heads x 16 bf16, K and V.
  EXPECT_EQ(rings->geometry.state_bytes(), 2 * 2 * 17 * 16 * 2 * 16 * 2);
  EXPECT_EQ(paged->geometry.num_layers(), 3);
  EXPECT_EQ(paged->geometry.state_bytes(), 0);
  absl::Status status = CheckCompatible(rings->geometry, paged->geometry);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("num_layers"));
}

TEST(KvGeometryTest, SameConfigIsCompatible) {
  auto a = MakeKvGeometry(TinyConfig(), 16, kernels::KvDtype::kF32);
  auto b = MakeKvGeometry(TinyConfig(), 16, kernels::KvDtype::kF32);
  EXPECT_TRUE(CheckCompatible(a, b).ok());
}

TEST(KvGeometryTest, ExpertCountDoesNotMatter) {
  model::ModelConfig pruned = TinyConfig();
  pruned.num_local_experts = 4;
  pruned.intermediate_size = 128;
  EXPECT_TRUE(CheckCompatible(MakeKvGeometry(TinyConfig(), 16, kernels::KvDtype::kF32),
                              MakeKvGeometry(pruned, 16, kernels::KvDtype::kF32))
                  .ok());
}

TEST(KvGeometryTest, MismatchNamesTheField) {
  const auto base = MakeKvGeometry(TinyConfig(), 16, kernels::KvDtype::kF32);
  auto other = base;
  other.set_block_size(32);
  absl::Status status = CheckCompatible(base, other);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("block_size"));
  other = base;
  other.set_dtype(tandem::v1::KV_DTYPE_BF16);
  EXPECT_THAT(CheckCompatible(base, other).message(), HasSubstr("KV_DTYPE_BF16"));
  other = base;
  other.set_num_kv_heads(4);
  EXPECT_THAT(CheckCompatible(base, other).message(), HasSubstr("num_kv_heads"));
  other = base;
  other.set_rope_theta(1e6);
  EXPECT_THAT(CheckCompatible(base, other).message(), HasSubstr("rope_theta"));
}

}  // namespace
}  // namespace tandem::kv
