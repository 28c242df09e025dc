// What the gateway's front ends (gRPC and the OpenAI HTTP API) hand their generations to: a
// GenerationBackend that runs them asynchronously, in the cluster (dispatcher.h) or on an
// engine in this process (services/serve/local_backend.h). Nothing here blocks a thread for
// the life of a request: a generation is a chain of callbacks, and its output goes to a
// GenerationSink as it comes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/gateway.pb.h"

namespace tandem::gateway {

// Cancels one generation from any thread (the client went away, the gateway drains). The
// stages doing the work register what cancelling must also do (cancel a downstream call,
// drop a sequence); hooks run outside any lock of this object, each exactly once.
class DispatchCall {
 public:
  void Cancel();
  bool cancelled() const;
  // Runs `fn` on Cancel (at once, on this thread, if already cancelled). The returned id
  // removes it.
  uint64_t OnCancel(std::function<void()> fn);
  void RemoveOnCancel(uint64_t id);

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::function<void()>> hooks_ ABSL_GUARDED_BY(mu_);
};

// Where one generation's output goes: chunks in order, then exactly one OnDone. Calls for
// one generation never overlap, come from any thread (a gRPC callback, the engine thread, a
// timer) and must not block.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual void OnChunk(const tandem::v1::GenerateStreamResponse& chunk) = 0;
  // The generation is alive but has had nothing to say for a while (a stream's keep-alive).
  virtual void OnKeepAlive() {}
  virtual void OnDone(const absl::Status& status) = 0;
};

struct GenerationRequest {
  std::string request_id;
  std::vector<int32_t> prompt;  // token ids
  tandem::v1::SamplingParams sampling;
  int max_tokens = 0;  // within the context; 0: score the prompt only (prompt_logprobs)
};

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  // Starts one generation and returns at once (the sink may already have been called).
  // `call` cancels it (OnDone: CANCELLED). RESOURCE_EXHAUSTED at OnDone before any chunk
  // means nothing had room for it now: it may be retried later.
  virtual void Start(GenerationRequest request, std::shared_ptr<DispatchCall> call,
                     std::shared_ptr<GenerationSink> sink) = 0;
};

}  // namespace tandem::gateway
