// KV transfer bandwidth through the UCX transport: one prompt's KV stream sent from a
// prefill-side pool into a decode-side inbox (two agents in this process, each with its own UCX
// context, worker and progress thread), for the geometry of bench/configs/dummy-3b (16 layers,
// 4 KV heads, head dim 64, float32: 32 KiB per token), into consecutive blocks and into a
// random permutation of blocks. bench/kv_transfer_bench.sh runs it next to ucx_perftest.
//
//   build/bin/tandem_kv_transfer_bench --tokens 1024,8192 --transports tcp,sm,tcp
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/kv/inbox.h"
#include "common/kv/kv_stream.h"
#include "common/kv/ucx_transport.h"
#include "common/util/clock.h"

ABSL_FLAG(std::string, tokens, "1024,8192", "Prompt lengths, in tokens.");
ABSL_FLAG(std::string, transports, "tcp;sm,tcp", "UCX_TLS settings to compare, ';'-separated.");
ABSL_FLAG(int, reps, 3, "Timed transfers per case (the best is reported).");

namespace tandem::kv {
namespace {

int Run() {
  std::vector<int> token_counts;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 16) {
      std::cerr << "bad --tokens entry " << part << "\n";
      return 2;
    }
    token_counts.push_back(n);
  }
  const int max_tokens = *std::max_element(token_counts.begin(), token_counts.end());
  const engine::KvCacheConfig config{16, 4, 64, 16, (max_tokens + 15) / 16};
  auto src = engine::KvBlockPool::Create(config);
  auto dst = engine::KvBlockPool::Create(config);
  if (!src.ok() || !dst.ok()) return 1;
  std::memset((*src)->data(), 0x3f, (*src)->size_bytes());
  std::printf(
      "| transport | prompt tokens | KV bytes | destination blocks | ms (best of %d) | GB/s |\n",
      absl::GetFlag(FLAGS_reps));
  std::printf("|---|---|---|---|---|---|\n");
  for (absl::string_view tls : absl::StrSplit(absl::GetFlag(FLAGS_transports), ';')) {
    UcxTransportOptions options;
    options.transports = std::string(tls);
    options.detect_dead_peers = false;  // UCX 1.13 leaves shared memory out otherwise
    auto writer = UcxTransport::Create(options);
    auto reader = UcxTransport::Create(options);
    if (!writer.ok() || !reader.ok()) {
      std::cerr << (writer.ok() ? reader.status() : writer.status()) << "\n";
      return 1;
    }
    KvInbox inbox(dst->get());
    if (!(*reader)->SetReceiver(&inbox).ok()) return 1;
    for (int tokens : token_counts) {
      const int blocks = (tokens + 15) / 16;
      for (bool scattered : {false, true}) {
        std::vector<int32_t> from(blocks), to(config.num_blocks);
        std::iota(from.begin(), from.end(), 0);
        std::iota(to.begin(), to.end(), 0);
        if (scattered) std::shuffle(to.begin(), to.end(), std::mt19937(1));
        to.resize(blocks);
        auto stream = KvStream::Of(src->get(), from);
        if (!stream.ok()) return 1;
        const uint64_t bytes = stream->size();
        double best = 1e30;
        for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
          auto token = inbox.Open(to);
          if (!token.ok()) return 1;
          const auto t0 = std::chrono::steady_clock::now();
          auto id = (*writer)->PostSend(
              (*reader)->self(), *token, bytes,
              [&](uint64_t offset, absl::Span<char> out) { return stream->Read(offset, out); });
          if (!id.ok()) {
            std::cerr << id.status() << "\n";
            return 1;
          }
          if (absl::Status s =
                  WaitForTransfer(**writer, *id, util::Instant::Now() + absl::Seconds(120));
              !s.ok()) {
            std::cerr << s << "\n";
            return 1;
          }
          (*writer)->Release(*id);
          inbox.Close(*token);
          best = std::min(
              best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::printf("| %s | %d | %.1f MB | %s | %.1f | %.2f |\n", std::string(tls).c_str(), tokens,
                    bytes / 1e6, scattered ? "random permutation" : "consecutive", best * 1e3,
                    bytes / best / 1e9);
      }
    }
    (void)(*reader)->SetReceiver(nullptr);
  }
  return 0;
}

}  // namespace
}  // namespace tandem::kv

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::kv::Run();
}
