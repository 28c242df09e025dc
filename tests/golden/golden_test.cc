// Self-consistency of the golden references that tools/train/golden.py wrote from the PyTorch
// model: shapes agree with the manifest and the model, router choices agree with the stored
// probabilities, the stored logits' argmax starts the greedy continuation, and the test-split
// perplexity recomputed from the stored log-probabilities matches the manifest and the model
// card's metrics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "common/model/model_dir.h"
#include "common/model/npy.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace tandem::model {
namespace {

std::string GoldenDir() { return testing::SourceDir() + "/tests/golden/tiny-moe"; }

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

class GoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    manifest_ = ReadJson(GoldenDir() + "/manifest.json");
    ASSERT_FALSE(manifest_.is_discarded()) << "no manifest in " << GoldenDir();
    auto dir = ModelDir::Open(testing::SourceDir() + "/models/tiny-moe");
    ASSERT_TRUE(dir.ok()) << dir.status();
    config_ = (*dir)->config();
  }
  NpyArray Load(const std::string& name) {
    auto array = ReadNpy(GoldenDir() + "/" + name);
    EXPECT_TRUE(array.ok()) << name << ": " << array.status();
    return array.ok() ? *std::move(array) : NpyArray{};
  }
  nlohmann::json manifest_;
  ModelConfig config_;
};

TEST_F(GoldenTest, PromptFilesHaveConsistentShapesAndRouting) {
  const auto& prompts = manifest_["prompts"];
  ASSERT_GE(prompts.size(), 8u);
  const int64_t layers = config_.num_hidden_layers;
  const int64_t experts = config_.num_local_experts;
  const int64_t top_k = config_.num_experts_per_tok;
  for (size_t k = 0; k < prompts.size(); ++k) {
    SCOPED_TRACE(absl::StrCat("prompt ", k));
    const auto ids = prompts[k]["token_ids"].get<std::vector<int>>();
    const auto positions = prompts[k]["logit_positions"].get<std::vector<int>>();
    const auto greedy = prompts[k]["greedy_token_ids"].get<std::vector<int>>();
    const int64_t n = static_cast<int64_t>(ids.size());
    ASSERT_EQ(ids.front(), config_.bos_token_id);
    ASSERT_EQ(positions.back(), n - 1);
    ASSERT_FALSE(greedy.empty());
    ASSERT_LE(greedy.size(), manifest_["greedy_tokens"].get<size_t>());

    const NpyArray logits = Load(absl::StrCat("prompt_", k, "_logits.npy"));
    ASSERT_EQ(logits.shape,
              (std::vector<int64_t>{static_cast<int64_t>(positions.size()), config_.vocab_size}));
    auto values = logits.AsFloat32();
    ASSERT_TRUE(values.ok());
    // The greedy continuation's first token is the argmax of the last stored logits.
    const float* last = values->data() + (positions.size() - 1) * config_.vocab_size;
    EXPECT_EQ(std::max_element(last, last + config_.vocab_size) - last, greedy[0]);
    for (float v : *values) ASSERT_TRUE(std::isfinite(v));

    const NpyArray probs = Load(absl::StrCat("prompt_", k, "_router_probs.npy"));
    const NpyArray chosen = Load(absl::StrCat("prompt_", k, "_experts.npy"));
    const NpyArray weights = Load(absl::StrCat("prompt_", k, "_expert_weights.npy"));
    ASSERT_EQ(probs.shape, (std::vector<int64_t>{layers, n, experts}));
    ASSERT_EQ(chosen.shape, (std::vector<int64_t>{layers, n, top_k}));
    ASSERT_EQ(weights.shape, (std::vector<int64_t>{layers, n, top_k}));
    auto p = probs.AsFloat32();
    auto c = chosen.AsInt32();
    auto w = weights.AsFloat32();
    ASSERT_TRUE(p.ok() && c.ok() && w.ok());
    for (int64_t row = 0; row < layers * n; ++row) {
      const float* pr = p->data() + row * experts;
      EXPECT_NEAR(std::accumulate(pr, pr + experts, 0.0), 1.0, 1e-4);
      // The chosen experts are the top-k by probability and the weights are their
      // probabilities renormalised (Mixtral's rule).
      std::vector<int> order(experts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pr[a] > pr[b]; });
      double mass = 0;
      for (int64_t j = 0; j < top_k; ++j) mass += pr[(*c)[row * top_k + j]];
      for (int64_t j = 0; j < top_k; ++j) {
        const int e = (*c)[row * top_k + j];
        ASSERT_GE(e, 0);
        ASSERT_LT(e, experts);
        EXPECT_FLOAT_EQ(pr[e], pr[order[j]]);
        EXPECT_NEAR((*w)[row * top_k + j], pr[e] / mass, 1e-5);
      }
    }
  }
}

TEST_F(GoldenTest, TestPerplexityFromStoredLogProbsMatchesManifestAndCard) {
  const NpyArray logprobs = Load("test_logprobs.npy");
  auto values = logprobs.AsFloat64();
  ASSERT_TRUE(values.ok());
  ASSERT_EQ(static_cast<int64_t>(values->size()), manifest_["test_split"]["tokens"].get<int64_t>());
  double sum = 0;
  for (double v : *values) {
    ASSERT_LE(v, 0.0);
    sum += v;
  }
  const double perplexity = std::exp(-sum / values->size());
  EXPECT_NEAR(perplexity, manifest_["test_split"]["perplexity"].get<double>(), 1e-4 * perplexity);
  const nlohmann::json metrics =
      ReadJson(testing::SourceDir() + "/models/tiny-moe/eval/metrics.json");
  ASSERT_FALSE(metrics.is_discarded());
  EXPECT_EQ(metrics["test"]["tokens"].get<int64_t>(), static_cast<int64_t>(values->size()));
  EXPECT_NEAR(perplexity, metrics["test"]["perplexity"].get<double>(), 1e-3 * perplexity);
}

}  // namespace
}  // namespace tandem::model
