// The KV transport over UCX (UCP): one-sided puts from the writer's registered memory into the
// reader's, over shared memory or TCP on one host, and RDMA where the hardware has it. Each
// agent owns a UCP context and worker, listens on host:port (its agent name), and runs one
// progress thread that makes every UCX call; the public methods hand it work and wait with a
// deadline. A region's descriptor carries its owner's worker address, and writers connect
// through it: with UCX 1.13, endpoints made through the listener (the client-server sockaddr
// API) cannot use shared memory between processes ("Endpoint timeout"), while worker-address
// endpoints can. Descriptors without a worker address still connect through the listener. A write
// is cut into puts of at most max_put_bytes (large single puts over UCX 1.13's TCP transport are
// pathologically slow) and ends with an endpoint flush, so "done" means the bytes have landed
// in the peer's memory, not merely left this one.
//
// Facts measured on these machines: ../shared/ENVIRONMENT.md, "UCX 1.13 on loopback".
#pragma once

#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/kv/transfer.h"

namespace tandem::kv {

struct UcxTransportOptions {
  std::string listen_host = "127.0.0.1";
  int listen_port = 0;  // 0: an ephemeral port; agent() tells which
  // UCX_TLS for this agent ("tcp", "sm,tcp", ...); empty keeps UCX's choice. The listener needs
  // tcp among them.
  std::string transports;
  // Detect a dead peer (UCP_ERR_HANDLING_MODE_PEER). UCX 1.13 then leaves out shared memory,
  // so same-host transfers run over TCP; without it a dead peer is noticed only by deadlines.
  bool detect_dead_peers = true;
  size_t max_put_bytes = size_t{1} << 20;
  absl::Duration call_deadline = absl::Seconds(10);  // for work handed to the progress thread
};

class UcxTransport : public KvTransport {
 public:
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(const UcxTransportOptions& options);
  ~UcxTransport() override;

  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  std::string_view name() const override { return "ucx"; }
  bool supports_remote() const override { return true; }
  const std::string& agent() const override { return agent_; }

  absl::StatusOr<MemoryDescriptor> RegisterMemory(void* base, size_t size) override;
  // Has UCX allocate `size` bytes and registers them. Memory UCX allocates (System V or POSIX
  // shared memory here) is what its shared-memory transports can reach from another process;
  // ordinary memory is reachable only over TCP (or RDMA). DeregisterMemory frees it.
  absl::StatusOr<std::pair<void*, MemoryDescriptor>> AllocateMemory(size_t size);
  absl::Status DeregisterMemory(const MemoryDescriptor& region) override;
  absl::StatusOr<TransferId> PostWrite(const MemoryDescriptor& local,
                                       const MemoryDescriptor& remote,
                                       absl::Span<const CopySpan> spans) override;
  absl::StatusOr<bool> Poll(TransferId id) override;
  void Release(TransferId id) override;

 private:
  struct Region {
    char* base;
    size_t size;
    ucp_mem_h memh;
  };
  struct Peer {
    ucp_ep_h ep = nullptr;
    absl::Status error;                    // set once the endpoint failed
    std::map<uint64_t, ucp_rkey_h> rkeys;  // remote region id -> unpacked key
  };
  struct Transfer {
    absl::Mutex mu;
    int pending ABSL_GUARDED_BY(mu) = 0;  // outstanding UCX requests, the flush included
    bool posted ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
    std::string peer;
  };
  struct RequestContext {  // user data of one UCX request
    UcxTransport* transport;
    std::shared_ptr<Transfer> transfer;
  };

  explicit UcxTransport(const UcxTransportOptions& options) : options_(options) {}
  absl::Status Start();
  // Progress thread: maps (or allocates, with base null) and registers a region.
  absl::StatusOr<MemoryDescriptor> MapLocked(void* base, size_t size, void** mapped);
  void ProgressLoop();
  // Runs `fn` on the progress thread and returns its status, or DEADLINE_EXCEEDED.
  absl::Status RunOnWorker(std::function<absl::Status()> fn);
  void Wake();
  // Progress-thread only.
  // To `agent`, through its worker address when the descriptor carries one (what lets UCX pick
  // shared memory between processes), else through its listener.
  absl::StatusOr<Peer*> Connect(const std::string& agent, absl::string_view worker_address);
  void FailPeer(ucp_ep_h ep, ucs_status_t status);
  void Complete(const std::shared_ptr<Transfer>& transfer, ucs_status_t status);
  void Shutdown();

  static void OnConnection(ucp_conn_request_h request, void* arg);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnSendDone(void* request, ucs_status_t status, void* user_data);

  const UcxTransportOptions options_;
  std::string agent_;
  std::string worker_address_;  // ucp_worker_get_address, handed to peers in descriptors
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int worker_fd_ = -1;
  int wake_fd_ = -1;
  std::thread progress_;

  absl::Mutex mu_;
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, std::shared_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_transfer_ ABSL_GUARDED_BY(mu_) = 1;

  // Touched by the progress thread only (and by Start / the destructor when it is not running).
  std::map<uint64_t, Region> regions_;
  uint64_t next_region_ = 1;
  std::map<std::string, Peer> peers_;
  std::vector<ucp_ep_h> accepted_;
  std::atomic<int> in_flight_{0};  // requests posted and not yet completed
};

}  // namespace tandem::kv
