// Colocated mode: the gateway's generations run on an engine in this process (one engine loop,
// one KV pool, prefill and decode in the same continuous batch), so no KV moves at all. The
// engine thread hands each output straight to the generation's sink; nothing waits on a
// thread of its own.
#pragma once

#include <memory>

#include "absl/time/time.h"
#include "common/engine/engine_loop.h"
#include "services/router-gateway/backend.h"

namespace tandem::serve {

class LocalBackend : public gateway::GenerationBackend {
 public:
  // `loop` must outlive the backend and every generation it started (stop the gateway
  // service first). A generation still running after `deadline` ends with
  // DEADLINE_EXCEEDED.
  LocalBackend(engine::EngineLoop* loop, int vocab_size,
               absl::Duration deadline = absl::Seconds(600))
      : loop_(loop), vocab_size_(vocab_size), deadline_(deadline) {}

  void Start(gateway::GenerationRequest request, std::shared_ptr<gateway::DispatchCall> call,
             std::shared_ptr<gateway::GenerationSink> sink) override;

 private:
  engine::EngineLoop* const loop_;
  const int vocab_size_;
  const absl::Duration deadline_;
};

}  // namespace tandem::serve
