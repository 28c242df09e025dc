// The mixed-width commands as a user runs them, on the shipped tiny model with its neurons
// reordered: `tandem tier --max_accuracy_loss` chooses a plan on calibration text and reports
// it on held-out text; a bytes budget is kept; bad budgets and an unreordered checkpoint are
// refused with a message; `tandem eval --baselines` runs both equal-bytes baselines at the
// bytes the plan ran.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

class MixedWidthCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const std::string model = testing::SourceDir() + "/models/tiny-moe";
    // Two documents of each split: calibration and held-out text.
    for (const auto& [split, name] : {std::pair{"valid", "calibration"}, {"test", "heldout"}}) {
      std::ifstream in(model + "/eval/" + split + ".txt");
      std::ofstream out(Path(name) + ".txt");
      std::string line;
      for (int k = 0; k < 2 && std::getline(in, line);) {
        if (line.empty()) continue;
        out << line << "\n";
        ++k;
      }
    }
    std::ifstream prompts(model + "/eval/prompts.txt");
    std::ofstream two(Path("prompts.txt"));
    std::string line;
    for (int k = 0; k < 2 && std::getline(prompts, line); ++k) two << line << "\n";
    ASSERT_EQ(Run("reorder --model " + model + " --stats " + Stats() + " --out " + Path("model")),
              0)
        << Output();
    ASSERT_EQ(Run("prune --stats " + Stats() + " --criterion frequency --keep 16 --out " +
                  Path("keep16.json")),
              0)
        << Output();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::string Path(const std::string& name) { return dir_->path() + "/" + name; }
  static std::string Stats() {
    return testing::SourceDir() + "/models/tiny-moe/pruning/calibration-valid.json";
  }
  // `tandem ARGS`, its output in Output(); the exit status.
  static int Run(const std::string& args) {
    const int status = std::system(
        (testing::BinDir() + "/tandem " + args + " > " + Path("out") + " 2>&1").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  static std::string Output() {
    std::ifstream in(Path("out"));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  static std::string TierArgs() {
    return "tier --plan " + Path("keep16.json") + " --stats " + Stats() + " --model " +
           Path("model") + " --text " + Path("calibration.txt");
  }

  static testing::TempDir* dir_;
};

testing::TempDir* MixedWidthCliTest::dir_ = nullptr;

TEST_F(MixedWidthCliTest, AnAccuracyBudgetChoosesOnCalibrationTextAndReportsHeldOutText) {
  ASSERT_EQ(Run(TierArgs() + " --max_accuracy_loss 0.05 --heldout_text " + Path("heldout.txt") +
                " --out " + Path("chosen.json")),
            0)
      << Output();
  const std::string out = Output();
  EXPECT_NE(out.find("chosen: "), std::string::npos) << out;
  EXPECT_NE(out.find("held out (" + Path("heldout.txt") + ")"), std::string::npos) << out;
  std::ifstream in(Path("chosen.json"));
  const nlohmann::json plan = nlohmann::json::parse(in);
  EXPECT_TRUE(plan.contains("tiers")) << plan.dump();
  EXPECT_EQ(plan["layers"][0]["pairs"].size(), 120u);  // every pair of 16 experts
}

TEST_F(MixedWidthCliTest, ABytesBudgetIsKept) {
  ASSERT_EQ(Run(TierArgs() + " --max_expert_bytes 0.85 --out " + Path("bytes.json")), 0)
      << Output();
  const std::string out = Output();
  const size_t at = out.find("on the calibration text ");
  ASSERT_NE(at, std::string::npos) << out;
  const double share = std::stod(out.substr(at + std::string("on the calibration text ").size()));
  EXPECT_GT(share, 0.5);
  EXPECT_LE(share, 0.85);
}

TEST_F(MixedWidthCliTest, BadBudgetsAndUnreorderedCheckpointsAreRefused) {
  EXPECT_EQ(
      Run(TierArgs() + " --max_accuracy_loss 0.05 --max_expert_bytes 0.5 --out " + Path("x.json")),
      2);  // INVALID_ARGUMENT
  EXPECT_NE(Output().find("give one budget"), std::string::npos) << Output();
  EXPECT_NE(Run("tier --plan " + Path("keep16.json") + " --stats " + Stats() +
                " --max_accuracy_loss 0.05 --out " + Path("x.json") + " --model " +
                testing::SourceDir() + "/models/tiny-moe --text " + Path("calibration.txt")),
            0);
  EXPECT_NE(Output().find("importance order"), std::string::npos) << Output();
  EXPECT_NE(Run(TierArgs() + " --max_accuracy_loss 0.05 --out " + Path("x.json") +
                " --text /nonexistent.txt"),
            0);
  EXPECT_NE(Output().find("/nonexistent.txt"), std::string::npos) << Output();
  EXPECT_NE(Run(TierArgs() + " --warm_widths 384,x --out " + Path("x.json")), 0);
  EXPECT_NE(Output().find("\"x\" is not a width"), std::string::npos) << Output();
}

TEST_F(MixedWidthCliTest, EvalRunsBothBaselinesAtThePlansBytes) {
  ASSERT_EQ(Run(TierArgs() + " --hot_share 0.3 --warm_share 0.4 --warm_width 96 --out " +
                Path("tiered.json")),
            0)
      << Output();
  ASSERT_EQ(Run("eval --model " + Path("model") + " --plan " + Path("tiered.json") +
                " --mode handoff --baselines uniform,adaptive --text " + Path("heldout.txt") +
                " --prompts " + Path("prompts.txt") + " --max_tokens 8 --out " + Path("eval.json")),
            0)
      << Output();
  std::ifstream in(Path("eval.json"));
  const nlohmann::json result = nlohmann::json::parse(in);
  ASSERT_EQ(result["modes"].size(), 3u) << result.dump();
  const double plan = result["modes"][0]["expert_bytes_vs_full_width"];
  EXPECT_GT(plan, 0.5);
  EXPECT_LT(plan, 0.9);
  EXPECT_EQ(result["modes"][1]["baseline"], "uniform");
  EXPECT_EQ(result["modes"][2]["baseline"], "adaptive");
  // Uniform: the nearest whole width (1/384 of the bytes); adaptive: top-2 keeps 1 or 2 experts,
  // so its share is set within one decision's half of the plan's.
  EXPECT_NEAR(result["modes"][1]["expert_bytes_vs_full_width"].get<double>(), plan, 1.0 / 384);
  EXPECT_NEAR(result["modes"][2]["expert_bytes_vs_full_width"].get<double>(), plan, 0.02);
  // Baselines need a tiered plan.
  EXPECT_NE(Run("eval --model " + Path("model") + " --plan " + Path("keep16.json") +
                " --mode handoff --baselines uniform --text " + Path("heldout.txt") +
                " --prompts " + Path("prompts.txt")),
            0);
  EXPECT_NE(Output().find("no tiers"), std::string::npos) << Output();
}

}  // namespace
}  // namespace tandem
