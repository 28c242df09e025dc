// Calibration statistics on a hand-checkable toy: a small random model whose router is replaced
// by a stated one (token at position p of layer l goes to experts (p + l) % 4 first and
// (p + l + 1) % 4 second, with logits 3 and 2, the others 0), so frequencies, routing mass and
// pair counts are known exactly; and on the shipped model, a deterministic JSON round trip.
#include "common/moe/calibration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include "common/engine/generator.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::moe {
namespace {

constexpr int kExperts = 4;

class RotatingRouter : public engine::RouterOverride {
 public:
  void Logits(int layer, int32_t, int position, absl::Span<float> logits) const override {
    std::fill(logits.begin(), logits.end(), 0.0f);
    logits[(position + layer) % kExperts] = 3.0f;
    logits[(position + layer + 1) % kExperts] = 2.0f;
  }
};

TEST(CalibratorTest, ToyCountsMassAndPairsAreExact) {
  auto config = model::ParseModelConfig(R"({"model_type": "mixtral", "hidden_size": 32,
      "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
      "vocab_size": 50, "max_position_embeddings": 64, "tie_word_embeddings": false})");
  ASSERT_TRUE(config.ok()) << config.status();
  auto weights = engine::ModelWeights::Random(*config, 3);
  ASSERT_TRUE(weights.ok());
  auto pool = engine::KvBlockPool::Create({2, 2, 8, 16, 8});
  ASSERT_TRUE(pool.ok());
  auto forward = engine::ForwardPass::Create(weights->get(), pool->get());
  ASSERT_TRUE(forward.ok());
  (*forward)->SetRouterOverride(std::make_unique<RotatingRouter>());
  Calibrator calibrator(*config);
  (*forward)->SetExpertObserver(&calibrator);

  const std::vector<int32_t> ids = {1, 7, 9, 11, 13, 17, 19, 23, 29, 31};  // positions 0..9
  engine::BlockTable table;
  ASSERT_TRUE(table.Reserve(pool->get(), static_cast<int>(ids.size())).ok());
  engine::StepInput in{ids, 0, &table, engine::LogitRows::kNone};
  std::vector<std::vector<float>> logits;
  engine::RouterTrace trace;
  ASSERT_EQ((*forward)->Step({&in, 1}, {}, &logits, &trace), absl::OkStatus());
  ASSERT_EQ(calibrator.AddStep(trace), absl::OkStatus());
  const CalibrationStats stats = calibrator.Finish();
  EXPECT_EQ(stats.tokens, 10);

  // softmax([3, 2, 0, 0]): the first choice's and the second's probability.
  const double z = std::exp(3.0) + std::exp(2.0) + 2.0;
  const double g1 = std::exp(3.0) / z, g2 = std::exp(2.0) / z;
  for (int l = 0; l < 2; ++l) {
    const LayerStats& layer = stats.layers[l];
    std::vector<int64_t> first(kExperts), second(kExperts);
    std::map<std::pair<int, int>, int64_t> pairs, a_first;
    for (int p = 0; p < 10; ++p) {
      const int a = (p + l) % kExperts, b = (p + l + 1) % kExperts;
      ++first[a];
      ++second[b];
      ++pairs[{std::min(a, b), std::max(a, b)}];
      if (a < b) ++a_first[{a, b}];  // a, the first choice, is the lower index
    }
    for (int e = 0; e < kExperts; ++e) {
      EXPECT_EQ(layer.frequency[e], first[e] + second[e]) << "layer " << l << " expert " << e;
      EXPECT_NEAR(layer.mass[e], first[e] * g1 + second[e] * g2, 1e-5);
      // REAP * f = g1 * (norms as first choice) + g2 * (norms as second): between g2 and g1
      // times EAN.
      EXPECT_GT(layer.ean[e], 0);
      EXPECT_LE(layer.reap[e] * layer.frequency[e], g1 * layer.ean[e] * (1 + 1e-6));
      EXPECT_GE(layer.reap[e] * layer.frequency[e], g2 * layer.ean[e] * (1 - 1e-6));
      double importance = 0;
      for (double v : layer.neuron_importance[e]) importance += v;
      EXPECT_GT(importance, 0);
    }
    EXPECT_EQ(layer.pairs, pairs);
    EXPECT_EQ(layer.pair_a_first, a_first);
  }
  table.ReleaseAll(pool->get());
}

// Top-3 on a Qwen2-MoE layout with a shared expert and a dense first layer: every routed
// expert counts, but only the leading pair (the two highest weights) is a pair; the dense layer
// routes nothing and the token count is still the step's.
TEST(CalibratorTest, TopKCountsTheLeadingPairAndSkipsDenseLayers) {
  auto config = model::ParseModelConfig(R"({"model_type": "qwen2_moe", "hidden_size": 32,
      "intermediate_size": 40, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 16,
      "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
      "num_experts": 4, "num_experts_per_tok": 3, "mlp_only_layers": [0], "vocab_size": 50,
      "max_position_embeddings": 64})");
  ASSERT_TRUE(config.ok()) << config.status();
  auto weights = engine::ModelWeights::Random(*config, 3);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto pool = engine::KvBlockPool::Create({3, 2, 8, 16, 8});
  ASSERT_TRUE(pool.ok());
  auto forward = engine::ForwardPass::Create(weights->get(), pool->get());
  ASSERT_TRUE(forward.ok());
  (*forward)->SetRouterOverride(std::make_unique<RotatingRouter>());
  Calibrator calibrator(*config);
  (*forward)->SetExpertObserver(&calibrator);
  const std::vector<int32_t> ids = {1, 7, 9, 11, 13, 17, 19, 23};
  engine::BlockTable table;
  ASSERT_TRUE(table.Reserve(pool->get(), static_cast<int>(ids.size())).ok());
  engine::StepInput in{ids, 0, &table, engine::LogitRows::kNone};
  std::vector<std::vector<float>> logits;
  engine::RouterTrace trace;
  ASSERT_EQ((*forward)->Step({&in, 1}, {}, &logits, &trace), absl::OkStatus());
  ASSERT_EQ(calibrator.AddStep(trace), absl::OkStatus());
  const CalibrationStats stats = calibrator.Finish();
  EXPECT_EQ(stats.tokens, 8);
  const LayerStats& dense = stats.layers[0];
  EXPECT_TRUE(dense.pairs.empty());
  for (int64_t f : dense.frequency) EXPECT_EQ(f, 0);
  for (int l = 1; l < 3; ++l) {
    const LayerStats& layer = stats.layers[l];
    std::map<std::pair<int, int>, int64_t> pairs;
    int64_t routed = 0;
    for (int p = 0; p < 8; ++p) {
      const int a = (p + l) % kExperts, b = (p + l + 1) % kExperts;
      ++pairs[{std::min(a, b), std::max(a, b)}];  // the third expert (logit 0) is no pair
    }
    for (int64_t f : layer.frequency) routed += f;
    EXPECT_EQ(routed, 8 * 3) << "layer " << l;  // all three routed experts count
    EXPECT_EQ(layer.pairs, pairs) << "layer " << l;
  }
  table.ReleaseAll(pool->get());
}

TEST(CalibrateTest, ShippedModelIsDeterministicAndRoundTripsThroughJson) {
  auto loaded =
      engine::LoadModelDir(*testing::OpenModelDir(testing::SourceDir() + "/models/tiny-moe"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const auto& c = loaded->weights->config;
  auto pool = engine::KvBlockPool::Create({static_cast<int>(c.num_hidden_layers),
                                           static_cast<int>(c.num_key_value_heads),
                                           static_cast<int>(c.head_dim), 16, 64});
  ASSERT_TRUE(pool.ok());
  auto forward = engine::ForwardPass::Create(loaded->weights.get(), pool->get());
  ASSERT_TRUE(forward.ok());
  testing::TempDir dir;
  const std::string text = dir.path() + "/calibration.txt";
  std::ofstream(text) << "The jury said it did find that the election was conducted well.\n\n"
                      << "She opened the door and looked out at the garden.\n";
  double last_progress = 0;
  auto a =
      Calibrate(forward->get(), *loaded->tokenizer, text, [&](double p) { last_progress = p; });
  auto b = Calibrate(forward->get(), *loaded->tokenizer, text);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(last_progress, 1.0);
  EXPECT_EQ(a->ToJson(), b->ToJson());
  EXPECT_EQ(a->text_sha256, "176c1e7db44b561b24909612d53bac9c266dcb717af0145c3d20be059a59560d");
  EXPECT_GT(a->tokens, 20);
  int64_t routed = 0;
  for (int64_t f : a->layers[0].frequency) routed += f;
  EXPECT_EQ(routed, a->tokens * c.num_experts_per_tok);
  auto back = CalibrationStats::FromJson(a->ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), a->ToJson());
  EXPECT_EQ(pool->get()->num_free(), pool->get()->num_total());

  EXPECT_EQ(CalibrationStats::FromJson(nlohmann::json::object()).status().code(),
            absl::StatusCode::kInvalidArgument);
  nlohmann::json broken = a->ToJson();
  broken["layers"][0]["mass"].erase(0);
  EXPECT_EQ(CalibrationStats::FromJson(broken).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      Calibrate(forward->get(), *loaded->tokenizer, dir.path() + "/missing.txt").status().code(),
      absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::moe
