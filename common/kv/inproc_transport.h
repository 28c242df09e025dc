// The KV transport for agents in one process: tests of everything above the transport (and a
// reference for what a transport must do). Agents attach to a shared InProcessFabric; a send
// is done when it is posted (each chunk filled and handed to the receiver in turn, then the
// commit), so Poll reports its outcome at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/kv/transfer.h"

namespace tandem::kv {

// The registry of agents and their receivers, shared by the transports of one process.
// Thread-safe.
class InProcessFabric {
 public:
  InProcessFabric() = default;
  InProcessFabric(const InProcessFabric&) = delete;
  InProcessFabric& operator=(const InProcessFabric&) = delete;

 private:
  friend class InProcessTransport;
  absl::Mutex mu_;
  // agent -> its receiver (null until it sets one). Deliveries run under mu_, so a receiver
  // replaced or detached is not being called once that returns.
  std::map<std::string, KvReceiver*> agents_ ABSL_GUARDED_BY(mu_);
};

class InProcessTransport : public KvTransport {
 public:
  // ALREADY_EXISTS if `agent` is attached to `fabric` already; INVALID_ARGUMENT if empty.
  static absl::StatusOr<std::unique_ptr<InProcessTransport>> Create(
      std::shared_ptr<InProcessFabric> fabric, std::string agent, size_t chunk_bytes = 1 << 16);
  // Detaches the agent.
  ~InProcessTransport() override;

  std::string_view name() const override { return "inproc"; }
  bool supports_remote() const override { return false; }
  KvPeer self() const override { return {agent_, ""}; }

  absl::Status SetReceiver(KvReceiver* receiver) override;
  absl::StatusOr<TransferId> PostSend(const KvPeer& peer, std::string token, uint64_t size,
                                      Fill fill) override;
  absl::StatusOr<bool> Poll(TransferId id) override;
  void Release(TransferId id) override;

 private:
  InProcessTransport(std::shared_ptr<InProcessFabric> fabric, std::string agent, size_t chunk_bytes)
      : fabric_(std::move(fabric)), agent_(std::move(agent)), chunk_bytes_(chunk_bytes) {}

  const std::shared_ptr<InProcessFabric> fabric_;
  const std::string agent_;
  const size_t chunk_bytes_;
  absl::Mutex mu_;
  uint64_t next_transfer_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, absl::Status> done_ ABSL_GUARDED_BY(mu_);  // posted, not yet released
};

}  // namespace tandem::kv
