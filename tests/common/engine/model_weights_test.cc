// Dummy weights (`--load-format dummy`): any configured shape, reproducible, of the stated
// spread, and runnable by the forward pass.
#include "common/engine/model_weights.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/engine/forward.h"
#include "common/kernels/cpu/kernels.h"

namespace tandem::engine {
namespace {

model::ModelConfig SmallConfig() {
  auto config = model::ParseModelConfig(R"({"model_type": "mixtral",
      "hidden_size": 96, "intermediate_size": 160, "num_hidden_layers": 3,
      "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 6,
      "num_experts_per_tok": 2, "vocab_size": 300, "max_position_embeddings": 128,
      "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false})");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

TEST(RandomWeightsTest, ShapesFollowTheConfig) {
  auto w = ModelWeights::Random(SmallConfig(), 7);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelWeights& m = **w;
  EXPECT_EQ(m.embed.rows, 300);
  EXPECT_EQ(m.embed.cols, 96);
  ASSERT_EQ(m.layers.size(), 3u);
  EXPECT_EQ(m.layers[0].attention.q.rows(), 96);
  EXPECT_EQ(m.layers[0].attention.k.rows(), 48);
  EXPECT_EQ(m.layers[0].attention.v.rows(), 48);
  EXPECT_EQ(m.layers[0].attention.v.cols(), 96);
  EXPECT_EQ(m.layers[0].moe.router.rows(), 6);
  ASSERT_EQ(m.layers[2].moe.experts.size(), 6u);
  EXPECT_EQ(m.layers[2].moe.experts[5].down.rows(), 96);
  EXPECT_EQ(m.layers[2].moe.experts[5].down.cols(), 160);
  EXPECT_EQ(m.lm_head.rows(), 300);
  EXPECT_EQ(m.lm_head.cols(), 96);
}

TEST(RandomWeightsTest, ReproducibleInTheSeedWithStandardDeviation002) {
  auto a = ModelWeights::Random(SmallConfig(), 7);
  auto b = ModelWeights::Random(SmallConfig(), 7);
  auto c = ModelWeights::Random(SmallConfig(), 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ((*a)->layers[1].moe.experts[3].up.data, (*b)->layers[1].moe.experts[3].up.data);
  EXPECT_NE((*a)->layers[1].moe.experts[3].up.data, (*c)->layers[1].moe.experts[3].up.data);
  // Different matrices of one model differ too.
  EXPECT_NE((*a)->layers[1].moe.experts[3].up.data, (*a)->layers[1].moe.experts[3].gate.data);
  double sum = 0, sum_sq = 0;
  const auto& data = (*a)->embed.data;
  for (uint16_t bits : data) {
    const double v = kernels::cpu::Bf16ToF32(bits);
    sum += v;
    sum_sq += v * v;
  }
  const double mean = sum / data.size();
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(std::sqrt(sum_sq / data.size() - mean * mean), 0.02, 1e-3);
}

TEST(RandomWeightsTest, ForwardPassRunsOnThem) {
  auto w = ModelWeights::Random(SmallConfig(), 1);
  ASSERT_TRUE(w.ok());
  auto pool = KvBlockPool::Create({3, 2, 24, 16, 8});
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto fwd = ForwardPass::Create(w->get(), pool->get());
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  BlockTable table;
  ASSERT_TRUE(table.Reserve(pool->get(), 20).ok());
  const std::vector<int32_t> ids = {1, 5, 299, 42, 7};
  StepInput in{ids, 0, &table};
  std::vector<std::vector<float>> logits;
  ASSERT_EQ((*fwd)->Step({&in, 1}, {}, &logits), absl::OkStatus());
  ASSERT_EQ(logits[0].size(), 300u);
  for (float v : logits[0]) ASSERT_TRUE(std::isfinite(v));
  EXPECT_GT((*fwd)->last_step_stats().weight_bytes, 0);
  table.ReleaseAll(pool->get());
}

// Every matrix but the experts is read once per step whatever the batch: one sequence or
// three wanting logits read the same attention, router and lm_head bytes.
TEST(RandomWeightsTest, NonExpertWeightsAreReadOncePerStep) {
  auto w = ModelWeights::Random(SmallConfig(), 3);
  ASSERT_TRUE(w.ok());
  auto pool = KvBlockPool::Create({3, 2, 24, 16, 8});
  ASSERT_TRUE(pool.ok());
  auto fwd = ForwardPass::Create(w->get(), pool->get());
  ASSERT_TRUE(fwd.ok());
  std::vector<BlockTable> tables(3);
  for (BlockTable& t : tables) ASSERT_TRUE(t.Reserve(pool->get(), 4).ok());
  const std::vector<int32_t> ids = {5, 17, 250};
  std::vector<StepInput> batch;
  for (int s = 0; s < 3; ++s) batch.push_back({absl::MakeConstSpan(&ids[s], 1), 0, &tables[s]});
  std::vector<std::vector<float>> one, three;
  ASSERT_TRUE((*fwd)->Step(absl::MakeConstSpan(batch).subspan(0, 1), {}, &one).ok());
  const StepStats alone = (*fwd)->last_step_stats();
  ASSERT_TRUE((*fwd)->Step(batch, {}, &three).ok());
  const StepStats together = (*fwd)->last_step_stats();
  EXPECT_EQ(together.weight_bytes - together.expert_weight_bytes,
            alone.weight_bytes - alone.expert_weight_bytes);
  ASSERT_EQ(three.size(), 3u);
  for (int i = 0; i < 300; ++i)
    EXPECT_NEAR(three[0][i], one[0][i], 1e-5 * (1 + std::fabs(one[0][i])));
  for (BlockTable& t : tables) t.ReleaseAll(pool->get());
}

TEST(RandomWeightsTest, RetainedOnlyExpertsAreTheFullModelsAndTheRestAbsent) {
  const model::ModelConfig config = SmallConfig();
  ExpertMask only;
  only.retained.assign(3, std::vector<bool>(6, false));
  only.retained[0] = {true, false, true, false, false, false};
  only.retained[1] = {false, false, false, false, true, true};
  only.retained[2] = {true, true, false, false, false, false};
  auto full = ModelWeights::Random(config, 9);
  auto slim = ModelWeights::Random(config, 9, only);
  ASSERT_TRUE(full.ok() && slim.ok());
  for (int l = 0; l < 3; ++l) {
    for (int e = 0; e < 6; ++e) {
      const ExpertWeights& got = (*slim)->layers[l].moe.experts[e];
      if (only.retained[l][e]) {
        EXPECT_EQ(got.up.data, (*full)->layers[l].moe.experts[e].up.data);
      } else {
        EXPECT_EQ(got.up.rows(), 0);
        EXPECT_TRUE(got.up.data.empty());
      }
    }
  }
  // Matrices after the skipped experts are unchanged too.
  EXPECT_EQ((*slim)->lm_head.data, (*full)->lm_head.data);
  EXPECT_EQ((*slim)->layers[2].attention.q.data, (*full)->layers[2].attention.q.data);
}

// Random weights of the Qwen layouts: q/k norms, biases, a shared expert and its gate on sparse
// layers, a dense MLP and no router on dense ones.
TEST(RandomWeightsTest, QwenLayoutsHaveTheirExtraTensors) {
  auto qwen3 = model::ParseModelConfig(R"({"model_type": "qwen3_moe", "vocab_size": 100,
      "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 12,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 4, "norm_topk_prob": true,
      "mlp_only_layers": [1], "attention_bias": true, "tie_word_embeddings": true})");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  auto w = ModelWeights::Random(*qwen3, 1);
  ASSERT_TRUE(w.ok()) << w.status();
  const LayerWeights& sparse = (*w)->layers[0];
  const LayerWeights& dense = (*w)->layers[1];
  EXPECT_EQ(sparse.attention.q_norm.size(), 16u);
  EXPECT_EQ(sparse.attention.k_norm.size(), 16u);
  EXPECT_EQ(sparse.attention.q_bias.size(), 64u);
  EXPECT_EQ(sparse.attention.o_bias.size(), 32u);
  EXPECT_EQ(sparse.moe.experts.size(), 8u);
  EXPECT_EQ(sparse.moe.router.rows(), 8);
  EXPECT_TRUE(sparse.dense.gate.data.empty());
  EXPECT_TRUE(dense.moe.experts.empty());
  EXPECT_TRUE(dense.moe.router.data.empty());
  EXPECT_EQ(dense.dense.gate.rows(), 64);
  EXPECT_EQ(dense.dense.down.cols(), 64);
  for (int r : {0, 57, 99}) {  // tied: the lm_head is the embedding, packed
    for (int c = 0; c < 32; ++c) {
      EXPECT_EQ((*w)->lm_head.at(r, c), kernels::cpu::Bf16ToF32((*w)->embed.row(r)[c]));
    }
  }

  auto qwen2 = model::ParseModelConfig(R"({"model_type": "qwen2_moe", "vocab_size": 100,
      "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 12,
      "shared_expert_intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4,
      "num_experts": 8, "num_experts_per_tok": 4})");
  ASSERT_TRUE(qwen2.ok()) << qwen2.status();
  w = ModelWeights::Random(*qwen2, 1);
  ASSERT_TRUE(w.ok()) << w.status();
  const LayerWeights& layer = (*w)->layers[0];
  EXPECT_EQ(layer.moe.shared.gate.rows(), 48);
  EXPECT_EQ(layer.moe.shared.down.cols(), 48);
  EXPECT_EQ(layer.moe.shared_gate.rows(), 1);
  EXPECT_EQ(layer.moe.shared_gate.cols(), 32);
  EXPECT_EQ(layer.attention.q_bias.size(), 32u);
  EXPECT_EQ(layer.attention.v_bias.size(), 32u);
  EXPECT_TRUE(layer.attention.o_bias.empty());
  EXPECT_TRUE(layer.attention.q_norm.empty());
}

}  // namespace
}  // namespace tandem::engine
