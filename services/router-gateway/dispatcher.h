// Runs one generation across the cluster: reserve KV blocks on a decode instance, prefill on a
// prefill instance that writes the prompt's KV into them, then stream the decode. Instances are
// tried round-robin; a decode instance without room (RESOURCE_EXHAUSTED) or unreachable is
// skipped, and a failed prefill or KV transfer is retried on the next prefill instance (the
// pruned decoder never recomputes a prompt). When no instance can serve, UNAVAILABLE says why.
// Blocking calls with deadlines: run it on a thread of its own, never on a gRPC reactor.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tandem/v1/decode.grpc.pb.h"
#include "tandem/v1/prefill.grpc.pb.h"

namespace tandem::gateway {

// Lets another thread abort a running dispatch (the client went away).
class DispatchCall {
 public:
  void Cancel();
  bool cancelled() const;

 private:
  friend class Dispatcher;
  // The downstream call in flight, cancelled along with this one.
  void Track(grpc::ClientContext* context);

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* current_ ABSL_GUARDED_BY(mu_) = nullptr;
};

struct DispatcherOptions {
  absl::Duration reserve_deadline = absl::Seconds(10);
  absl::Duration prefill_deadline = absl::Seconds(120);
  absl::Duration decode_deadline = absl::Seconds(600);
};

class Dispatcher {
 public:
  Dispatcher(const std::vector<std::string>& prefill_targets,
             const std::vector<std::string>& decode_targets, const DispatcherOptions& options);

  // Generates from `prompt`; each decode chunk goes to `on_chunk` on this thread.
  absl::Status Run(const std::string& request_id, const std::vector<int32_t>& prompt,
                   const tandem::v1::SamplingParams& sampling, int max_tokens, DispatchCall* call,
                   const std::function<void(const tandem::v1::GenerateStreamResponse&)>& on_chunk);

 private:
  struct Instance {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
  };

  const DispatcherOptions options_;
  std::vector<Instance> prefill_, decode_;
  std::vector<std::unique_ptr<tandem::v1::Prefill::Stub>> prefill_stubs_;
  std::vector<std::unique_ptr<tandem::v1::Decode::Stub>> decode_stubs_;
  std::atomic<uint64_t> next_prefill_{0}, next_decode_{0};
};

}  // namespace tandem::gateway
