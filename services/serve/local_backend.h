// Colocated mode: the gateway's generations run on an engine in this process (one engine loop,
// one KV pool, prefill and decode in the same continuous batch), so no KV moves at all. The
// scheduler's per-phase MoE options (SchedulerConfig::prefill / decode) are where a pruned
// decode goes once pruning plans exist (issue #6).
#pragma once

#include "common/engine/engine_loop.h"
#include "services/router-gateway/dispatcher.h"

namespace tandem::serve {

class LocalBackend : public gateway::GenerationBackend {
 public:
  // `loop` must outlive the backend.
  LocalBackend(engine::EngineLoop* loop, int vocab_size,
               absl::Duration deadline = absl::Seconds(600))
      : loop_(loop), vocab_size_(vocab_size), deadline_(deadline) {}

  absl::Status Run(
      const std::string& request_id, const std::vector<int32_t>& prompt,
      const tandem::v1::SamplingParams& sampling, int max_tokens, gateway::DispatchCall* call,
      const std::function<void(const tandem::v1::GenerateStreamResponse&)>& on_chunk) override;

 private:
  engine::EngineLoop* const loop_;
  const int vocab_size_;
  const absl::Duration deadline_;
};

}  // namespace tandem::serve
