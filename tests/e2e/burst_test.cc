// A burst of concurrent streaming clients, half gRPC and half OpenAI HTTP, against a
// disaggregated cluster with default settings (bench/load_burst.sh runs the full 1,000; this
// runs fewer, to fit the test budget): every request completes, nothing is refused, the
// gateway's threads stay few (requests hold none), and decode's KV blocks return to zero.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

constexpr int kClients = 400;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int Threads(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

TEST(BurstTest, ConcurrentStreamsAllCompleteOnFewGatewayThreads) {
  testing::ServiceSet set;
  auto cluster = set.StartCluster({}, {});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const testing::Ports* gateway = &cluster->gateway;
  const testing::Ports* decode = &cluster->decode;
  const pid_t gateway_pid = set.processes().back().pid();
  const int threads_before = Threads(gateway_pid);

  std::atomic<bool> running{true};
  std::atomic<int> peak{0};
  std::thread sampler([&] {
    while (running) {
      peak = std::max(peak.load(), Threads(gateway_pid));
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  std::vector<testing::Subprocess> benches;
  for (const auto& [backend, port] :
       {std::pair{"grpc", gateway->grpc_port}, std::pair{"http", gateway->http_port}}) {
    auto bench = testing::Subprocess::Start(
        {testing::BinDir() + "/tandem", "bench", "serve", absl::StrCat("--backend=", backend),
         absl::StrCat("--endpoint=127.0.0.1:", port),
         "--model=" + testing::SourceDir() + "/models/tiny-moe", "--dataset=random",
         absl::StrCat("--num_prompts=", kClients / 2), "--input_len=32", "--output_len=16",
         "--request_rate=inf", "--timeout_s=240",
         absl::StrCat("--out=", set.dir(), "/", backend, ".json")},
        absl::StrCat(set.dir(), "/", backend, ".log"));
    ASSERT_TRUE(bench.ok()) << bench.status();
    benches.push_back(*std::move(bench));
  }
  for (testing::Subprocess& bench : benches) {
    EXPECT_TRUE(testing::WaitUntil([&] { return !bench.Running(); }, absl::Seconds(240)));
  }
  running = false;
  sampler.join();
  for (const char* backend : {"grpc", "http"}) {
    SCOPED_TRACE(backend);
    const std::string text = Read(absl::StrCat(set.dir(), "/", backend, ".json"));
    const nlohmann::json r = nlohmann::json::parse(text, nullptr, false);
    ASSERT_TRUE(r.is_object()) << Read(absl::StrCat(set.dir(), "/", backend, ".log"));
    EXPECT_EQ(r["completed"], kClients / 2) << r["errors"].dump();
    EXPECT_EQ(r["failed"], 0) << r["errors"].dump();
  }
  EXPECT_EQ(
      testing::MetricValue(gateway->http_port, "tandem_requests_total", "outcome=\"rejected\""), 0);
  // A thread per request would be hundreds; the gateway's threads are its own pools'.
  EXPECT_LT(peak.load(), threads_before + 16) << "before the burst: " << threads_before;
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        return testing::MetricValue(decode->http_port, "tandem_kv_blocks", "state=\"used\"") == 0;
      },
      absl::Seconds(10)));
}

}  // namespace
}  // namespace tandem
