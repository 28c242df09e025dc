// The KV transport over UCX (UCP active messages), over shared memory or TCP on one host and
// RDMA where the hardware has it. Each agent owns a UCP context and worker, listens on
// host:port (its agent name), and runs one progress thread that makes every UCX call; the
// public methods hand it work and wait with a deadline.
//
// A send is a window of active messages (a token, an offset, up to chunk_bytes of the stream;
// small ones eager, large ones by rendezvous into a bounded buffer of the receiver's), then,
// once they have all left, a commit that the receiver answers (on the reply endpoint) with its
// verdict. The receiver copies each message into its own memory through its KvReceiver:
// nothing here writes into a peer's memory, and the context enables no one-sided operations
// (UCP_FEATURE_RMA is off, so UCP's software put/get handlers are not installed). Note what that
// does not cover: UCX's TCP transport itself accepts raw put requests to any address from any peer
// that connects to it (uct_tcp has no remote-key check), so the KV ports must only be reachable by
// prefill and decode instances (docs/security.md).
//
// Senders connect through the receiver's worker address when they have it (what lets UCX pick
// shared memory between processes; with UCX 1.13, endpoints made through the listener cannot),
// else through its listener. A dead peer fails its transfers (UNAVAILABLE) when dead peers are
// detected (UCP_ERR_HANDLING_MODE_PEER, which makes UCX 1.13 leave out shared memory); otherwise
// transfers to it run into their deadline. A released transfer whose messages are still stuck
// in a stalled peer's endpoint after stuck_send_timeout gets that endpoint closed, so its
// buffers come back.
//
// Facts measured on these machines: docs/benchmarks.md and the design's UCX notes.
#pragma once

#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/kv/transfer.h"

namespace tandem::kv {

struct UcxTransportOptions {
  std::string listen_host = "127.0.0.1";
  int listen_port = 0;  // 0: an ephemeral port; self().agent tells which
  // UCX_TLS for this agent ("tcp", "sm,tcp", ...); empty keeps UCX's choice. The listener needs
  // tcp among them.
  std::string transports;
  // Detect a dead peer (UCP_ERR_HANDLING_MODE_PEER). UCX 1.13 then leaves out shared memory,
  // so same-host transfers run over TCP; without it a dead peer is noticed only by deadlines.
  bool detect_dead_peers = true;
  size_t chunk_bytes = size_t{256} << 10;            // one active message
  int window = 16;                                   // messages in flight per transfer
  absl::Duration call_deadline = absl::Seconds(10);  // for work handed to the progress thread
  absl::Duration stuck_send_timeout = absl::Seconds(5);
};

class UcxTransport : public KvTransport {
 public:
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(const UcxTransportOptions& options);
  ~UcxTransport() override;

  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  std::string_view name() const override { return "ucx"; }
  bool supports_remote() const override { return true; }
  KvPeer self() const override { return {agent_, worker_address_}; }

  absl::Status SetReceiver(KvReceiver* receiver) override;
  absl::StatusOr<TransferId> PostSend(const KvPeer& peer, std::string token, uint64_t size,
                                      Fill fill) override;
  absl::StatusOr<bool> Poll(TransferId id) override;
  void Release(TransferId id) override;

  // UCX's description of the endpoint to `agent` (its lanes and their transports, e.g.
  // "posix/memory" or "tcp/lo"), for tests that must know which transport carried the bytes.
  // NOT_FOUND when not connected.
  absl::StatusOr<std::string> DescribePeer(const std::string& agent);
  // Endpoints peers made to this agent through its listener.
  int num_accepted();

 private:
  struct Peer {
    ucp_ep_h ep = nullptr;
    absl::Status error;  // set once the endpoint failed
  };
  struct Send;
  struct SendContext;  // user data of one UCX send
  struct RecvContext;  // user data of one rendezvous receive

  explicit UcxTransport(const UcxTransportOptions& options) : options_(options) {}
  absl::Status Start();
  void ProgressLoop();
  // Runs `fn` on the progress thread and returns its status, or DEADLINE_EXCEEDED (then `fn`
  // never runs: it may safely refer to the caller's locals).
  absl::Status RunOnWorker(std::function<absl::Status()> fn);
  void Wake();

  // Progress-thread only.
  absl::StatusOr<Peer*> Connect(const KvPeer& peer);
  // Sends one active message `id` carrying context->header and `data`; the context lives
  // until UCX is done with it (OnSendDone). UCS_OK once sent or on its way.
  ucs_status_t Post(ucp_ep_h ep, unsigned id, std::unique_ptr<SendContext> context,
                    const void* data, size_t length, uint32_t flags);
  void Pump(const std::shared_ptr<Send>& send);
  void Fail(const std::shared_ptr<Send>& send, absl::Status status);
  void ClosePeer(const std::string& agent);
  void FailPeer(ucp_ep_h ep, ucs_status_t status);
  void ReapStuckSends();
  void Shutdown();
  ucs_status_t OnData(const void* header, size_t header_length, void* data, size_t length,
                      const ucp_am_recv_param_t* param);
  ucs_status_t OnCommit(const void* header, size_t header_length, void* data, size_t length,
                        const ucp_am_recv_param_t* param);
  ucs_status_t OnReply(const void* header, size_t header_length, void* data, size_t length,
                       const ucp_am_recv_param_t* param);

  static void OnConnection(ucp_conn_request_h request, void* arg);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnSendDone(void* request, ucs_status_t status, void* user_data);
  static void OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data);
  void Deliver(const RecvContext& context);

  const UcxTransportOptions options_;
  std::string agent_;
  std::string worker_address_;  // ucp_worker_get_address, handed to peers in targets
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int worker_fd_ = -1;
  int wake_fd_ = -1;
  std::thread progress_;

  absl::Mutex mu_;
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, std::shared_ptr<Send>> sends_ ABSL_GUARDED_BY(mu_);  // by TransferId
  uint64_t next_send_ ABSL_GUARDED_BY(mu_) = 1;

  // Touched by the progress thread only (and by Start / the destructor when it is not running).
  KvReceiver* receiver_ = nullptr;
  std::map<std::string, Peer> peers_;
  std::vector<ucp_ep_h> accepted_;
  std::map<uint64_t, std::shared_ptr<Send>> by_nonce_;  // sends awaiting their verdict
  std::vector<std::shared_ptr<Send>> abandoned_;        // released with messages in flight
  // What the requests posted and not yet completed hold, freed as each completes, and by the
  // destructor after the worker is gone for any that never will (a dead peer's, in error mode
  // NONE).
  std::set<SendContext*> pending_sends_;
  std::set<RecvContext*> pending_recvs_;
  size_t InFlight() const { return pending_sends_.size() + pending_recvs_.size(); }
  std::atomic<int> num_accepted_{0};
  size_t receiving_bytes_ = 0;  // rendezvous buffers being filled
  uint32_t data_flags_ = 0;     // ucp_am_send_nbx flags of data messages
};

}  // namespace tandem::kv
