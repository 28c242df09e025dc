// `tandem bench serve` end to end: tandem-serve on the shipped tiny model, the benchmark
// through the gRPC API, and its result file checked.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

// Runs `tandem ARGS` to completion (at most `deadline`); its exit status, its output in `log`.
int RunTandem(const std::vector<std::string>& args, const std::string& log,
              absl::Duration deadline) {
  std::vector<std::string> argv = {testing::BinDir() + "/tandem"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto process = testing::Subprocess::Start(argv, log);
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return -1;
  EXPECT_TRUE(testing::WaitUntil([&] { return !process->Running(); }, deadline))
      << "tandem bench serve still running after " << deadline;
  auto status = process->Stop(SIGKILL, absl::Seconds(5));
  if (!status.ok() || !WIFEXITED(*status)) return -1;
  return WEXITSTATUS(*status);
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(BenchServeTest, RandomPromptsAgainstTandemServeOverGrpcAndOpenAiHttp) {
  testing::ServiceSet services;
  auto ports = services.Start("tandem-serve", {});
  ASSERT_TRUE(ports.ok()) << ports.status();
  for (const auto& [backend, port] :
       {std::pair{"grpc", ports->grpc_port}, std::pair{"http", ports->http_port}}) {
    SCOPED_TRACE(backend);
    const std::string out = services.dir() + "/result-" + backend + ".json";
    const std::string log = services.dir() + "/bench-" + backend + ".log";
    const int code =
        RunTandem({"bench", "serve", absl::StrCat("--endpoint=127.0.0.1:", port),
                   absl::StrCat("--backend=", backend), "--dataset=random",
                   "--model=" + testing::SourceDir() + "/models/tiny-moe", "--num_prompts=8",
                   "--input_len=16", "--output_len=8", "--max_concurrency=4", "--request_rate=inf",
                   "--seed=1", "--label=colocated", "--goodput=e2el:60000", "--out=" + out},
                  log, absl::Seconds(120));
    ASSERT_EQ(code, 0) << Read(log);
    const std::string printed = Read(log);
    EXPECT_NE(printed.find("Serving Benchmark Result"), std::string::npos) << printed;
    EXPECT_NE(printed.find("Mean TTFT (ms):"), std::string::npos) << printed;

    const nlohmann::json r = nlohmann::json::parse(Read(out));
    EXPECT_EQ(r["backend"], backend);
    EXPECT_EQ(r["label"], "colocated");
    EXPECT_EQ(r["request_rate"], "inf");
    EXPECT_EQ(r["max_concurrency"], 4);
    EXPECT_EQ(r["num_prompts"], 8);
    EXPECT_EQ(r["completed"], 8);
    EXPECT_EQ(r["failed"], 0);
    EXPECT_EQ(r["total_input_tokens"], 8 * 16);
    EXPECT_EQ(r["total_output_tokens"], 64);
    EXPECT_GT(r["duration"].get<double>(), 0);
    EXPECT_GT(r["output_throughput"].get<double>(), 0);
    EXPECT_EQ(r["request_goodput"].get<double>(), r["request_throughput"].get<double>());
    ASSERT_EQ(r["ttfts"].size(), 8u);
    for (const auto& ttft : r["ttfts"]) EXPECT_GT(ttft.get<double>(), 0);
    ASSERT_EQ(r["itls"].size(), 8u);
    for (const auto& itls : r["itls"]) {
      // gRPC chunks say how many tokens they carry; an OpenAI event is counted as one, and a
      // token that ends inside a UTF-8 character sends no event of its own.
      if (std::string(backend) == "grpc") {
        EXPECT_EQ(itls.size(), 7u);
      } else {
        EXPECT_GE(itls.size(), 1u);
        EXPECT_LE(itls.size(), 7u);
      }
    }
    EXPECT_EQ(r["output_lens"], nlohmann::json(std::vector<int>(8, 8)));
    EXPECT_EQ(r["input_lens"], nlohmann::json(std::vector<int>(8, 16)));
    for (const auto& error : r["errors"]) EXPECT_EQ(error, "");
    for (const char* metric : {"ttft", "tpot", "itl", "e2el"}) {
      const double median = r[absl::StrCat("median_", metric, "_ms")].get<double>();
      const double p90 = r[absl::StrCat("p90_", metric, "_ms")].get<double>();
      const double p99 = r[absl::StrCat("p99_", metric, "_ms")].get<double>();
      EXPECT_GT(r[absl::StrCat("mean_", metric, "_ms")].get<double>(), 0) << metric;
      EXPECT_GT(median, 0) << metric;
      EXPECT_LE(median, p90) << metric;
      EXPECT_LE(p90, p99) << metric;
    }
    // A request's first token comes before its last.
    EXPECT_LE(r["p99_ttft_ms"].get<double>(), r["p99_e2el_ms"].get<double>());
  }
}

TEST(BenchServeTest, SharedPrefixAndMultiTurnWorkloadsHitThePrefixCache) {
  testing::ServiceSet services;
  auto ports = services.Start("tandem-serve", {});
  ASSERT_TRUE(ports.ok()) << ports.status();
  auto run = [&](const std::string& name, std::vector<std::string> flags) {
    const std::string out = services.dir() + "/" + name + ".json";
    const std::string log = services.dir() + "/" + name + ".log";
    std::vector<std::string> args = {"bench",
                                     "serve",
                                     absl::StrCat("--endpoint=127.0.0.1:", ports->grpc_port),
                                     "--model=" + testing::SourceDir() + "/models/tiny-moe",
                                     "--output_len=8",
                                     "--request_rate=inf",
                                     "--out=" + out};
    args.insert(args.end(), flags.begin(), flags.end());
    EXPECT_EQ(RunTandem(args, log, absl::Seconds(120)), 0) << Read(log);
    return nlohmann::json::parse(Read(out), nullptr, false);
  };
  const double hits_before =
      testing::MetricValue(ports->http_port, "tandem_prefix_cache_hit_tokens_total");
  nlohmann::json r = run(
      "shared", {"--dataset=shared_prefix", "--prefix_len=64", "--input_len=8", "--num_prompts=6"});
  EXPECT_EQ(r["completed"], 6);
  EXPECT_EQ(r["prefix_len"], 64);
  EXPECT_EQ(r["total_input_tokens"], 6 * 72);
  // The warm-up request computed the 64-token prefix: every counted request reuses it.
  const double hits =
      testing::MetricValue(ports->http_port, "tandem_prefix_cache_hit_tokens_total");
  EXPECT_GE(hits - hits_before, 6 * 64);
  // Two conversations of three turns; each turn resends the one before and its 8-token reply.
  r = run("turns", {"--dataset=multi_turn", "--turns=3", "--input_len=16", "--num_prompts=6"});
  EXPECT_EQ(r["completed"], 6);
  EXPECT_EQ(r["turns"], 3);
  EXPECT_EQ(r["total_input_tokens"], 2 * (16 + 40 + 64));
  EXPECT_GT(testing::MetricValue(ports->http_port, "tandem_prefix_cache_hit_tokens_total"), hits);
  // Turns chain on the replies' token ids: the HTTP backend has none.
  EXPECT_EQ(RunTandem({"bench", "serve", absl::StrCat("--endpoint=127.0.0.1:", ports->http_port),
                       "--backend=http", "--dataset=multi_turn", "--vocab_size=100"},
                      services.dir() + "/bad.log", absl::Seconds(30)),
            2);
}

TEST(BenchServeTest, UnreachableEndpointFailsFast) {
  testing::TempDir dir;
  const std::string log = dir.path() + "/bench.log";
  // Port 1 on loopback: nothing listens there.
  const int code = RunTandem({"bench", "serve", "--endpoint=127.0.0.1:1", "--backend=http",
                              "--vocab_size=100", "--num_prompts=2", "--timeout_s=5"},
                             log, absl::Seconds(30));
  EXPECT_EQ(code, 1) << Read(log);
  EXPECT_NE(Read(log).find("warm-up"), std::string::npos) << Read(log);
}

TEST(BenchServeTest, BadFlagsAreUsageErrors) {
  testing::TempDir dir;
  const std::string log = dir.path() + "/bench.log";
  EXPECT_EQ(RunTandem({"bench", "serve", "--backend=smoke"}, log, absl::Seconds(30)), 2);
  EXPECT_EQ(RunTandem({"bench", "serve", "--request_rate=fast"}, log, absl::Seconds(30)), 2);
  EXPECT_EQ(RunTandem({"bench", "serve", "--dataset=random"}, log, absl::Seconds(30)), 2)
      << "random prompts without a vocabulary size";
  EXPECT_EQ(RunTandem({"bench", "nothing"}, log, absl::Seconds(30)), 2);
}

}  // namespace
}  // namespace tandem
