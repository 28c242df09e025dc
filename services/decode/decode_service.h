// tandem-decode's gRPC service. Reserve sets aside KV blocks for a prompt plus its max_tokens
// (under a lease: freed if Decode has not claimed them in time) and answers with the target a
// prefill instance writes the prompt's KV into over the KV transport. Decode then hands the
// sequence, whose first token prefill sampled, to the engine loop (continuous batching over
// every running sequence) and streams its tokens; a client that goes away cancels it and its
// blocks are freed at once. Release drops a reservation that will not be used.
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/engine_loop.h"
#include "common/kv/transfer.h"
#include "common/rpc/rpc_metrics.h"
#include "services/common/serving_metrics.h"
#include "tandem/v1/decode.grpc.pb.h"

namespace tandem::decode {

struct DecodeServiceOptions {
  absl::Duration lease = absl::Seconds(30);
  // A stream with nothing to say for this long sends a keep-alive (a heartbeat message).
  absl::Duration heartbeat_interval = absl::Seconds(2);
};

class DecodeService final : public tandem::v1::Decode::CallbackService {
 public:
  // `loop` steps the engine whose pool `pool_region` (registered with the transport)
  // describes; all must outlive the service.
  DecodeService(std::string model_name, tandem::v1::KvGeometry geometry, engine::EngineLoop* loop,
                kv::MemoryDescriptor pool_region, int vocab_size,
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
    absl::Time expires;
  };
  grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, absl::string_view rpc,
                                 const absl::Status& status, absl::Time start);
  // Frees reservations whose lease has passed.
  void Expire() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string model_name_;
  const tandem::v1::KvGeometry geometry_;
  engine::EngineLoop* const loop_;
  const kv::MemoryDescriptor pool_region_;
  const int vocab_size_;
  const DecodeServiceOptions options_;
  rpc::RpcMetrics* metrics_;
  serving::DecodeMetrics* serving_metrics_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Reservation> reservations_ ABSL_GUARDED_BY(mu_);
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace tandem::decode
