// bench/plot_serving.sh turns a directory of `tandem bench serve` results into PNG charts.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

bool HaveTools() {
  return std::system("command -v gnuplot >/dev/null 2>&1 && command -v jq >/dev/null 2>&1") == 0;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs the script on `results`, writing to `out`; its exit status (output in `log`).
int Plot(const std::string& results, const std::string& out, const std::string& log) {
  const std::string command = absl::StrCat(testing::SourceDir(), "/bench/plot_serving.sh '",
                                           results, "' '", out, "' >'", log, "' 2>&1");
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A result as `tandem bench serve --out` writes it (the keys the script reads, and a few more).
nlohmann::json Result(const std::string& label, const nlohmann::json& rate, double scale) {
  nlohmann::json r = {{"label", label},
                      {"backend", "grpc"},
                      {"request_rate", rate},
                      {"completed", 100},
                      {"failed", 0},
                      {"output_throughput", 1000 * scale},
                      {"request_goodput", nullptr}};
  for (const char* metric : {"ttft", "tpot", "itl", "e2el"}) {
    r[absl::StrCat("mean_", metric, "_ms")] = 12 * scale;
    r[absl::StrCat("median_", metric, "_ms")] = 10 * scale;
    r[absl::StrCat("p90_", metric, "_ms")] = 20 * scale;
    r[absl::StrCat("p99_", metric, "_ms")] = 30 * scale;
  }
  return r;
}

TEST(PlotServingTest, ChartsEverySeries) {
  if (!HaveTools()) GTEST_SKIP() << "gnuplot or jq is not installed (scripts/setup.sh)";
  testing::TempDir dir;
  const std::string results = dir.path() + "/results";
  std::filesystem::create_directories(results);
  const std::vector<nlohmann::json> rates = {1, 2, 4.5, 16, "inf"};
  const std::vector<std::pair<std::string, double>> series = {{"disaggregated", 1.0},
                                                              {"colocated", 1.3}};
  for (const auto& [label, scale] : series) {
    for (size_t i = 0; i < rates.size(); ++i) {
      // The colocated series lacks rate 4.5: series need not share every rate.
      if (label == "colocated" && i == 2) continue;
      std::ofstream(absl::StrCat(results, "/", label, "-", i, ".json"))
          << Result(label, rates[i], scale * (i + 1)).dump(1);
    }
  }
  const std::string out = dir.path() + "/charts", log = dir.path() + "/plot.log";
  ASSERT_EQ(Plot(results, out, log), 0) << Read(log);
  for (const char* chart : {"throughput", "ttft", "itl", "e2el"}) {
    const std::string png = absl::StrCat(out, "/", chart, ".png");
    ASSERT_TRUE(std::filesystem::exists(png)) << png << "\n" << Read(log);
    EXPECT_GT(std::filesystem::file_size(png), 1000u) << png;
    EXPECT_EQ(Read(png).substr(0, 8), "\x89PNG\r\n\x1a\n") << png;
  }
  EXPECT_NE(Read(log).find("colocated disaggregated"), std::string::npos) << Read(log);
}

TEST(PlotServingTest, NoResultsIsAnError) {
  if (!HaveTools()) GTEST_SKIP() << "gnuplot or jq is not installed (scripts/setup.sh)";
  testing::TempDir dir;
  const std::string log = dir.path() + "/plot.log";
  EXPECT_EQ(Plot(dir.path(), dir.path() + "/charts", log), 1) << Read(log);
  EXPECT_NE(Read(log).find("no *.json"), std::string::npos) << Read(log);
}

}  // namespace
}  // namespace tandem
