// tandem-decode's gRPC service. Reserve sets aside KV blocks for a prompt plus its max_tokens
// under a lease (freed, by a timer, if Decode has not claimed them in time) and answers with a
// target: this agent and a fresh random token under which a prefill instance sends the
// prompt's KV. What arrives goes through the reservation's inbox (common/kv/inbox.h) into its
// blocks, and only while the reservation lasts. Decode claims a reservation whose KV is
// complete and hands the sequence, whose first token prefill sampled, to the engine loop
// (continuous batching over every running sequence) and streams its tokens, with a keep-alive
// whenever there is nothing to say for a while; a client that goes away cancels it and its
// blocks are freed at once. Release drops a reservation that will not be used. Handles and
// tokens are 128-bit random: unguessable.
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/engine_loop.h"
#include "common/kv/inbox.h"
#include "common/kv/transfer.h"
#include "common/rpc/internal_auth.h"
#include "common/rpc/rpc_metrics.h"
#include "common/util/clock.h"
#include "common/util/timer_queue.h"
#include "services/common/serving_metrics.h"
#include "tandem/v1/decode.grpc.pb.h"

namespace tandem::decode {

struct DecodeServiceOptions {
  absl::Duration lease = absl::Seconds(30);
  // A stream with nothing to say for this long sends a keep-alive (a heartbeat message).
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // Every call must carry it (common/rpc/internal_auth.h); empty: not checked.
  std::string internal_secret;
};

class DecodeService final : public tandem::v1::Decode::CallbackService {
 public:
  // `loop` steps the engine whose pool `inbox` writes into; `transport` (which delivers to
  // `inbox`) names this agent in targets. All must outlive the service.
  DecodeService(std::string model_name, tandem::v1::KvGeometry geometry, engine::EngineLoop* loop,
                kv::KvInbox* inbox, const kv::KvTransport* transport, int vocab_size,
                const DecodeServiceOptions& options, rpc::RpcMetrics* metrics,
                serving::DecodeMetrics* serving_metrics);
  ~DecodeService() override;

  grpc::ServerUnaryReactor* Reserve(grpc::CallbackServerContext* context,
                                    const tandem::v1::ReserveRequest* request,
                                    tandem::v1::ReserveResponse* response) override;
  grpc::ServerWriteReactor<tandem::v1::GenerateStreamResponse>* Decode(
      grpc::CallbackServerContext* context, const tandem::v1::DecodeRequest* request) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const tandem::v1::ReleaseRequest* request,
                                    tandem::v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const tandem::v1::InstanceInfoRequest* request,
                                    tandem::v1::InstanceInfo* response) override;

 private:
  struct Reservation {
    engine::BlockTable table;
    int prompt_tokens;
    int max_tokens;     // what the blocks have room for
    std::string token;  // its inbox's
    util::TimerQueue::Id lease_timer = 0;
  };
  grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, absl::string_view rpc,
                                 const absl::Status& status, util::Instant start);
  // Frees a reservation whose lease has passed (the lease timer's callback).
  void Expire(const std::string& handle);
  // Closes its inbox (no byte lands after this) and frees its blocks.
  void Drop(Reservation& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BlockGauges();

  const std::string model_name_;
  const tandem::v1::KvGeometry geometry_;
  engine::EngineLoop* const loop_;
  kv::KvInbox* const inbox_;
  const std::string transport_name_;
  const kv::KvPeer self_;
  const int vocab_size_;
  const DecodeServiceOptions options_;
  rpc::RpcMetrics* metrics_;
  serving::DecodeMetrics* serving_metrics_;
  const rpc::InternalAuth auth_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Reservation> reservations_ ABSL_GUARDED_BY(mu_);
  // The leases' timers; stopped first of all in the destructor.
  std::unique_ptr<util::TimerQueue> timers_ = std::make_unique<util::TimerQueue>();
};

}  // namespace tandem::decode
