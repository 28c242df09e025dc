// The KV transport for agents in one process: colocated mode (prefill and decode engines in
// one `tandem serve`) and tests of everything above the transport. Agents attach to a shared
// InProcessFabric; a write is a memcpy done when it is posted, so Poll reports it done at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/kv/transfer.h"

namespace tandem::kv {

// The registry of agents and their registered regions, shared by the transports of one
// process. Thread-safe.
class InProcessFabric {
 public:
  InProcessFabric() = default;
  InProcessFabric(const InProcessFabric&) = delete;
  InProcessFabric& operator=(const InProcessFabric&) = delete;

 private:
  friend class InProcessTransport;
  struct Region {
    char* base;
    uint64_t size;
  };

  absl::Mutex mu_;
  std::set<std::string> agents_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, uint64_t>, Region> regions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_region_ ABSL_GUARDED_BY(mu_) = 1;
};

class InProcessTransport : public KvTransport {
 public:
  // ALREADY_EXISTS if `agent` is attached to `fabric` already; INVALID_ARGUMENT if empty.
  static absl::StatusOr<std::unique_ptr<InProcessTransport>> Create(
      std::shared_ptr<InProcessFabric> fabric, std::string agent);
  // Detaches the agent and drops its registrations.
  ~InProcessTransport() override;

  std::string_view name() const override { return "inproc"; }
  bool supports_remote() const override { return false; }
  const std::string& agent() const override { return agent_; }

  absl::StatusOr<MemoryDescriptor> RegisterMemory(void* base, size_t size) override;
  absl::Status DeregisterMemory(const MemoryDescriptor& region) override;
  absl::StatusOr<TransferId> PostWrite(const MemoryDescriptor& local,
                                       const MemoryDescriptor& remote,
                                       absl::Span<const CopySpan> spans) override;
  absl::StatusOr<bool> Poll(TransferId id) override;
  void Release(TransferId id) override;

 private:
  InProcessTransport(std::shared_ptr<InProcessFabric> fabric, std::string agent)
      : fabric_(std::move(fabric)), agent_(std::move(agent)) {}

  const std::shared_ptr<InProcessFabric> fabric_;
  const std::string agent_;
  absl::Mutex mu_;
  uint64_t next_transfer_ ABSL_GUARDED_BY(mu_) = 1;
  std::set<uint64_t> done_ ABSL_GUARDED_BY(mu_);  // posted, not yet released
};

}  // namespace tandem::kv
