// Pruning plans: each criterion keeps the experts its score ranks highest (hand-made
// statistics), plans that do not fit the model are refused with the reason, the mask matches
// the plan, and plans survive a round trip through their JSON file.
#include "common/moe/pruning_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::moe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

model::ModelConfig Config() {
  auto config = model::ParseModelConfig(R"({"model_type": "mixtral", "hidden_size": 32,
      "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
      "vocab_size": 50, "max_position_embeddings": 64})");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// Each criterion ranks the four experts of layer 0 differently.
CalibrationStats Stats() {
  CalibrationStats stats;
  stats.model = "toy";
  stats.text = "calibration.txt";
  stats.text_sha256 = "00ff";
  stats.tokens = 100;
  LayerStats layer;
  layer.frequency = {50, 10, 90, 50};  // top 2: 2, then 0 (tie with 3, lower index)
  layer.mass = {1.0, 9.0, 2.0, 8.0};   // top 2: 1, 3
  layer.ean = {7.0, 1.0, 1.0, 9.0};    // top 2: 3, 0
  layer.reap = {0.1, 0.3, 0.2, 0.0};   // top 2: 1, 2
  layer.neuron_importance.assign(4, std::vector<double>(24, 0));
  stats.layers = {layer, layer};
  return stats;
}

std::vector<int> Retained(const tandem::v1::PruningPlan& plan, int layer) {
  return {plan.layers(layer).retained_experts().begin(),
          plan.layers(layer).retained_experts().end()};
}

TEST(PruningPlanTest, EachCriterionKeepsItsTopExperts) {
  const struct {
    const char* name;
    std::vector<int> retained;
  } cases[] = {{"frequency", {0, 2}}, {"mass", {1, 3}}, {"ean", {0, 3}}, {"reap", {1, 2}}};
  for (const auto& c : cases) {
    auto criterion = ParseCriterion(c.name);
    ASSERT_TRUE(criterion.ok());
    auto plan = MakePlan(Stats(), *criterion, 2);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(Retained(*plan, 0), c.retained) << c.name;
    EXPECT_EQ(Retained(*plan, 1), c.retained) << c.name;
    EXPECT_EQ(ValidatePlan(*plan, Config()), absl::OkStatus());
    EXPECT_EQ(plan->calibration().tokens(), 100);
    EXPECT_EQ(plan->calibration().text_sha256(), "00ff");
  }
  EXPECT_EQ(ParseCriterion("random").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan(Stats(), tandem::v1::PRUNING_CRITERION_EAN, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePlan(Stats(), tandem::v1::PRUNING_CRITERION_EAN, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PruningPlanTest, PlansThatDoNotFitTheModelAreRefused) {
  auto good = MakePlan(Stats(), tandem::v1::PRUNING_CRITERION_FREQUENCY, 3);
  ASSERT_TRUE(good.ok());
  auto expect_refused = [&](tandem::v1::PruningPlan plan, const std::string& why) {
    const absl::Status status = ValidatePlan(plan, Config());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_THAT(std::string(status.message()), HasSubstr(why));
  };
  auto other_model = *good;
  other_model.set_num_experts(8);
  expect_refused(other_model, "the model has");
  auto missing_layer = *good;
  missing_layer.mutable_layers()->RemoveLast();
  expect_refused(missing_layer, "lists 1 layers");
  auto out_of_order = *good;
  out_of_order.mutable_layers(1)->set_layer(0);
  expect_refused(out_of_order, "layers go in order");
  auto out_of_range = *good;
  out_of_range.mutable_layers(0)->set_retained_experts(2, 9);
  expect_refused(out_of_range, "outside [0, 4)");
  auto repeated = *good;
  repeated.mutable_layers(0)->set_retained_experts(1, repeated.layers(0).retained_experts(0));
  expect_refused(repeated, "ascending and distinct");
  auto too_few = *good;
  too_few.mutable_layers(1)->mutable_retained_experts()->Truncate(1);
  expect_refused(too_few, "routes each token to 2");
}

TEST(PruningPlanTest, MaskMatchesThePlanAndFilesRoundTrip) {
  auto plan = MakePlan(Stats(), tandem::v1::PRUNING_CRITERION_ROUTING_MASS, 2);
  ASSERT_TRUE(plan.ok());
  auto mask = MaskFromPlan(*plan, Config());
  ASSERT_TRUE(mask.ok());
  EXPECT_THAT(mask->retained[0], ElementsAre(false, true, false, true));
  testing::TempDir dir;
  const std::string path = dir.path() + "/plan.json";
  ASSERT_EQ(SavePlan(*plan, path), absl::OkStatus());
  auto loaded = LoadPlan(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->SerializeAsString(), plan->SerializeAsString());
  EXPECT_EQ(LoadPlan(dir.path() + "/none.json").status().code(), absl::StatusCode::kNotFound);
  std::ofstream(dir.path() + "/bad.json") << "{\"layers\": 3}";
  EXPECT_EQ(LoadPlan(dir.path() + "/bad.json").status().code(), absl::StatusCode::kInvalidArgument);

  // Against a model directory: a plan for another model names itself and what does not fit.
  const std::string tiny = testing::SourceDir() + "/models/tiny-moe";
  const absl::Status other = LoadPlanMask(path, *testing::OpenModelDir(tiny)).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.message(), ::testing::HasSubstr(path));
}

}  // namespace
}  // namespace tandem::moe
