// tandem eval's parts: the statistics of hand-built continuations (lengths, percentiles, the
// budget and never-ended shares, agreement), the modes' phase options, greedy generation through
// the scheduler against the PyTorch reference's greedy tokens, the handoff's first token coming
// from the full prefill, and prompt files.
#include "common/moe/evaluation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "common/engine/generator.h"
#include "common/moe/pruning_plan.h"
#include "nlohmann/json.hpp"
#include "tests/testing/kernels.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::moe {
namespace {

using ::testing::ElementsAre;

TEST(SummarizeTest, HandBuiltContinuations) {
  // Lengths 2, 3, 5, 8 (sorted); the last never ends; budget 4.
  const std::vector<Continuation> ref = {{{1, 2}, true},
                                         {{1, 2, 3}, true},
                                         {{1, 2, 3, 4, 5}, true},
                                         {{9, 9, 9, 9, 9, 9, 9, 9}, false}};
  const std::vector<Continuation> ours = {
      {{1, 2}, true},           // identical
      {{1, 7, 3}, true},        // differs at 1 of 3: prefix 1/3
      {{1, 2, 3, 4, 6}, true},  // identical within the budget of 4
      {{9, 9}, true}};          // 2 of the reference's 4 (cut) tokens
  const GenerationStats full = Summarize(ref, nullptr, 4);
  EXPECT_EQ(full.prompts, 4);
  EXPECT_DOUBLE_EQ(full.mean_length, 4.5);
  EXPECT_EQ(full.p50_length, 3);              // nearest rank: the 2nd of 4
  EXPECT_EQ(full.p90_length, 8);              // the 4th of 4
  EXPECT_DOUBLE_EQ(full.hit_max_share, 0.5);  // lengths 5 and 8 exceed the budget
  EXPECT_DOUBLE_EQ(full.never_ended_share, 0.25);
  EXPECT_EQ(full.exact_agreement, 1);

  const GenerationStats s = Summarize(ours, &ref, 4);
  EXPECT_DOUBLE_EQ(s.exact_agreement, 0.5);
  EXPECT_DOUBLE_EQ(s.prefix_agreement, (1 + 1.0 / 3 + 1 + 0.5) / 4);
  EXPECT_DOUBLE_EQ(s.hit_max_share, 0.25);
  EXPECT_DOUBLE_EQ(s.never_ended_share, 0);
}

TEST(ScoreNearPromptTest, OnlyTokensBeforeTheOffset) {
  engine::PerplexityResult result;
  result.logprobs = {-1.0f, -3.0f, -100.0f, -2.0f};
  result.top1 = {1, 0, 1, 0};
  result.offsets = {0, 1, 2, 0};
  const ScoreSummary near = ScoreNearPrompt(result, 2);
  EXPECT_EQ(near.tokens, 3);
  EXPECT_NEAR(near.perplexity, std::exp(2.0), 1e-9);
  EXPECT_NEAR(near.accuracy, 1.0 / 3, 1e-12);
  EXPECT_EQ(ScoreNearPrompt(result, 0).tokens, 0);
}

TEST(EvalModeTest, PhaseOptionsOfEachMode) {
  engine::ExpertMask plan;
  const PhaseOptions full = PhaseOptionsFor(EvalMode::kFull, &plan);
  EXPECT_EQ(full.prefill.mask, nullptr);
  EXPECT_EQ(full.decode.mask, nullptr);
  const PhaseOptions conventional = PhaseOptionsFor(EvalMode::kConventional, &plan);
  EXPECT_EQ(conventional.prefill.mask, &plan);
  EXPECT_EQ(conventional.decode.mask, &plan);
  const PhaseOptions handoff = PhaseOptionsFor(EvalMode::kHandoff, &plan);
  EXPECT_EQ(handoff.prefill.mask, nullptr);
  EXPECT_EQ(handoff.decode.mask, &plan);
  for (const char* name : {"full", "conventional", "handoff"}) {
    auto mode = ParseEvalMode(name);
    ASSERT_TRUE(mode.ok());
    EXPECT_EQ(EvalModeName(*mode), name);
  }
  EXPECT_EQ(ParseEvalMode("pruned").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GenerateGreedyTest, FullModeGivesTheReferenceTokensAndHandoffStartsWithThem) {
  testing::UseExactKernels();
  const std::string dir = testing::SourceDir() + "/models/tiny-moe";
  auto model = engine::LoadModelDir(*testing::OpenModelDir(dir));
  ASSERT_TRUE(model.ok()) << model.status();
  std::ifstream in(testing::SourceDir() + "/tests/golden/tiny-moe/manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(in);
  std::vector<std::vector<int32_t>> prompts;
  for (int k = 0; k < 4; ++k) {
    prompts.push_back(manifest["prompts"][k]["token_ids"].get<std::vector<int32_t>>());
  }
  GenerationOptions options;
  options.max_running = 3;  // a queue as well as a batch
  auto full = GenerateGreedy(*model->weights, *model->tokenizer, prompts,
                             PhaseOptionsFor(EvalMode::kFull, nullptr), options);
  ASSERT_TRUE(full.ok()) << full.status();
  for (int k = 0; k < 4; ++k) {
    const auto want = manifest["prompts"][k]["greedy_token_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t>& got = (*full)[k].tokens;
    ASSERT_GE(got.size(), want.size()) << "prompt " << k;
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + want.size()), want) << "prompt " << k;
    // Without EOS, a continuation runs to the context's end.
    if (!(*full)[k].ended) {
      EXPECT_EQ(prompts[k].size() + got.size(), 512u);
    }
  }

  auto plan = LoadPlanMask(dir + "/pruning/reap-keep4.json", *testing::OpenModelDir(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  options.max_running = 4;
  options.stop = {"."};
  auto handoff = GenerateGreedy(*model->weights, *model->tokenizer, prompts,
                                PhaseOptionsFor(EvalMode::kHandoff, &*plan), options);
  ASSERT_TRUE(handoff.ok()) << handoff.status();
  int differ = 0;
  for (int k = 0; k < 4; ++k) {
    ASSERT_FALSE((*handoff)[k].tokens.empty());
    EXPECT_EQ((*handoff)[k].tokens[0], (*full)[k].tokens[0]) << "prompt " << k;
    differ += (*handoff)[k].tokens != (*full)[k].tokens;
  }
  EXPECT_GT(differ, 0);

  options.stop = {"a", "b", "c", "d", "e"};  // more than a request may carry
  EXPECT_EQ(
      GenerateGreedy(*model->weights, *model->tokenizer, prompts, {}, options).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(ReadPromptsTest, NonBlankLinesTokenizedWithBos) {
  auto model =
      engine::LoadModelDir(*testing::OpenModelDir(testing::SourceDir() + "/models/tiny-moe"));
  ASSERT_TRUE(model.ok());
  testing::TempDir dir;
  std::ofstream(dir.path() + "/p.txt") << "The jury said\r\n\n   \nA night\n";
  auto prompts = ReadPrompts(*model->tokenizer, dir.path() + "/p.txt", true);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), 2u);
  auto jury = model->tokenizer->Encode("The jury said");
  ASSERT_TRUE(jury.ok());
  jury->insert(jury->begin(), model->tokenizer->bos_id());
  EXPECT_EQ((*prompts)[0], *jury);
  std::ofstream(dir.path() + "/blank.txt") << "\n \n";
  EXPECT_EQ(ReadPrompts(*model->tokenizer, dir.path() + "/blank.txt", true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadPrompts(*model->tokenizer, dir.path() + "/none.txt", true).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::moe
