// tandem-prefill's gRPC service: runs a prompt through the full expert pool in chunks on its
// own KV pool, samples the first token, sends the prompt's KV to the reservation a decode
// instance made (over the KV transport, under the reservation's token), and answers once the
// decode instance confirmed every byte. Prompts run one at a time on a worker thread, from a
// bounded queue (RESOURCE_EXHAUSTED when it is full); the gRPC threads never block. A call
// that is cancelled or past its deadline (the gateway sets it within the reservation's lease)
// stops at the next chunk, before sending, or while its KV is on the way; its blocks are freed
// only once the transport has let go of them.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/forward.h"
#include "common/engine/sampling.h"
#include "common/kv/transfer.h"
#include "common/rpc/internal_auth.h"
#include "common/rpc/rpc_metrics.h"
#include "services/common/serving_metrics.h"
#include "tandem/v1/prefill.grpc.pb.h"

namespace tandem::prefill {

struct PrefillServiceOptions {
  int max_queue = 64;
  int chunk_tokens = 256;
  absl::Duration transfer_deadline = absl::Seconds(30);
  // For fault tests: stop this process (SIGSTOP) once this many bytes of its first KV
  // transfer have been sent; 0: never.
  int64_t stop_after_kv_bytes = 0;
  // Every call must carry it (common/rpc/internal_auth.h); empty: not checked.
  std::string internal_secret;
};

// The checks a Prefill request passes before any work: the prompt within the context and the
// vocabulary, a target of our KV geometry and transport with a token of the right size, room
// for the prompt's blocks, valid sampling. INVALID_ARGUMENT (FAILED_PRECONDITION for another
// geometry) naming what is wrong.
absl::StatusOr<engine::SamplingParams> CheckPrefillRequest(
    const tandem::v1::PrefillRequest& request, const tandem::v1::KvGeometry& geometry,
    const model::ModelConfig& config, int block_size, std::string_view transport);

class PrefillService final : public tandem::v1::Prefill::CallbackService {
 public:
  // `forward` (and its pool) and `transport` must outlive the service.
  PrefillService(std::string model_name, tandem::v1::KvGeometry geometry,
                 engine::ForwardPass* forward, kv::KvTransport* transport,
                 const PrefillServiceOptions& options, rpc::RpcMetrics* metrics,
                 serving::PrefillMetrics* serving_metrics);
  // Finishes what is queued with UNAVAILABLE and stops the worker.
  ~PrefillService() override;

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const tandem::v1::PrefillRequest* request,
                                    tandem::v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const tandem::v1::InstanceInfoRequest* request,
                                    tandem::v1::InstanceInfo* response) override;

 private:
  struct Job {
    grpc::CallbackServerContext* context;
    const tandem::v1::PrefillRequest* request;
    tandem::v1::PrefillResponse* response;
    grpc::ServerUnaryReactor* reactor;
    absl::Time start;
  };
  grpc::ServerUnaryReactor* Enqueue(grpc::CallbackServerContext* context,
                                    const tandem::v1::PrefillRequest* request,
                                    tandem::v1::PrefillResponse* response);
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 tandem::v1::InstanceInfo* response);
  void Work();
  absl::Status Run(grpc::CallbackServerContext* context, const tandem::v1::PrefillRequest& request,
                   tandem::v1::PrefillResponse* response);

  const std::string model_name_;
  const tandem::v1::KvGeometry geometry_;
  engine::ForwardPass* const forward_;
  kv::KvTransport* const transport_;
  const PrefillServiceOptions options_;
  rpc::RpcMetrics* metrics_;
  serving::PrefillMetrics* serving_metrics_;
  const rpc::InternalAuth auth_;
  absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stopped_for_test_{false};
  std::thread worker_;
};

}  // namespace tandem::prefill
