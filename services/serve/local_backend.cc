#include "services/serve/local_backend.h"

#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/util/status.h"
#include "services/common/serving.h"

namespace tandem::serve {
namespace {

// Outputs handed over from the engine thread to the request's thread.
struct Inbox {
  absl::Mutex mu;
  std::deque<engine::SequenceOutput> outputs ABSL_GUARDED_BY(mu);
  bool cancelled ABSL_GUARDED_BY(mu) = false;
};

}  // namespace

absl::Status LocalBackend::Run(
    const std::string& request_id, const std::vector<int32_t>& prompt,
    const tandem::v1::SamplingParams& sampling, int max_tokens, gateway::DispatchCall* call,
    const std::function<void(const tandem::v1::GenerateStreamResponse&)>& on_chunk) {
  tandem::v1::SamplingParams with_max = sampling;
  with_max.set_max_tokens(max_tokens);
  engine::SequenceRequest request;
  request.prompt_ids = prompt;
  ASSIGN_OR_RETURN(request.params, serving::SamplingFromProto(with_max, vocab_size_));
  auto inbox = std::make_shared<Inbox>();
  ASSIGN_OR_RETURN(engine::SequenceId id,
                   loop_->Submit(std::move(request), [inbox](const engine::SequenceOutput& out) {
                     absl::MutexLock lock(&inbox->mu);
                     inbox->outputs.push_back(out);
                   }));
  call->OnCancel([this, inbox, id] {
    loop_->Cancel(id);
    absl::MutexLock lock(&inbox->mu);
    inbox->cancelled = true;
  });
  const absl::Time deadline = absl::Now() + deadline_;
  int completion = 0;
  absl::Status status;
  bool last = false;
  while (!last) {
    std::deque<engine::SequenceOutput> outputs;
    {
      absl::MutexLock lock(&inbox->mu);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(inbox->mu) {
        return inbox->cancelled || !inbox->outputs.empty();
      };
      if (!inbox->mu.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
        status = absl::DeadlineExceededError("the generation ran past its deadline");
      } else if (inbox->cancelled) {
        status = absl::CancelledError("the client went away");
      }
      outputs.swap(inbox->outputs);
    }
    if (!status.ok()) {
      loop_->Cancel(id);
      break;
    }
    for (const engine::SequenceOutput& out : outputs) {
      if (!out.status.ok()) {
        status = out.status;
        last = true;
        break;
      }
      tandem::v1::GenerateStreamResponse chunk;
      chunk.set_request_id(request_id);
      chunk.set_text(out.text);
      if (out.token.has_value()) {
        chunk.add_token_ids(*out.token);
        ++completion;
      }
      if (out.finish != engine::FinishReason::kNone) {
        chunk.set_finish_reason(serving::FinishToProto(out.finish));
        chunk.mutable_usage()->set_prompt_tokens(static_cast<int>(prompt.size()));
        chunk.mutable_usage()->set_completion_tokens(completion);
        last = true;
      }
      on_chunk(chunk);
      if (last) break;
    }
  }
  call->ClearOnCancel();
  return status;
}

}  // namespace tandem::serve
