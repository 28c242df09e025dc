// Neuron reordering: the order itself, a reordered checkpoint of the shipped model that computes
// the same logits at full width (to float rounding) with every other tensor byte-identical, and
// whose narrow widths keep the important neurons (closer to the full model than the same width
// of the original order); bad statistics and an in-place target are refused.
#include "common/moe/reorder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <random>
#include <utility>

#include "common/engine/forward.h"
#include "common/engine/generator.h"
#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/testing/kernels.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::moe {
namespace {

using ::testing::ElementsAre;

class ConstantWidth : public engine::ExpertWidthPolicy {
 public:
  explicit ConstantWidth(int width) : width_(width) {}
  void Widths(int, absl::Span<const int32_t>, absl::Span<float>,
              absl::Span<int> widths) const override {
    for (int& w : widths) w = width_;
  }

 private:
  int width_;
};

TEST(NeuronOrderTest, DescendingWithTiesToTheLowerIndex) {
  EXPECT_THAT(NeuronOrder({1.0, 3.0, 3.0, 0.0}), ElementsAre(1, 2, 0, 3));
}

// The last-token logits of `prompt` under `moe`.
std::vector<float> Logits(const engine::ModelWeights& weights, const std::vector<int32_t>& prompt,
                          const engine::MoeOptions& moe) {
  const auto& c = weights.config;
  auto pool = engine::KvBlockPool::Create(
      engine::KvCacheConfigFor(c, 16, 32, kernels::KvDtype::kF32, /*max_sequences=*/1));
  EXPECT_TRUE(pool.ok());
  auto forward = engine::ForwardPass::Create(&weights, pool->get());
  EXPECT_TRUE(forward.ok());
  engine::BlockTable table;
  EXPECT_TRUE(table.Reserve(pool->get(), static_cast<int>(prompt.size())).ok());
  engine::StepInput in{prompt, 0, &table};
  std::vector<std::vector<float>> logits;
  EXPECT_EQ((*forward)->Step({&in, 1}, moe, &logits), absl::OkStatus());
  table.ReleaseAll(pool->get());
  return logits.empty() ? std::vector<float>() : logits[0];
}

double MaxError(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 1e-6;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return err / scale;
}

TEST(ReorderCheckpointTest, FunctionIdenticalAtFullWidthAndImportantNeuronsFirst) {
  testing::UseExactKernels();  // identical to float32 rounding
  const std::string dir = testing::SourceDir() + "/models/tiny-moe";
  std::ifstream in(dir + "/pruning/calibration-valid.json");
  auto stats = CalibrationStats::FromJson(nlohmann::json::parse(in));
  ASSERT_TRUE(stats.ok()) << stats.status();
  testing::TempDir out;
  const std::string reordered_dir = out.path() + "/tiny-moe-reordered";
  ASSERT_EQ(ReorderCheckpoint(*testing::OpenModelDir(dir), *stats, reordered_dir),
            absl::OkStatus());

  auto original =
      engine::LoadModelWeights(*testing::OpenModelDir(dir), engine::LoadFormat::kSafetensors);
  auto reordered = engine::LoadModelWeights(*testing::OpenModelDir(reordered_dir),
                                            engine::LoadFormat::kSafetensors);
  ASSERT_TRUE(original.ok() && reordered.ok()) << reordered.status();
  const auto& c = (*original)->config;
  const int inter = static_cast<int>(c.intermediate_size);
  const int hidden = static_cast<int>(c.hidden_size);
  // Neuron order[i] became neuron i: gate/up rows and down columns moved together.
  const std::vector<int> order = NeuronOrder(stats->layers[3].neuron_importance[5]);
  const engine::ExpertWeights& a = (*original)->layers[3].moe.experts[5];
  const engine::ExpertWeights& b = (*reordered)->layers[3].moe.experts[5];
  for (int i : {0, 1, inter - 1}) {
    for (int j = 0; j < hidden; ++j) {
      ASSERT_EQ(b.gate.at(i, j), a.gate.at(order[i], j)) << i << "," << j;
      ASSERT_EQ(b.up.at(i, j), a.up.at(order[i], j)) << i << "," << j;
    }
    EXPECT_EQ(b.down.at(7, i), a.down.at(7, order[i]));
  }
  EXPECT_EQ((*reordered)->embed.data, (*original)->embed.data);
  EXPECT_TRUE((*reordered)->layers[2].moe.router.data == (*original)->layers[2].moe.router.data);
  auto file = model::SafetensorsFile::Open(reordered_dir + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->metadata().at("tandem.calibration_text_sha256"), stats->text_sha256);
  EXPECT_TRUE(std::filesystem::exists(reordered_dir + "/tokenizer.model"));
  EXPECT_TRUE(*IsReordered(*testing::OpenModelDir(reordered_dir)));
  EXPECT_FALSE(*IsReordered(*testing::OpenModelDir(dir)));

  std::ifstream golden(testing::SourceDir() + "/tests/golden/tiny-moe/manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(golden);
  const ConstantWidth quarter(inter / 4);
  double err_reordered = 0, err_original = 0;
  for (const auto& prompt : manifest["prompts"]) {
    const auto ids = prompt["token_ids"].get<std::vector<int32_t>>();
    const std::vector<float> full = Logits(**original, ids, {});
    EXPECT_LT(MaxError(Logits(**reordered, ids, {}), full), 1e-5);
    err_reordered += MaxError(Logits(**reordered, ids, {.widths = &quarter}), full);
    err_original += MaxError(Logits(**original, ids, {.widths = &quarter}), full);
  }
  // A quarter of the neurons, chosen by importance, stays closer to the full model than the
  // first quarter in training order.
  EXPECT_LT(err_reordered, err_original);
  std::cout << "quarter width, summed normalised error: reordered " << err_reordered
            << ", original order " << err_original << "\n";

  CalibrationStats short_stats = *stats;
  short_stats.layers.pop_back();
  EXPECT_EQ(ReorderCheckpoint(*testing::OpenModelDir(dir), short_stats, out.path() + "/x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReorderCheckpoint(*testing::OpenModelDir(dir), *stats, dir).code(),
            absl::StatusCode::kInvalidArgument);
}

// A checkpoint storing its experts stacked (Qwen3.5-MoE as published) is reordered an expert
// at a time and written one tensor each (the tensors the engine skips carried over as they
// are): the same logits at full width, each expert's neurons in its own order.
// Qwen3.5's stacked experts (gate rows, then up rows) and gpt-oss's (x @ W, gate and up in
// alternate columns, with biases, whose gate and up entries move with their neurons).
class StackedReorderTest : public ::testing::TestWithParam<const char*> {};

TEST_P(StackedReorderTest, StackedExpertsAreWrittenOneTensorEach) {
  testing::UseExactKernels();
  const std::string dir = testing::SourceDir() + "/tests/golden/arch/" + GetParam();
  const std::unique_ptr<model::ModelDir> model_dir = testing::OpenModelDir(dir);
  const model::ModelConfig& config = model_dir->config();
  const int inter = static_cast<int>(config.intermediate_size);
  CalibrationStats stats;
  stats.text = "random importance";
  stats.layers.resize(config.num_hidden_layers);
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> unit(0, 1);
  for (auto& layer : stats.layers) {
    layer.neuron_importance.assign(config.num_local_experts, std::vector<double>(inter));
    for (auto& expert : layer.neuron_importance) {
      for (double& x : expert) x = unit(rng);
    }
  }
  testing::TempDir out;
  const std::string reordered_dir = out.path() + "/reordered";
  ASSERT_EQ(ReorderCheckpoint(*testing::OpenModelDir(dir), stats, reordered_dir), absl::OkStatus());
  auto file = model::SafetensorsFile::Open(reordered_dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  bool skipped_kept = false;
  for (const std::string& name : (*file)->Names()) {
    EXPECT_EQ(name.find("gate_up_proj"), std::string::npos) << name;
    skipped_kept |= name.starts_with("mtp.");
  }
  EXPECT_EQ(skipped_kept, config.arch->model_type == "qwen3_5_moe");

  auto original =
      engine::LoadModelWeights(*testing::OpenModelDir(dir), engine::LoadFormat::kSafetensors);
  auto reordered = engine::LoadModelWeights(*testing::OpenModelDir(reordered_dir),
                                            engine::LoadFormat::kSafetensors);
  ASSERT_TRUE(original.ok() && reordered.ok()) << reordered.status();
  const int hidden = static_cast<int>(config.hidden_size);
  const int last = static_cast<int>(config.num_hidden_layers) - 1;
  for (auto [l, e] : {std::pair{0, 1}, std::pair{last, 6}}) {
    const std::vector<int> order = NeuronOrder(stats.layers[l].neuron_importance[e]);
    const engine::ExpertWeights& a = (*original)->layers[l].moe.experts[e];
    const engine::ExpertWeights& b = (*reordered)->layers[l].moe.experts[e];
    for (int i = 0; i < inter; ++i) {
      for (int j = 0; j < hidden; ++j) {
        ASSERT_EQ(b.gate.at(i, j), a.gate.at(order[i], j)) << l << "," << e << "," << i;
        ASSERT_EQ(b.up.at(i, j), a.up.at(order[i], j)) << l << "," << e << "," << i;
        ASSERT_EQ(b.down.at(j, i), a.down.at(j, order[i])) << l << "," << e << "," << i;
      }
      if (config.expert_bias) {
        ASSERT_EQ(b.gate_bias[i], a.gate_bias[order[i]]) << l << "," << e << "," << i;
        ASSERT_EQ(b.up_bias[i], a.up_bias[order[i]]) << l << "," << e << "," << i;
      }
    }
    EXPECT_EQ(b.down_bias, a.down_bias);
  }
  std::ifstream golden(dir + "/golden.json");
  const auto ids = nlohmann::json::parse(golden)["token_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), 40));
  EXPECT_LT(MaxError(Logits(**reordered, prompt, {}), Logits(**original, prompt, {})), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Layouts, StackedReorderTest,
                         ::testing::Values("qwen3_5_moe_hybrid", "gpt_oss_sinks_windows",
                                           "gemma4_moe"));

}  // namespace
}  // namespace tandem::moe
