// The engine's executor: one thread that owns a Scheduler and steps it whenever there is work.
// Any thread (a gRPC reactor) submits sequences and cancels them; each sequence's outputs go,
// in order, to its callback on the engine thread, which must not block (hand them to the
// reactor). Bad requests are refused at Submit, synchronously.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/scheduler.h"

namespace tandem::engine {

class EngineLoop {
 public:
  using OutputCallback = std::function<void(const SequenceOutput&)>;

  struct Load {
    int running = 0;
    int waiting = 0;  // submitted or queued, not yet holding KV
    int free_blocks = 0;
    int total_blocks = 0;
    int64_t steps = 0;
  };

  // What one step did, for metrics; or, with stepped false, the state after cancellations
  // that no step followed (the loop went idle).
  struct StepReport {
    bool stepped = true;
    double seconds = 0;
    int64_t tokens = 0;  // tokens the forward pass ran (decode + prefill)
    int running = 0;     // sequences holding KV after the step
    int waiting = 0;
    int free_blocks = 0;
    int64_t generated = 0;    // tokens sampled in the step
    int64_t preemptions = 0;  // sequences the step preempted
    // Prefix cache: tokens of the sequences the step started, and those taken from the cache.
    int64_t prefix_query_tokens = 0;
    int64_t prefix_hit_tokens = 0;
    int64_t prefill_tokens = 0;  // prompt (and recomputed) tokens the forward pass ran
  };
  using StepObserver = std::function<void(const StepReport&)>;

  // Takes the scheduler (and through it the forward pass it steps) and starts the thread.
  // `observer`, if set, is called on the engine thread after every step (before the step's
  // outputs go to their callbacks, so that what an output sets off sees the step counted),
  // and after cancellations that no step follows.
  static std::unique_ptr<EngineLoop> Start(std::unique_ptr<Scheduler> scheduler,
                                           StepObserver observer = nullptr);
  // Stops the thread; every sequence still live gets a last output with status CANCELLED.
  ~EngineLoop();

  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues a sequence; its outputs go to `on_output` until one carries a finish reason or an
  // error. INVALID_ARGUMENT (Scheduler::Validate) before anything is queued.
  absl::StatusOr<SequenceId> Submit(SequenceRequest request, OutputCallback on_output);
  // The same for a sequence prefilled elsewhere (Scheduler::AddPrefilled); `table` belongs to
  // this engine's pool. Errors found on the engine thread arrive as an output with a status.
  absl::StatusOr<SequenceId> SubmitPrefilled(SequenceRequest request, BlockTable table,
                                             int32_t first_token,
                                             std::optional<TokenLogprobs> first_logprobs,
                                             OutputCallback on_output);
  // Drops a sequence and frees its blocks soon (on the engine thread); no output follows once
  // that happened. Unknown or finished ids are ignored.
  void Cancel(SequenceId id);

  Load load() const;
  // The engine's pool (thread-safe; block tables for SubmitPrefilled come from it).
  KvBlockPool* pool() const { return pool_; }

 private:
  struct Submission {
    SequenceId id;
    SequenceRequest request;
    std::optional<BlockTable> table;  // prefilled
    int32_t first_token = -1;
    std::optional<TokenLogprobs> first_logprobs;
    OutputCallback on_output;
  };

  EngineLoop(std::unique_ptr<Scheduler> scheduler);
  void Run();

  const std::unique_ptr<Scheduler> scheduler_;
  KvBlockPool* const pool_;
  StepObserver observer_;
  mutable absl::Mutex mu_;
  std::deque<Submission> submissions_ ABSL_GUARDED_BY(mu_);
  std::vector<SequenceId> cancels_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  Load load_ ABSL_GUARDED_BY(mu_);
  // Engine thread only: our id -> the scheduler's, and the callback.
  struct Live {
    SequenceId scheduler_id;
    OutputCallback on_output;
  };
  absl::flat_hash_map<SequenceId, Live> live_;
  absl::flat_hash_map<SequenceId, SequenceId> by_scheduler_id_;
  std::thread thread_;
};

}  // namespace tandem::engine
