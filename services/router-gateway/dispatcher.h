// Runs one generation across the cluster: reserve KV blocks on a decode instance, prefill on a
// prefill instance that writes the prompt's KV into them, then stream the decode. A health
// thread asks every instance for its load (GetInfo) every health_interval; decode instances are
// tried most free KV blocks first (then fewest running sequences), prefill instances shortest
// queue first, instances that failed their last check last. A decode instance without room
// (RESOURCE_EXHAUSTED) or unreachable is skipped, and a failed prefill or KV transfer is
// retried on the next prefill instance (the pruned decoder never recomputes a prompt). When no
// instance can serve, UNAVAILABLE says why;
// RESOURCE_EXHAUSTED when every decode instance is full, or every prefill queue (overload:
// retry later). A target whose host name resolves to several
// addresses counts as one instance per address (resolved at start-up).
// Blocking calls with deadlines: run it on a thread of its own, never on a gRPC reactor.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tandem/v1/decode.grpc.pb.h"
#include "tandem/v1/prefill.grpc.pb.h"

namespace tandem::gateway {

// Lets another thread abort a running generation (the client went away).
class DispatchCall {
 public:
  void Cancel();
  bool cancelled() const;
  // What Cancel must also do while the current step runs (cancel a downstream call, drop a
  // sequence); runs at once if already cancelled. Cleared by ClearOnCancel.
  void OnCancel(std::function<void()> fn);
  void ClearOnCancel();

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
};

// Where the gateway's generations run: the cluster (Dispatcher) or an engine in this process
// (LocalBackend, colocated mode). Run blocks; call it on a worker thread.
class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  // Generates from `prompt`; each chunk goes to `on_chunk` on this thread.
  virtual absl::Status Run(
      const std::string& request_id, const std::vector<int32_t>& prompt,
      const tandem::v1::SamplingParams& sampling, int max_tokens, DispatchCall* call,
      const std::function<void(const tandem::v1::GenerateStreamResponse&)>& on_chunk) = 0;
};

struct DispatcherOptions {
  absl::Duration health_interval = absl::Milliseconds(500);
  absl::Duration reserve_deadline = absl::Seconds(10);
  absl::Duration prefill_deadline = absl::Seconds(120);
  absl::Duration decode_deadline = absl::Seconds(600);
};

class Dispatcher : public GenerationBackend {
 public:
  Dispatcher(const std::vector<std::string>& prefill_targets,
             const std::vector<std::string>& decode_targets, const DispatcherOptions& options);
  // Stops the health thread.
  ~Dispatcher() override;

  absl::Status Run(
      const std::string& request_id, const std::vector<int32_t>& prompt,
      const tandem::v1::SamplingParams& sampling, int max_tokens, DispatchCall* call,
      const std::function<void(const tandem::v1::GenerateStreamResponse&)>& on_chunk) override;

 private:
  struct Instance {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
  };
  // The last health check of one instance.
  struct Health {
    bool healthy = true;  // optimistic until the first check
    int free_kv_blocks = 0;
    int running = 0;
    int queue_depth = 0;
  };

  void CheckHealth();
  // Instance indices in the order to try them.
  std::vector<size_t> DecodeOrder();
  std::vector<size_t> PrefillOrder();

  const DispatcherOptions options_;
  std::vector<Instance> prefill_, decode_;
  std::vector<std::unique_ptr<tandem::v1::Prefill::Stub>> prefill_stubs_;
  std::vector<std::unique_ptr<tandem::v1::Decode::Stub>> decode_stubs_;
  std::atomic<uint64_t> next_prefill_{0}, next_decode_{0};
  absl::Mutex mu_;
  std::vector<Health> prefill_health_ ABSL_GUARDED_BY(mu_), decode_health_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread health_;
};

// "host:port" -> one "address:port" per address the host resolves to (IPv4 and IPv6), in the
// resolver's order; the target itself when it does not resolve (the channel reports that).
std::vector<std::string> ResolveTarget(const std::string& target);

}  // namespace tandem::gateway
