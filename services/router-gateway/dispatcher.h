// Runs one generation across the cluster: reserve KV blocks on a decode instance, prefill on a
// prefill instance that writes the prompt's KV into them, then stream the decode. A health
// thread asks every instance for its load (GetInfo) every health_interval; decode instances are
// tried most free KV blocks first (then fewest running sequences), prefill instances shortest
// queue first, instances that failed their last check last. A decode instance without room
// (RESOURCE_EXHAUSTED) or unreachable is skipped, and a failed prefill or KV transfer is
// retried on the next prefill instance (the pruned decoder never recomputes a prompt). When no
// instance can serve, UNAVAILABLE says why;
// RESOURCE_EXHAUSTED when every decode instance is full, or every prefill queue (overload:
// retry later). A target whose host name resolves to several addresses counts as one instance
// per address, resolved again every resolve_interval (instances come and go with DNS).
// Blocking calls with deadlines: run it on a thread of its own, never on a gRPC reactor.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// What a target name resolves to: "address:port" per address, or an error when it does not
// resolve now.
using Resolver = std::function<absl::StatusOr<std::vector<std::string>>(const std::string&)>;

struct DispatcherOptions {
  absl::Duration health_interval = absl::Milliseconds(500);
  absl::Duration reserve_deadline = absl::Seconds(10);
  absl::Duration prefill_deadline = absl::Seconds(120);
  absl::Duration decode_deadline = absl::Seconds(600);
  // How often target names are resolved again, so that instances behind a DNS name (a
  // Kubernetes headless Service) come and go without a restart; zero: only at start-up.
  absl::Duration resolve_interval = absl::Seconds(10);
  // Resolves target names; LookupTarget (the system resolver) when unset.
  Resolver resolve = nullptr;
  // Called with the numbers of prefill and decode instances after each change (and at
  // start-up), e.g. for a gauge.
  std::function<void(size_t prefill, size_t decode)> on_instances = nullptr;
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

  // The instances' addresses now, sorted.
  std::vector<std::string> prefill_addresses() const;
  std::vector<std::string> decode_addresses() const;

 private:
  // The last health check of one instance.
  struct Health {
    bool healthy = true;  // optimistic until the first check
    int free_kv_blocks = 0;
    int running = 0;
    int queue_depth = 0;
  };
  // One address of a target; shared with the calls using it, so a refresh that drops it
  // does not pull it from under them.
  struct Instance {
    std::string target;  // the --prefill / --decode entry it came from
    std::string address;
    std::unique_ptr<tandem::v1::Prefill::Stub> prefill;  // set in prefill instances
    std::unique_ptr<tandem::v1::Decode::Stub> decode;    // set in decode instances
  };
  using Pool = std::vector<std::shared_ptr<Instance>>;

  // Resolves the targets again and rebuilds the pools, keeping instances whose address is
  // unchanged (with their health); a target that does not resolve keeps its instances.
  void Refresh(bool first);
  void CheckHealth();
  // The instances in the order to try them.
  Pool DecodeOrder();
  Pool PrefillOrder();

  const DispatcherOptions options_;
  const std::vector<std::string> prefill_targets_, decode_targets_;
  std::atomic<uint64_t> next_prefill_{0}, next_decode_{0};
  mutable absl::Mutex mu_;
  Pool prefill_ ABSL_GUARDED_BY(mu_), decode_ ABSL_GUARDED_BY(mu_);
  std::map<const Instance*, Health> health_of_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread health_;
};

// "host:port" -> one "address:port" per address the host resolves to (IPv4 and IPv6),
// sorted; NOT_FOUND when it does not resolve, INVALID_ARGUMENT without a port.
absl::StatusOr<std::vector<std::string>> LookupTarget(const std::string& target);

// LookupTarget, or the target itself when it does not resolve (the channel reports that).
std::vector<std::string> ResolveTarget(const std::string& target);

}  // namespace tandem::gateway
