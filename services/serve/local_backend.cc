#include "services/serve/local_backend.h"

#include <deque>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/util/guard.h"
#include "common/util/timer_queue.h"
#include "services/common/serving.h"

namespace tandem::serve {
namespace {

// One generation on the engine: outputs from the engine thread, cancellation and the
// deadline from anywhere; exactly one of them ends it.
class Local : public std::enable_shared_from_this<Local> {
 public:
  Local(engine::EngineLoop* loop, std::string request_id, int prompt_tokens,
        std::shared_ptr<gateway::DispatchCall> call, std::shared_ptr<gateway::GenerationSink> sink)
      : loop_(loop),
        request_id_(std::move(request_id)),
        prompt_tokens_(prompt_tokens),
        call_(std::move(call)),
        sink_(std::move(sink)) {}

  void Begin(engine::SequenceRequest request, absl::Duration deadline) {
    absl::StatusOr<engine::SequenceId> id = loop_->Submit(
        std::move(request),
        [self = shared_from_this()](const engine::SequenceOutput& out) { self->OnOutput(out); });
    if (!id.ok()) return End(id.status());
    {
      absl::MutexLock lock(&mu_);
      id_ = *id;
    }
    std::weak_ptr<Local> weak = weak_from_this();
    const util::TimerQueue::Id timer = util::TimerQueue::Shared().ScheduleAfter(deadline, [weak] {
      if (auto self = weak.lock()) {
        self->Stop(absl::DeadlineExceededError("the generation ran past its deadline"));
      }
    });
    const uint64_t hook = call_->OnCancel([weak] {
      if (auto self = weak.lock()) self->Stop(absl::CancelledError("the client went away"));
    });
    bool done;
    {
      absl::MutexLock lock(&mu_);
      timer_ = timer;
      hook_ = hook;
      done = done_;
    }
    if (done) Disarm(timer, hook);  // it ended before the timer and hook were in place
  }

 private:
  void OnOutput(const engine::SequenceOutput& out) {
    if (!out.status.ok()) return End(out.status);
    tandem::v1::GenerateStreamResponse chunk;
    chunk.set_request_id(request_id_);
    serving::FillChunk(out, prompt_tokens_, &completion_, &chunk);
    const bool last = out.finish != engine::FinishReason::kNone;
    Deliver([chunk = std::move(chunk)](gateway::GenerationSink& sink) { sink.OnChunk(chunk); },
            /*last=*/false);
    if (last) End(absl::OkStatus());
  }

  // Cancelled or past the deadline: drop the sequence (no output follows once the engine
  // has), then end.
  void Stop(const absl::Status& why) {
    std::optional<engine::SequenceId> id;
    {
      absl::MutexLock lock(&mu_);
      id = id_;
    }
    if (id.has_value()) loop_->Cancel(*id);
    End(why);
  }

  void End(const absl::Status& status) {
    util::TimerQueue::Id timer;
    uint64_t hook;
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;
      done_ = true;
      timer = timer_;
      hook = hook_;
    }
    Disarm(timer, hook);
    Deliver([status](gateway::GenerationSink& sink) { sink.OnDone(status); }, /*last=*/true);
  }

  // Calls the sink in order and one call at a time, never while holding a lock (a sink may
  // cancel, which ends the generation from inside its own call): a call made while another
  // runs is queued and made by the thread already delivering.
  void Deliver(std::function<void(gateway::GenerationSink&)> event, bool last) {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = last;
      pending_.push_back(std::move(event));
      if (delivering_) return;
      delivering_ = true;
    }
    while (true) {
      std::deque<std::function<void(gateway::GenerationSink&)>> events;
      {
        absl::MutexLock lock(&mu_);
        events.swap(pending_);
        if (events.empty()) {
          delivering_ = false;
          return;
        }
      }
      for (auto& e : events) util::Guarded("generation sink", [&] { e(*sink_); });
    }
  }

  void Disarm(util::TimerQueue::Id timer, uint64_t hook) {
    if (timer != 0) util::TimerQueue::Shared().Cancel(timer);
    if (hook != 0) call_->RemoveOnCancel(hook);
  }

  engine::EngineLoop* const loop_;
  const std::string request_id_;
  const int prompt_tokens_;
  const std::shared_ptr<gateway::DispatchCall> call_;
  const std::shared_ptr<gateway::GenerationSink> sink_;
  int completion_ = 0;  // engine thread only
  absl::Mutex mu_;
  std::optional<engine::SequenceId> id_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;  // the last event is queued
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void(gateway::GenerationSink&)>> pending_ ABSL_GUARDED_BY(mu_);
  util::TimerQueue::Id timer_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t hook_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

void LocalBackend::Start(gateway::GenerationRequest request,
                         std::shared_ptr<gateway::DispatchCall> call,
                         std::shared_ptr<gateway::GenerationSink> sink) {
  tandem::v1::SamplingParams with_max = request.sampling;
  with_max.set_max_tokens(request.max_tokens);
  absl::StatusOr<engine::SamplingParams> params = serving::SamplingFromProto(with_max, vocab_size_);
  if (!params.ok()) return sink->OnDone(params.status());
  engine::SequenceRequest sequence;
  sequence.prompt_ids = request.prompt;
  sequence.params = *std::move(params);
  auto local =
      std::make_shared<Local>(loop_, request.request_id, static_cast<int>(request.prompt.size()),
                              std::move(call), std::move(sink));
  local->Begin(std::move(sequence), deadline_);
}

}  // namespace tandem::serve
