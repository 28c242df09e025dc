// Serving benchmark: C concurrent clients, each streaming R generations through the public API
// (the SDK), for each C in --concurrency. Reports output tokens/s over the whole run, time to
// first token and request latency. bench/serving_bench.sh runs it against the disaggregated
// cluster and against colocated tandem-serve, side by side.
//
//   build/bin/tandem_serving_bench --endpoint 127.0.0.1:50051 --concurrency 1,8,32
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tandem/client.h"

ABSL_FLAG(std::string, endpoint, "127.0.0.1:50051", "Gateway (or tandem-serve) gRPC address.");
ABSL_FLAG(std::string, concurrency, "1,8,32", "Concurrent clients, per run.");
ABSL_FLAG(int, requests, 4, "Generations per client per run.");
ABSL_FLAG(int, max_tokens, 64, "Tokens per generation (EOS ignored, so every one is full).");
ABSL_FLAG(std::string, label, "", "Printed in the first column.");

namespace {

using Clock = std::chrono::steady_clock;

const char* const kPrompts[] = {
    "The jury said it did find that",
    "She opened the door and",
    "In the beginning of the year, the committee",
    "He had never seen so many people in one place before, and",
    "The report of the state department on the election",
    "After the war the family moved to a small town where",
    "It is not easy to say what the music of the",
    "When the first results came in, the scientists",
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int> levels;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    int c = 0;
    if (!absl::SimpleAtoi(part, &c) || c < 1) {
      std::cerr << "bad --concurrency entry " << part << "\n";
      return 2;
    }
    levels.push_back(c);
  }
  tandem::sdk::ClientOptions options;
  options.timeout = absl::Seconds(600);
  auto client = tandem::sdk::Client::Connect(absl::GetFlag(FLAGS_endpoint), options);
  if (!client.ok()) {
    std::cerr << client.status() << "\n";
    return 1;
  }
  const int requests = absl::GetFlag(FLAGS_requests);
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  for (int clients : levels) {
    std::vector<double> ttft, latency;
    std::atomic<int64_t> tokens{0};
    std::atomic<int> failures{0};
    absl::Mutex mu;
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        for (int r = 0; r < requests; ++r) {
          tandem::v1::GenerateRequest request;
          request.set_prompt(kPrompts[(c * requests + r) % std::size(kPrompts)]);
          request.mutable_sampling()->set_max_tokens(max_tokens);
          request.mutable_sampling()->set_ignore_eos(true);
          const auto t0 = Clock::now();
          double first = -1;
          int64_t n = 0;
          absl::Status s = (*client)->GenerateStream(request, [&](const auto& chunk) {
            if (first < 0 && chunk.token_ids_size() > 0) {
              first = std::chrono::duration<double>(Clock::now() - t0).count();
            }
            n += chunk.token_ids_size();
          });
          const double total = std::chrono::duration<double>(Clock::now() - t0).count();
          if (!s.ok()) {
            ++failures;
            std::cerr << s << "\n";
            continue;
          }
          tokens += n;
          absl::MutexLock lock(&mu);
          ttft.push_back(first);
          latency.push_back(total);
        }
      });
    }
    for (auto& t : threads) t.join();
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("| %s | %d | %zu | %d | %.1f | %.1f | %.1f | %.0f | %.0f |\n",
                absl::GetFlag(FLAGS_label).c_str(), clients, latency.size(), failures.load(),
                tokens.load() / wall, Percentile(ttft, 0.5) * 1e3, Percentile(ttft, 0.99) * 1e3,
                Percentile(latency, 0.5) * 1e3, Percentile(latency, 0.99) * 1e3);
    std::fflush(stdout);
  }
  return 0;
}
