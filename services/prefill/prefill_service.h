// tandem-prefill's gRPC service: runs prompts through the full expert pool on its own KV pool,
// samples each one's first token, sends the prompt's KV to the reservation a decode instance
// made (over the KV transport, under the reservation's token), and answers once the decode
// instance confirmed every byte. Prompts run together in the engine's continuous batch
// (common/engine/scheduler.h: several prompts, chunked, in one step, oldest first), each
// shipped as soon as it is complete; with the prefix cache on, a prompt starts from the longest
// run of cached blocks matching it and computes only the rest (cached blocks are shipped like
// computed ones). At most max_queue prompts are in the instance (RESOURCE_EXHAUSTED beyond);
// the gRPC threads never block. A call that is cancelled or past its deadline (the gateway sets
// it within the reservation's lease) is dropped from the batch, or its transfer abandoned,
// within a few milliseconds; its blocks are freed only once the transport has let go of them.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/engine_loop.h"
#include "common/engine/forward.h"
#include "common/engine/sampling.h"
#include "common/kv/kv_stream.h"
#include "common/kv/transfer.h"
#include "common/rpc/internal_auth.h"
#include "common/rpc/rpc_metrics.h"
#include "common/util/clock.h"
#include "services/common/serving_metrics.h"
#include "tandem/v1/prefill.grpc.pb.h"

namespace tandem::prefill {

struct PrefillServiceOptions {
  int max_queue = 64;        // prompts in the instance at once: waiting, running or shipping
  int max_running = 16;      // prompts in the engine's batch at once
  int chunk_tokens = 512;    // prompt tokens one engine step runs, all prompts together
  bool prefix_cache = true;  // reuse cached prompt blocks (docs/kv-cache.md "Prefix cache")
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
  // `forward` (and its pool), `tokenizer` (the first token of a constrained output is drawn
  // under its grammar; null: constraints are refused) and `transport` must outlive the
  // service. INVALID_ARGUMENT for options the engine cannot run (max_running above
  // chunk_tokens, either below 1).
  static absl::StatusOr<std::unique_ptr<PrefillService>> Create(
      std::string model_name, tandem::v1::KvGeometry geometry, engine::ForwardPass* forward,
      const model::Tokenizer* tokenizer, kv::KvTransport* transport,
      const PrefillServiceOptions& options, rpc::RpcMetrics* metrics,
      serving::PrefillMetrics* serving_metrics, serving::PrefixCacheMetrics* prefix_metrics);
  // Finishes every prompt still in the instance with UNAVAILABLE and stops its threads.
  ~PrefillService() override;

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const tandem::v1::PrefillRequest* request,
                                    tandem::v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const tandem::v1::InstanceInfoRequest* request,
                                    tandem::v1::InstanceInfo* response) override;

 private:
  // One prompt, from its arrival to its answer. Its fields are guarded by mu_.
  struct Job {
    enum class State {
      kComputing,  // in the engine
      kComputed,   // its KV is complete; the shipper posts the transfer
      kShipping,   // its KV is on the way
      kDone,       // `status` is the answer; the shipper finishes the call
    };
    int64_t id = 0;
    grpc::CallbackServerContext* context = nullptr;
    const tandem::v1::PrefillRequest* request = nullptr;
    tandem::v1::PrefillResponse* response = nullptr;
    grpc::ServerUnaryReactor* reactor = nullptr;
    util::Instant start;     // arrival
    util::Instant deadline;  // the call's
    State state = State::kComputing;
    engine::SequenceId sequence{};
    util::Instant computed;
    std::shared_ptr<const engine::PromptKv> kv;  // the prompt's blocks, once computed
    std::optional<kv::KvStream> stream;          // over `kv`, while shipping
    std::optional<kv::TransferId> transfer;
    util::Instant transfer_deadline;
    uint64_t bytes = 0;
    absl::Status status;
  };

  PrefillService(std::string model_name, tandem::v1::KvGeometry geometry,
                 engine::ForwardPass* forward, kv::KvTransport* transport,
                 const PrefillServiceOptions& options, rpc::RpcMetrics* metrics,
                 serving::PrefillMetrics* serving_metrics,
                 std::unique_ptr<engine::Scheduler> scheduler,
                 engine::EngineLoop::StepObserver observer);
  grpc::ServerUnaryReactor* Enqueue(grpc::CallbackServerContext* context,
                                    const tandem::v1::PrefillRequest* request,
                                    tandem::v1::PrefillResponse* response);
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 tandem::v1::InstanceInfo* response);
  // The engine thread's callback: records a prompt's first token and KV (or its failure).
  void OnOutput(int64_t job_id, const engine::SequenceOutput& out);
  // The shipper thread: posts transfers, polls them, enforces cancellation and deadlines, and
  // answers calls.
  void Ship();
  // One pass of Ship over every job; appends the jobs that are done to `done`.
  void ShipOnce(std::vector<std::unique_ptr<Job>>* done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(Job* job, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetQueueDepth() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string model_name_;
  const tandem::v1::KvGeometry geometry_;
  engine::ForwardPass* const forward_;
  kv::KvTransport* const transport_;
  const PrefillServiceOptions options_;
  rpc::RpcMetrics* metrics_;
  serving::PrefillMetrics* serving_metrics_;
  const rpc::InternalAuth auth_;
  absl::Mutex mu_;
  absl::flat_hash_map<int64_t, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;  // a job needs the shipper now
  std::atomic<bool> stopped_for_test_{false};
  std::thread shipper_;
  // Last: destroyed first, while the jobs and the mutex its callbacks use still exist.
  std::unique_ptr<engine::EngineLoop> loop_;
};

}  // namespace tandem::prefill
