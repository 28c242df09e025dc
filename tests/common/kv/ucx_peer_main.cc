// The other process of the cross-process UCX test (ucx_transport_test.cc): a decode-like agent
// that registers a KV block pool, publishes its descriptor, waits for the writer to say which
// blocks it wrote, and answers with their checksums.
//   kv_ucx_peer --out FILE [--transports tcp] [--memory ucx|heap]
// FILE: descriptor JSON; FILE.go: block ids written (JSON list, from the test); FILE.sums: the
// checksums (JSON list, per layer, K then V, per block). Exits 0 when done, 1 on error or
// after 60 s without word.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/escaping.h"
#include "common/kv/ucx_transport.h"
#include "nlohmann/json.hpp"
#include "tests/common/kv/ucx_peer.h"

namespace {

void WriteAtomically(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  std::filesystem::rename(path + ".tmp", path);
}

int Run(const std::string& out, const std::string& transports, bool ucx_memory) {
  tandem::kv::UcxTransportOptions options;
  options.transports = transports;
  auto transport = tandem::kv::UcxTransport::Create(options);
  if (!transport.ok()) {
    std::cerr << transport.status() << "\n";
    return 1;
  }
  const auto config = tandem::kv::testing::PeerPoolConfig();
  absl::StatusOr<std::unique_ptr<tandem::engine::KvBlockPool>> pool;
  absl::StatusOr<tandem::kv::MemoryDescriptor> region;
  if (ucx_memory) {  // the pool lives in memory UCX allocated
    auto bytes = tandem::engine::KvBlockPool::BytesFor(config);
    auto allocated =
        bytes.ok() ? (*transport)->AllocateMemory(*bytes)
                   : absl::StatusOr<std::pair<void*, tandem::kv::MemoryDescriptor>>(bytes.status());
    if (!allocated.ok()) {
      std::cerr << allocated.status() << "\n";
      return 1;
    }
    region = allocated->second;
    pool = tandem::engine::KvBlockPool::CreateIn(config, allocated->first, *bytes);
  } else {
    pool = tandem::engine::KvBlockPool::Create(config);
    if (pool.ok()) region = (*transport)->RegisterMemory((*pool)->data(), (*pool)->size_bytes());
  }
  if (!pool.ok() || !region.ok()) {
    std::cerr << (pool.ok() ? region.status() : pool.status()) << "\n";
    return 1;
  }
  WriteAtomically(out, nlohmann::json{{"agent", region->agent},
                                      {"region_id", region->region_id},
                                      {"size", region->size},
                                      {"key", absl::BytesToHexString(region->remote_key)}}
                           .dump());
  for (int i = 0; i < 600; ++i) {
    if (std::filesystem::exists(out + ".go")) {
      std::ifstream in(out + ".go");
      const auto blocks = nlohmann::json::parse(in).get<std::vector<int32_t>>();
      WriteAtomically(out + ".sums",
                      nlohmann::json(tandem::kv::testing::BlockChecksums(**pool, blocks)).dump());
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::cerr << "no word from the writer in 60 s\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, transports;
  bool ucx_memory = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--out") out = argv[i + 1];
    if (flag == "--transports") transports = argv[i + 1];
    if (flag == "--memory") ucx_memory = std::string(argv[i + 1]) == "ucx";
  }
  if (out.empty()) {
    std::cerr << "usage: kv_ucx_peer --out FILE [--transports TLS]\n";
    return 2;
  }
  return Run(out, transports, ucx_memory);
}
