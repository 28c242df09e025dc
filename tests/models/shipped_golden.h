// What every shipped model's test checks against its golden references (tests/golden/MODEL,
// written by tools/train/golden.py from the PyTorch model that trained it): the prompts' logits
// through the paged cache in chunks of 7 tokens and their greedy continuations decoded from the
// cache, and the test split's perplexity and per-token log-probabilities.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine/forward.h"
#include "common/engine/generator.h"
#include "common/engine/perplexity.h"
#include "common/model/npy.h"
#include "nlohmann/json.hpp"
#include "tests/testing/golden.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::engine::shipped {

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Each golden prompt prefilled in chunks of 7 (every row's logits compared at the stored
// positions), then its greedy continuation decoded one token a step from the cache.
inline void ExpectPromptGoldens(const ModelWeights& weights, const std::string& golden_dir) {
  const nlohmann::json manifest = ReadJson(golden_dir + "/manifest.json");
  ASSERT_FALSE(manifest.is_discarded()) << golden_dir;
  const model::ModelConfig& c = weights.config;
  auto pool = KvBlockPool::Create(KvCacheConfigFor(c, /*block_size=*/16, /*num_blocks=*/64,
                                                   kernels::KvDtype::kF32, /*max_sequences=*/1));
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto forward = ForwardPass::Create(&weights, pool->get());
  ASSERT_TRUE(forward.ok()) << forward.status();
  const int vocab = static_cast<int>(c.vocab_size);
  double worst = 0;
  for (size_t k = 0; k < manifest["prompts"].size(); ++k) {
    SCOPED_TRACE(absl::StrCat("prompt ", k));
    const auto& prompt = manifest["prompts"][k];
    const auto ids = prompt["token_ids"].get<std::vector<int32_t>>();
    const auto positions = prompt["logit_positions"].get<std::vector<int>>();
    const auto greedy = prompt["greedy_token_ids"].get<std::vector<int32_t>>();
    auto golden = model::ReadNpy(absl::StrCat(golden_dir, "/prompt_", k, "_logits.npy"));
    ASSERT_TRUE(golden.ok()) << golden.status();
    const std::vector<float> expected = *golden->AsFloat32();
    BlockTable table;
    ASSERT_TRUE(table.Reserve(pool->get(), static_cast<int>(ids.size() + greedy.size())).ok());
    std::vector<float> rows;
    std::vector<std::vector<float>> logits;
    for (size_t start = 0; start < ids.size(); start += 7) {
      const size_t n = std::min<size_t>(7, ids.size() - start);
      StepInput in{absl::MakeConstSpan(ids).subspan(start, n), static_cast<int>(start), &table,
                   LogitRows::kAll};
      ASSERT_TRUE((*forward)->Step({&in, 1}, {}, &logits).ok());
      rows.insert(rows.end(), logits[0].begin(), logits[0].end());
    }
    for (size_t i = 0; i < positions.size(); ++i) {
      const double error = testing::NormalisedRowError(
          &rows[static_cast<size_t>(positions[i]) * vocab], &expected[i * vocab], vocab);
      worst = std::max(worst, error);
      EXPECT_LT(error, testing::kLogitTolerance) << "position " << positions[i];
    }
    std::vector<float> last(rows.end() - vocab, rows.end());
    std::vector<int32_t> generated;
    for (size_t i = 0; i < greedy.size(); ++i) {
      generated.push_back(
          static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
      if (i + 1 == greedy.size()) break;
      StepInput in{absl::MakeConstSpan(&generated.back(), 1), static_cast<int>(ids.size() + i),
                   &table};
      ASSERT_TRUE((*forward)->Step({&in, 1}, {}, &logits).ok());
      last = logits[0];
    }
    EXPECT_EQ(generated, greedy);
    table.ReleaseAll(pool->get());
  }
  std::cout << "worst normalised logit error " << worst << "\n";
}

// The engine's perplexity of the test split equals the golden one and the model card's, and
// at most `max_beyond` tokens' log-probabilities differ from PyTorch's by more than 1e-4 (a
// router near-tie may go the other way in a few windows).
inline void ExpectTestSplitGoldens(const LoadedModel& model, const std::string& model_dir,
                                   const std::string& golden_dir, int max_beyond) {
  const nlohmann::json manifest = ReadJson(golden_dir + "/manifest.json");
  ASSERT_FALSE(manifest.is_discarded()) << golden_dir;
  const nlohmann::json& split = manifest["test_split"];
  auto result = EvaluatePerplexity(*model.weights, *model.tokenizer,
                                   testing::SourceDir() + "/" + split["file"].get<std::string>());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tokens, split["tokens"].get<int64_t>());
  EXPECT_NEAR(result->nll, split["nll"].get<double>(), 1e-5);
  const nlohmann::json metrics = ReadJson(model_dir + "/eval/metrics.json");
  EXPECT_NEAR(result->perplexity, metrics["test"]["perplexity"].get<double>(),
              1e-3 * result->perplexity);
  auto golden = model::ReadNpy(golden_dir + "/test_logprobs.npy");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::vector<float> expected = *golden->AsFloat32();
  ASSERT_EQ(result->logprobs.size(), expected.size());
  int beyond = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    beyond += std::fabs(static_cast<double>(result->logprobs[i]) - expected[i]) > 1e-4;
  }
  EXPECT_LE(beyond, max_beyond) << "log-probabilities more than 1e-4 from PyTorch's";
  std::cout << "perplexity " << result->perplexity << ", " << beyond << " beyond 1e-4\n";
}

}  // namespace tandem::engine::shipped
