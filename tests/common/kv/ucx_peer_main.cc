// The other process of the cross-process UCX test (ucx_transport_test.cc): a decode-like agent
// that opens an inbox over a KV block pool, publishes where and under which token to send,
// waits for the KV to be complete, and answers with the checksums of what landed.
//   kv_ucx_peer --out FILE [--transports tcp]
// FILE: JSON {agent, address (hex), token (hex), blocks}; FILE.sums: the checksums (JSON list,
// per layer, K then V, per block). Exits 0 when done, 1 on error or after 60 s without the KV.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/escaping.h"
#include "common/kv/inbox.h"
#include "common/kv/ucx_transport.h"
#include "nlohmann/json.hpp"
#include "tests/common/kv/kv_test_util.h"

namespace {

void WriteAtomically(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  std::filesystem::rename(path + ".tmp", path);
}

int Run(const std::string& out, const std::string& transports) {
  tandem::kv::UcxTransportOptions options;
  options.transports = transports;
  options.detect_dead_peers = transports == "tcp";
  auto transport = tandem::kv::UcxTransport::Create(options);
  if (!transport.ok()) {
    std::cerr << transport.status() << "\n";
    return 1;
  }
  auto pool = tandem::kv::testing::Pool(64, 4, 64);
  tandem::kv::KvInbox inbox(pool.get());
  if (absl::Status s = (*transport)->SetReceiver(&inbox); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  const std::vector<int32_t> blocks = {50, 51, 52, 53, 3, 4, 5, 6, 7, 8, 60, 2, 33, 34, 35, 36, 63};
  auto token = inbox.Open(blocks);
  if (!token.ok()) {
    std::cerr << token.status() << "\n";
    return 1;
  }
  const tandem::kv::KvPeer self = (*transport)->self();
  WriteAtomically(out, nlohmann::json{{"agent", self.agent},
                                      {"address", absl::BytesToHexString(self.address)},
                                      {"token", absl::BytesToHexString(*token)},
                                      {"blocks", blocks}}
                           .dump());
  for (int i = 0; i < 600; ++i) {
    if (inbox.CheckComplete(*token).ok()) {
      WriteAtomically(out + ".sums",
                      nlohmann::json(tandem::kv::testing::BlockChecksums(*pool, blocks)).dump());
      (void)(*transport)->SetReceiver(nullptr);
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::cerr << "no complete KV in 60 s\n";
  (void)(*transport)->SetReceiver(nullptr);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, transports;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--out") out = argv[i + 1];
    if (flag == "--transports") transports = argv[i + 1];
  }
  if (out.empty()) {
    std::cerr << "usage: kv_ucx_peer --out FILE [--transports TLS]\n";
    return 2;
  }
  return Run(out, transports);
}
