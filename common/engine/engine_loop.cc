#include "common/engine/engine_loop.h"

#include "absl/time/clock.h"
#include "common/util/clock.h"
#include "common/util/guard.h"
#include "common/util/logging.h"
#include "common/util/status.h"

namespace tandem::engine {

std::unique_ptr<EngineLoop> EngineLoop::Start(std::unique_ptr<Scheduler> scheduler,
                                              StepObserver observer) {
  auto loop = std::unique_ptr<EngineLoop>(new EngineLoop(std::move(scheduler)));
  loop->observer_ = std::move(observer);
  loop->thread_ = std::thread([raw = loop.get()] { raw->Run(); });
  return loop;
}

EngineLoop::EngineLoop(std::unique_ptr<Scheduler> scheduler)
    : scheduler_(std::move(scheduler)), pool_(scheduler_->pool()) {
  load_.total_blocks = pool_->num_total();
  load_.free_blocks = pool_->num_free();
}

EngineLoop::~EngineLoop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::StatusOr<SequenceId> EngineLoop::Submit(SequenceRequest request, OutputCallback on_output) {
  RETURN_IF_ERROR(scheduler_->Validate(request));
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("the engine is shutting down");
  const SequenceId id{next_id_++};
  submissions_.push_back(
      {id, std::move(request), std::nullopt, -1, std::nullopt, std::move(on_output)});
  ++load_.waiting;
  return id;
}

absl::StatusOr<SequenceId> EngineLoop::SubmitPrefilled(SequenceRequest request, BlockTable table,
                                                       int32_t first_token,
                                                       std::optional<TokenLogprobs> first_logprobs,
                                                       OutputCallback on_output) {
  if (absl::Status s = scheduler_->Validate(request); !s.ok()) {
    table.ReleaseAll(pool_);
    return s;
  }
  absl::MutexLock lock(&mu_);
  if (stop_) {
    table.ReleaseAll(pool_);
    return absl::UnavailableError("the engine is shutting down");
  }
  const SequenceId id{next_id_++};
  submissions_.push_back({id, std::move(request), std::move(table), first_token,
                          std::move(first_logprobs), std::move(on_output)});
  ++load_.waiting;
  return id;
}

void EngineLoop::Cancel(SequenceId id) {
  absl::MutexLock lock(&mu_);
  cancels_.push_back(id);
}

EngineLoop::Load EngineLoop::load() const {
  absl::MutexLock lock(&mu_);
  return load_;
}

void EngineLoop::Run() {
  while (true) {
    std::deque<Submission> submissions;
    std::vector<SequenceId> cancels;
    bool stop;
    {
      absl::MutexLock lock(&mu_);
      // Sleep while there is nothing to do; wake on new work (or every 100 ms regardless).
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !submissions_.empty() || !cancels_.empty() || !scheduler_->idle();
      };
      mu_.AwaitWithTimeout(absl::Condition(&has_work), absl::Milliseconds(100));
      submissions.swap(submissions_);
      cancels.swap(cancels_);
      stop = stop_;
    }
    for (Submission& s : submissions) {
      absl::StatusOr<SequenceId> added =
          s.table.has_value() ? scheduler_->AddPrefilled(std::move(s.request), *std::move(s.table),
                                                         s.first_token, std::move(s.first_logprobs))
                              : scheduler_->Add(std::move(s.request));
      if (!added.ok()) {
        SequenceOutput out;
        out.id = s.id;
        out.status = added.status();
        util::Guarded("engine output callback", [&] { s.on_output(out); });
        continue;
      }
      live_[s.id] = {*added, std::move(s.on_output)};
      by_scheduler_id_[*added] = s.id;
    }
    for (SequenceId id : cancels) {
      auto it = live_.find(id);
      if (it == live_.end()) continue;
      scheduler_->Cancel(it->second.scheduler_id);
      by_scheduler_id_.erase(it->second.scheduler_id);
      live_.erase(it);
    }
    if (stop) {
      for (auto& entry : live_) {
        Live& live = entry.second;
        scheduler_->Cancel(live.scheduler_id);
        SequenceOutput out;
        out.id = entry.first;
        out.status = absl::CancelledError("the engine is shutting down");
        util::Guarded("engine output callback", [&] { live.on_output(out); });
      }
      live_.clear();
      by_scheduler_id_.clear();
      return;
    }
    std::vector<SequenceOutput> outputs;
    const SchedulerCounters before = scheduler_->counters();
    const util::Instant step_start = util::Instant::Now();
    absl::Status status = absl::InternalError("the engine step threw");
    util::Guarded("engine step", [&] { status = scheduler_->Step(&outputs); });
    const double step_seconds = absl::ToDoubleSeconds(util::Since(step_start));
    if (!status.ok()) {
      TANDEM_LOG(ERROR) << "engine step failed: " << status;
    }
    // The step's load and its report first, then its outputs: whatever an output sets off
    // (a handoff, a reply, a client scraping /metrics after it) sees the step counted.
    {
      absl::MutexLock lock(&mu_);
      load_.running = scheduler_->num_running();
      load_.waiting = scheduler_->num_waiting() + static_cast<int>(submissions_.size());
      load_.free_blocks = pool_->num_free();
      load_.steps = scheduler_->counters().steps;
    }
    const bool stepped = scheduler_->counters().steps > before.steps;
    if (observer_ && (stepped || !cancels.empty())) {
      const SchedulerCounters& after = scheduler_->counters();
      StepReport report;
      report.stepped = stepped;
      report.seconds = step_seconds;
      report.tokens =
          after.prefill_tokens + after.decode_tokens - before.prefill_tokens - before.decode_tokens;
      report.running = scheduler_->num_running();
      report.waiting = scheduler_->num_waiting();
      report.free_blocks = pool_->num_free();
      report.preemptions = after.preemptions - before.preemptions;
      report.prefix_query_tokens = after.prefix_query_tokens - before.prefix_query_tokens;
      report.prefix_hit_tokens = after.prefix_hit_tokens - before.prefix_hit_tokens;
      report.prefill_tokens = after.prefill_tokens - before.prefill_tokens;
      for (const SequenceOutput& out : outputs) report.generated += out.token.has_value();
      util::Guarded("engine step observer", [&] { observer_(report); });
    }
    for (SequenceOutput& out : outputs) {
      auto ours = by_scheduler_id_.find(out.id);
      if (ours == by_scheduler_id_.end()) continue;
      const SequenceId id = ours->second;
      auto it = live_.find(id);
      const bool last = out.finish != FinishReason::kNone || !out.status.ok();
      out.id = id;
      util::Guarded("engine output callback", [&] { it->second.on_output(out); });
      if (last) {
        by_scheduler_id_.erase(ours);
        live_.erase(it);
      }
    }
    // Work that cannot run yet (every sequence waiting on blocks): do not spin.
    if (!scheduler_->idle() && scheduler_->counters().steps == before.steps) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
}

}  // namespace tandem::engine
