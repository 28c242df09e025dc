#include "common/model/generation_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(GenerationConfigTest, ReadsDefaultsAndEveryEosToken) {
  // Qwen3's published generation_config.json.
  auto qwen = ParseGenerationConfig(R"({"bos_token_id": 151643, "do_sample": true,
      "eos_token_id": [151645, 151643], "pad_token_id": 151643, "temperature": 0.6,
      "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"})");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_THAT(qwen->eos_token_ids, ElementsAre(151645, 151643));
  EXPECT_DOUBLE_EQ(*qwen->temperature, 0.6);
  EXPECT_EQ(*qwen->top_k, 20);
  EXPECT_DOUBLE_EQ(*qwen->top_p, 0.95);
  EXPECT_FALSE(qwen->repetition_penalty.has_value());
  EXPECT_FALSE(qwen->max_new_tokens.has_value());

  // The shipped model's, as its directory reads it.
  const std::unique_ptr<ModelDir> tiny =
      testing::OpenModelDir(testing::SourceDir() + "/models/tiny-moe");
  const GenerationDefaults& shipped = tiny->generation();
  EXPECT_THAT(shipped.eos_token_ids, ElementsAre(2));
  EXPECT_EQ(*shipped.max_new_tokens, 128);
  EXPECT_THAT(shipped.stop_strings, ElementsAre("\""));
}

TEST(GenerationConfigTest, BadValuesNameTheKey) {
  for (const auto& [bad, key] :
       {std::pair{R"({"eos_token_id": "x"})", "eos_token_id"},
        std::pair{R"({"eos_token_id": [1, -2]})", "eos_token_id"},
        std::pair{R"({"temperature": 9})", "temperature"}, std::pair{R"({"top_p": 0})", "top_p"},
        std::pair{R"({"top_k": 1.5})", "top_k"},
        std::pair{R"({"stop_strings": [""]})", "stop_strings"},
        std::pair{"[1]", "not a JSON object"}}) {
    auto parsed = ParseGenerationConfig(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr(key)) << bad;
  }
}

}  // namespace
}  // namespace tandem::model
