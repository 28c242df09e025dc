#include "services/router-gateway/gateway_service.h"

#include <algorithm>
#include <deque>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/guard.h"
#include "common/rpc/queued_writer.h"
#include "common/rpc/status.h"
#include "common/util/clock.h"
#include "common/util/guard.h"
#include "common/util/logging.h"
#include "common/util/timer_queue.h"
#include "services/common/structured_output.h"

namespace tandem::gateway {
namespace {

constexpr int kMaxStopStrings = 4;
constexpr size_t kMaxStopBytes = 64;
constexpr size_t kMaxRequestIdBytes = 128;
// The engine's limits (engine::SamplingParams), checked here before anything runs.
constexpr float kMaxPenalty = 2.0f;
constexpr float kMaxBias = 100.0f;
constexpr int kMaxLogitBias = 1024;
constexpr int kMaxLogprobs = 20;
// After the backend found no room, how long before the queue's head is tried again (sooner
// when a running generation ends).
constexpr absl::Duration kRetryAfterFull = absl::Milliseconds(50);

absl::Status Invalid(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

using tandem::v1::GenerateStreamResponse;

}  // namespace

// One request in the gateway's hands, from Execute to its OnDone.
struct Entry {
  GatewayService::Prepared request;
  std::shared_ptr<DispatchCall> call;
  std::shared_ptr<GenerationSink> sink;
  util::Instant deadline;  // the latest it may still be waiting for a place
  util::TimerQueue::Id timer = 0;
  uint64_t cancel_hook = 0;
  // What the client has seen, for the metrics.
  bool streamed = false;
  util::Instant last_token;  // of the last chunk with tokens; none yet: util::Instant()
  tandem::v1::Usage usage;
};

class GatewayService::Admission : public std::enable_shared_from_this<GatewayService::Admission> {
 public:
  Admission(const GatewayConfig& config, GenerationBackend* backend,
            serving::GatewayMetrics* metrics)
      : config_(config), backend_(backend), metrics_(metrics) {}

  void Execute(std::shared_ptr<Entry> entry);
  void Drain(absl::Duration deadline);
  // Drain(0), then wait for every Start call in progress: the backend may go after it.
  void Stop();
  int running() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(running_.size());
  }
  int queued() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(queue_.size());
  }

  // A running generation's end (from its sink).
  void OnDone(const std::shared_ptr<Entry>& entry, const absl::Status& status);
  void OnChunk(Entry& entry, const GenerateStreamResponse& chunk);

 private:
  // Starts queued generations while there are places.
  void Pump();
  void Launch(const std::shared_ptr<Entry>& entry);
  // Takes `entry` out of the queue; false if it was not there.
  bool RemoveLocked(const std::shared_ptr<Entry>& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Expire(const std::shared_ptr<Entry>& entry);
  void CancelQueued(const std::shared_ptr<Entry>& entry);
  void Unpause();
  void Gauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The request's end as the client sees it: metrics, then the sink.
  void Complete(const std::shared_ptr<Entry>& entry, const absl::Status& status);

  const GatewayConfig config_;
  GenerationBackend* const backend_;
  serving::GatewayMetrics* const metrics_;
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Entry>> queue_ ABSL_GUARDED_BY(mu_);
  std::set<std::shared_ptr<Entry>> running_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  // The backend had no room: start nothing until a generation ends or kRetryAfterFull.
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  util::TimerQueue::Id unpause_timer_ ABSL_GUARDED_BY(mu_) = 0;
  int starting_ ABSL_GUARDED_BY(mu_) = 0;  // Start calls in progress
  bool pumping_ ABSL_GUARDED_BY(mu_) = false;
};

namespace {

// Between the backend and the caller's sink: records what the client sees, and lets the
// admission queue take back a generation the backend could not place.
class AdmissionSink : public GenerationSink {
 public:
  AdmissionSink(std::shared_ptr<GatewayService::Admission> admission, std::shared_ptr<Entry> entry)
      : admission_(std::move(admission)), entry_(std::move(entry)) {}
  void OnChunk(const GenerateStreamResponse& chunk) override {
    admission_->OnChunk(*entry_, chunk);
    entry_->sink->OnChunk(chunk);
  }
  void OnKeepAlive() override { entry_->sink->OnKeepAlive(); }
  void OnDone(const absl::Status& status) override { admission_->OnDone(entry_, status); }

 private:
  const std::shared_ptr<GatewayService::Admission> admission_;
  const std::shared_ptr<Entry> entry_;
};

}  // namespace

void GatewayService::Admission::Gauges() {
  metrics_->queued->Set(static_cast<double>(queue_.size()));
  metrics_->running->Set(static_cast<double>(running_.size()));
}

void GatewayService::Admission::Execute(std::shared_ptr<Entry> entry) {
  // The deadline and the cancel hook cover the entry's whole stay (they matter only while it
  // waits); Complete removes them. They hold the entry weakly: the call holds its hooks, and
  // the entry holds the call.
  entry->deadline = entry->request.start + config_.queue_timeout;
  std::weak_ptr<Admission> weak = weak_from_this();
  std::weak_ptr<Entry> weak_entry = entry;
  entry->timer = util::TimerQueue::Shared().Schedule(entry->deadline, [weak, weak_entry] {
    auto self = weak.lock();
    auto entry = weak_entry.lock();
    if (self != nullptr && entry != nullptr) self->Expire(entry);
  });
  entry->cancel_hook = entry->call->OnCancel([weak, weak_entry] {
    auto self = weak.lock();
    auto entry = weak_entry.lock();
    if (self != nullptr && entry != nullptr) self->CancelQueued(entry);
  });
  absl::Status refused;
  bool launch = false;
  {
    absl::MutexLock lock(&mu_);
    if (draining_) {
      refused = absl::UnavailableError("the gateway is draining");
    } else if (entry->call->cancelled()) {
      refused = absl::CancelledError("the client went away");
    } else if (static_cast<int>(running_.size()) < config_.max_inflight && queue_.empty() &&
               !paused_) {
      running_.insert(entry);
      ++starting_;
      launch = true;
    } else if (static_cast<int>(queue_.size()) < config_.max_queued) {
      queue_.push_back(entry);
    } else {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "the gateway is running ", running_.size(), " requests and ", queue_.size(),
          " more are waiting, its limits (--max_inflight, --max_queued); retry later"));
    }
    Gauges();
  }
  if (!refused.ok()) return Complete(entry, refused);
  if (launch) {
    metrics_->queue_wait->Observe(0);
    Launch(entry);
    absl::MutexLock lock(&mu_);
    --starting_;
  }
}

bool GatewayService::Admission::RemoveLocked(const std::shared_ptr<Entry>& entry) {
  auto it = std::find(queue_.begin(), queue_.end(), entry);
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

void GatewayService::Admission::Expire(const std::shared_ptr<Entry>& entry) {
  {
    absl::MutexLock lock(&mu_);
    if (!RemoveLocked(entry)) return;  // running by now, or done
    Gauges();
  }
  metrics_->queue_wait->Observe(absl::ToDoubleSeconds(util::Since(entry->request.start)));
  Complete(entry,
           absl::ResourceExhaustedError(absl::StrCat(
               "no place for the request within ", absl::FormatDuration(config_.queue_timeout),
               " (--queue_timeout_s): the cluster is overloaded; retry later")));
}

void GatewayService::Admission::CancelQueued(const std::shared_ptr<Entry>& entry) {
  {
    absl::MutexLock lock(&mu_);
    if (!RemoveLocked(entry)) return;  // a running one is cancelled by the backend's own hook
    Gauges();
  }
  Complete(entry, absl::CancelledError("the client went away"));
}

void GatewayService::Admission::Launch(const std::shared_ptr<Entry>& entry) {
  if (entry->call->cancelled()) {
    // Cancelled on its way out of the queue.
    OnDone(entry, absl::CancelledError("the client went away"));
    return;
  }
  const bool started = util::Guarded("backend start", [&] {
    backend_->Start(entry->request.generation, entry->call,
                    std::make_shared<AdmissionSink>(shared_from_this(), entry));
  });
  if (!started) OnDone(entry, absl::InternalError("internal error while starting the request"));
}

void GatewayService::Admission::Pump() {
  {
    absl::MutexLock lock(&mu_);
    if (pumping_) return;  // the thread pumping now looks again before it stops
    pumping_ = true;
  }
  // A loop, not recursion (a launch may end at once and pump again), and one at a time: a
  // launch the backend cannot place pauses the queue, and those behind it keep their turn.
  while (true) {
    std::shared_ptr<Entry> entry;
    {
      absl::MutexLock lock(&mu_);
      if (draining_ || paused_ || queue_.empty() ||
          static_cast<int>(running_.size()) >= config_.max_inflight) {
        pumping_ = false;
        return;
      }
      entry = queue_.front();
      queue_.pop_front();
      running_.insert(entry);
      ++starting_;
      Gauges();
    }
    metrics_->queue_wait->Observe(absl::ToDoubleSeconds(util::Since(entry->request.start)));
    Launch(entry);
    absl::MutexLock lock(&mu_);
    --starting_;
  }
}

void GatewayService::Admission::Unpause() {
  {
    absl::MutexLock lock(&mu_);
    paused_ = false;
    unpause_timer_ = 0;
  }
  Pump();
}

void GatewayService::Admission::OnChunk(Entry& entry, const GenerateStreamResponse& chunk) {
  if (chunk.token_ids_size() > 0) {
    const util::Instant now = util::Instant::Now();
    if (entry.last_token == util::Instant()) {
      metrics_->time_to_first_token->Observe(absl::ToDoubleSeconds(now - entry.request.start));
    } else {
      metrics_->inter_token->Observe(absl::ToDoubleSeconds(now - entry.last_token) /
                                     chunk.token_ids_size());
    }
    entry.last_token = now;
  }
  entry.streamed = true;
  if (chunk.has_usage()) entry.usage = chunk.usage();
}

void GatewayService::Admission::OnDone(const std::shared_ptr<Entry>& entry,
                                       const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    running_.erase(entry);
    const bool no_room = status.code() == absl::StatusCode::kResourceExhausted &&
                         !entry->streamed && !entry->call->cancelled();
    if (no_room && !draining_ && util::Instant::Now() < entry->deadline) {
      // Nothing had room: back to the head of the queue (its turn kept) until a running
      // generation ends or the retry timer fires. Its deadline timer and cancel hook are
      // still armed.
      queue_.push_front(entry);
      if (!paused_) {
        paused_ = true;
        std::weak_ptr<Admission> weak = weak_from_this();
        unpause_timer_ = util::TimerQueue::Shared().ScheduleAfter(kRetryAfterFull, [weak] {
          if (auto self = weak.lock()) self->Unpause();
        });
      }
      Gauges();
      return;
    }
    if (!no_room) paused_ = false;  // a generation ended: there may be room now
    Gauges();
  }
  Complete(entry, status);
  Pump();
}

void GatewayService::Admission::Complete(const std::shared_ptr<Entry>& entry,
                                         const absl::Status& status) {
  util::TimerQueue::Shared().Cancel(entry->timer);
  entry->call->RemoveOnCancel(entry->cancel_hook);
  if (status.ok()) {
    metrics_->requests_ok->Increment();
    metrics_->end_to_end->Observe(absl::ToDoubleSeconds(util::Since(entry->request.start)));
    metrics_->prompt_tokens->Increment(entry->usage.prompt_tokens());
    metrics_->generation_tokens->Increment(entry->usage.completion_tokens());
    metrics_->request_prompt_tokens->Observe(entry->usage.prompt_tokens());
    metrics_->request_generation_tokens->Observe(entry->usage.completion_tokens());
  } else if (status.code() == absl::StatusCode::kCancelled) {
    metrics_->requests_cancelled->Increment();
  } else if (status.code() == absl::StatusCode::kResourceExhausted) {
    metrics_->requests_rejected->Increment();
  } else {
    metrics_->requests_error->Increment();
  }
  util::Guarded("request sink", [&] { entry->sink->OnDone(status); });
}

void GatewayService::Admission::Drain(absl::Duration deadline) {
  std::deque<std::shared_ptr<Entry>> queued;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    queued.swap(queue_);
    Gauges();
  }
  for (const auto& entry : queued)
    Complete(entry, absl::UnavailableError("the gateway is draining"));
  std::vector<std::shared_ptr<Entry>> running;
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_.empty(); };
    if (mu_.AwaitWithTimeout(absl::Condition(&idle), deadline)) return;
    running.assign(running_.begin(), running_.end());
  }
  for (const auto& entry : running) entry->call->Cancel();
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(5))) {
    TANDEM_LOG(WARNING) << "gateway: " << running_.size()
                        << " requests still running after the drain";
  }
}

void GatewayService::Admission::Stop() {
  Drain(absl::ZeroDuration());
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return starting_ == 0; };
  mu_.Await(absl::Condition(&idle));  // Start calls return at once: this is short
  if (unpause_timer_ != 0) util::TimerQueue::Shared().Cancel(unpause_timer_);
}

// GatewayService

absl::Status GatewayService::CheckModel(const std::string& model) const {
  if (!model.empty() && model != config_.model_name) {
    return absl::NotFoundError(absl::StrCat("unknown model '", model, "'; this gateway serves '",
                                            config_.model_name, "'"));
  }
  return absl::OkStatus();
}

absl::Status GatewayService::ValidateGenerate(const tandem::v1::GenerateRequest& request) const {
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return Invalid(absl::StrCat("request_id longer than ", kMaxRequestIdBytes, " bytes"));
  }
  for (char c : request.request_id()) {
    if (c < 0x21 || c > 0x7e) return Invalid("request_id must be printable ASCII without spaces");
  }
  if (absl::Status s = CheckModel(request.model()); !s.ok()) return s;
  const int64_t context = config_.model_config.max_position_embeddings;
  switch (request.input_case()) {
    case tandem::v1::GenerateRequest::kPrompt:
      if (request.prompt().empty()) return Invalid("prompt is empty");
      if (request.prompt().size() > config_.max_prompt_bytes) {
        return Invalid(absl::StrCat("prompt is ", request.prompt().size(), " bytes; the limit is ",
                                    config_.max_prompt_bytes));
      }
      break;
    case tandem::v1::GenerateRequest::kPromptTokenIds: {
      const auto& ids = request.prompt_token_ids().ids();
      if (ids.empty()) return Invalid("prompt_token_ids is empty");
      // Scoring alone (max_tokens 0) may fill the whole context.
      const bool scoring =
          request.sampling().has_max_tokens() && request.sampling().max_tokens() == 0;
      if (scoring ? ids.size() > context : ids.size() >= context) {
        return Invalid(
            absl::StrCat("prompt has ", ids.size(), " tokens; the context length is ", context));
      }
      for (int id : ids) {
        if (id < 0 || id >= config_.model_config.vocab_size) {
          return Invalid(absl::StrCat("token id ", id, " is outside the vocabulary [0, ",
                                      config_.model_config.vocab_size, ")"));
        }
      }
      break;
    }
    case tandem::v1::GenerateRequest::INPUT_NOT_SET:
      return Invalid("either prompt or prompt_token_ids is required");
  }
  const auto& sampling = request.sampling();
  if (!(sampling.temperature() >= 0 && sampling.temperature() <= 2)) {
    return Invalid(absl::StrCat("temperature ", sampling.temperature(), " is outside [0, 2]"));
  }
  if (!(sampling.top_p() >= 0 && sampling.top_p() <= 1)) {
    return Invalid(absl::StrCat("top_p ", sampling.top_p(), " is outside [0, 1]"));
  }
  if (sampling.top_k() < 0) return Invalid("top_k must be >= 0");
  if (sampling.max_tokens() < 0 || sampling.max_tokens() >= context) {
    return Invalid(
        absl::StrCat("max_tokens ", sampling.max_tokens(), " is outside [0, ", context, ")"));
  }
  if (sampling.has_max_tokens() && sampling.max_tokens() == 0 && !sampling.has_prompt_logprobs()) {
    return Invalid(
        "max_tokens 0 generates nothing; it is only for scoring a prompt "
        "(prompt_logprobs)");
  }
  for (const auto& [name, value] : {std::pair{"presence_penalty", sampling.presence_penalty()},
                                    std::pair{"frequency_penalty", sampling.frequency_penalty()}}) {
    if (!(value >= -kMaxPenalty && value <= kMaxPenalty)) {
      return Invalid(absl::StrCat(name, " ", value, " is outside [-2, 2]"));
    }
  }
  if (!(sampling.repetition_penalty() >= 0 && sampling.repetition_penalty() <= kMaxPenalty)) {
    return Invalid(absl::StrCat("repetition_penalty ", sampling.repetition_penalty(),
                                " is outside (0, 2] (0 = off)"));
  }
  if (sampling.logit_bias_size() > kMaxLogitBias) {
    return Invalid(absl::StrCat("logit_bias has ", sampling.logit_bias_size(), " entries; at most ",
                                kMaxLogitBias));
  }
  for (const auto& [id, bias] : sampling.logit_bias()) {
    if (id < 0 || id >= config_.model_config.vocab_size) {
      return Invalid(absl::StrCat("logit_bias token id ", id, " is outside the vocabulary [0, ",
                                  config_.model_config.vocab_size, ")"));
    }
    if (!(bias >= -kMaxBias && bias <= kMaxBias)) {
      return Invalid(
          absl::StrCat("logit_bias for token ", id, " is ", bias, "; it must be in [-100, 100]"));
    }
  }
  for (const auto& [name, set, value] :
       {std::tuple{"logprobs", sampling.has_logprobs(), sampling.logprobs()},
        std::tuple{"prompt_logprobs", sampling.has_prompt_logprobs(),
                   sampling.prompt_logprobs()}}) {
    if (set && (value < 0 || value > kMaxLogprobs)) {
      return Invalid(absl::StrCat(name, " ", value, " is outside [0, ", kMaxLogprobs, "]"));
    }
  }
  if (sampling.stop_size() > kMaxStopStrings) {
    return Invalid(absl::StrCat("at most ", kMaxStopStrings, " stop strings"));
  }
  for (const auto& stop : sampling.stop()) {
    if (stop.empty() || stop.size() > kMaxStopBytes) {
      return Invalid(absl::StrCat("stop strings must be 1 to ", kMaxStopBytes, " bytes"));
    }
  }
  if (sampling.stop_token_ids_size() > 1024) return Invalid("at most 1024 stop token ids");
  for (int id : sampling.stop_token_ids()) {
    if (id < 0 || id >= config_.model_config.vocab_size) {
      return Invalid(absl::StrCat("stop token id ", id, " is outside the vocabulary"));
    }
  }
  // A constraint that does not compile is refused here, before any instance sees it.
  return serving::CheckConstraint(sampling.structured());
}

grpc::ServerUnaryReactor* GatewayService::Finish(grpc::CallbackServerContext* context,
                                                 absl::string_view rpc, const grpc::Status& status,
                                                 util::Instant start) {
  metrics_->Record(rpc, status, util::Since(start));
  auto* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

GatewayService::GatewayService(GatewayConfig config,
                               std::shared_ptr<const model::Tokenizer> tokenizer,
                               std::unique_ptr<GenerationBackend> backend, rpc::RpcMetrics* metrics,
                               serving::GatewayMetrics* serving_metrics)
    : config_(std::move(config)),
      tokenizer_(std::move(tokenizer)),
      metrics_(metrics),
      backend_(std::move(backend)),
      admission_(std::make_shared<Admission>(config_, backend_.get(), serving_metrics)) {}

GatewayService::~GatewayService() {
  admission_->Stop();
  // Generations still running end on their own (their callbacks hold what they touch);
  // the backend waits for them as it goes.
  backend_.reset();
}

void GatewayService::Execute(Prepared request, std::shared_ptr<DispatchCall> call,
                             std::shared_ptr<GenerationSink> sink) {
  auto entry = std::make_shared<Entry>();
  entry->request = std::move(request);
  entry->call = std::move(call);
  entry->sink = std::move(sink);
  admission_->Execute(std::move(entry));
}

void GatewayService::Drain(absl::Duration deadline) { admission_->Drain(deadline); }
int GatewayService::running() const { return admission_->running(); }
int GatewayService::queued() const { return admission_->queued(); }

absl::StatusOr<std::vector<int32_t>> GatewayService::TokenizePrompt(absl::string_view text,
                                                                    bool add_special_tokens) const {
  std::vector<int32_t> ids;
  if (add_special_tokens && tokenizer_->add_bos()) ids.push_back(tokenizer_->bos_id());
  absl::StatusOr<std::vector<int32_t>> encoded =
      tokenizer_->Encode(std::string_view(text.data(), text.size()));
  if (!encoded.ok()) return encoded.status();
  ids.insert(ids.end(), encoded->begin(), encoded->end());
  return ids;
}

absl::StatusOr<GatewayService::Prepared> GatewayService::Prepare(
    const tandem::v1::GenerateRequest& request) {
  if (absl::Status s = ValidateGenerate(request); !s.ok()) return s;
  Prepared prepared;
  prepared.start = util::Instant::Now();
  GenerationRequest& g = prepared.generation;
  g.sampling = request.sampling();
  std::vector<int32_t>& ids = g.prompt;
  if (request.input_case() == tandem::v1::GenerateRequest::kPromptTokenIds) {
    ids.assign(request.prompt_token_ids().ids().begin(), request.prompt_token_ids().ids().end());
  } else {
    absl::StatusOr<std::vector<int32_t>> encoded = TokenizePrompt(
        request.prompt(), !request.has_add_special_tokens() || request.add_special_tokens());
    if (!encoded.ok()) return encoded.status();
    ids = *std::move(encoded);
    if (ids.empty()) return Invalid("prompt has no tokens");
  }
  const int context = static_cast<int>(config_.model_config.max_position_embeddings);
  const int n = static_cast<int>(ids.size());
  // Unset max_tokens = the server default; explicit 0 (scoring only) stays 0. A request that
  // would run past the context ends there with a length finish, as vLLM's does.
  const int max_tokens = request.sampling().has_max_tokens() ? request.sampling().max_tokens() : 16;
  // A prompt that is only scored may fill the whole context (lm-evaluation-harness sends
  // such windows); one that generates needs room for a token.
  if (max_tokens == 0 ? n > context : n >= context) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", n, " tokens; the context length is ", context));
  }
  g.max_tokens = std::min(max_tokens, context - n);
  // generation_config.json's end tokens, beside the tokenizer's EOS (vLLM's rule).
  if (!g.sampling.ignore_eos()) {
    for (int32_t id : config_.generation.eos_token_ids) {
      const auto& stops = g.sampling.stop_token_ids();
      if (id != tokenizer_->eos_id() && std::find(stops.begin(), stops.end(), id) == stops.end()) {
        g.sampling.add_stop_token_ids(id);
      }
    }
  }
  if (request.request_id().empty()) {
    static std::atomic<uint64_t> next_request{1};
    g.request_id = absl::StrCat("gw-", next_request.fetch_add(1));
  } else {
    g.request_id = request.request_id();
  }
  return prepared;
}

namespace {

// Generate: the sink fills the response; the end finishes the RPC. A client that goes away
// cancels the generation.
class UnaryReactor : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor(rpc::RpcMetrics* metrics, util::Instant start)
      : metrics_(metrics), start_(start), call_(std::make_shared<DispatchCall>()) {}
  std::shared_ptr<DispatchCall> call() const { return call_; }
  void Done(const grpc::Status& status) {
    status_ = status;
    Finish(status);
  }
  void OnCancel() override { call_->Cancel(); }
  void OnDone() override {
    metrics_->Record("Generate", status_, util::Since(start_));
    delete this;
  }

 private:
  rpc::RpcMetrics* const metrics_;
  const util::Instant start_;
  const std::shared_ptr<DispatchCall> call_;
  grpc::Status status_;
};

class UnarySink : public GenerationSink {
 public:
  UnarySink(UnaryReactor* reactor, tandem::v1::GenerateResponse* response)
      : reactor_(reactor), response_(response) {}
  void OnChunk(const GenerateStreamResponse& chunk) override {
    response_->mutable_text()->append(chunk.text());
    response_->mutable_token_ids()->Add(chunk.token_ids().begin(), chunk.token_ids().end());
    response_->mutable_logprobs()->Add(chunk.logprobs().begin(), chunk.logprobs().end());
    response_->mutable_prompt_logprobs()->Add(chunk.prompt_logprobs().begin(),
                                              chunk.prompt_logprobs().end());
    if (chunk.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      response_->set_finish_reason(chunk.finish_reason());
      *response_->mutable_usage() = chunk.usage();
    }
  }
  void OnDone(const absl::Status& status) override { reactor_->Done(rpc::ToGrpcStatus(status)); }

 private:
  UnaryReactor* const reactor_;  // alive until Done: it finishes the call
  tandem::v1::GenerateResponse* const response_;
};

class StreamSink : public GenerationSink {
 public:
  StreamSink(std::shared_ptr<rpc::QueuedWriter<GenerateStreamResponse>::Feed> feed,
             std::string request_id)
      : feed_(std::move(feed)), request_id_(std::move(request_id)) {}
  void OnChunk(const GenerateStreamResponse& chunk) override {
    GenerateStreamResponse copy = chunk;
    copy.set_request_id(request_id_);
    feed_->Push(std::move(copy));
  }
  void OnDone(const absl::Status& status) override { feed_->End(rpc::ToGrpcStatus(status)); }

 private:
  const std::shared_ptr<rpc::QueuedWriter<GenerateStreamResponse>::Feed> feed_;
  const std::string request_id_;
};

}  // namespace

grpc::ServerUnaryReactor* GatewayService::Generate(grpc::CallbackServerContext* context,
                                                   const tandem::v1::GenerateRequest* request,
                                                   tandem::v1::GenerateResponse* response) {
  return rpc::GuardedUnary(context, "Generate", [&]() -> grpc::ServerUnaryReactor* {
    auto* reactor = new UnaryReactor(metrics_, util::Instant::Now());
    absl::StatusOr<Prepared> prepared = Prepare(*request);
    if (!prepared.ok()) {
      reactor->Done(rpc::ToGrpcStatus(prepared.status()));
      return reactor;
    }
    response->set_request_id(prepared->generation.request_id);
    Execute(*std::move(prepared), reactor->call(), std::make_shared<UnarySink>(reactor, response));
    return reactor;
  });
}

grpc::ServerWriteReactor<GenerateStreamResponse>* GatewayService::GenerateStream(
    grpc::CallbackServerContext* context, const tandem::v1::GenerateRequest* request) {
  return rpc::GuardedStream<GenerateStreamResponse>(
      "GenerateStream", [&]() -> grpc::ServerWriteReactor<GenerateStreamResponse>* {
        const util::Instant start = util::Instant::Now();
        absl::StatusOr<Prepared> prepared = Prepare(*request);
        if (!prepared.ok()) {
          const grpc::Status status = rpc::ToGrpcStatus(prepared.status());
          metrics_->Record("GenerateStream", status, util::Since(start));
          return rpc::FinishedWriter<GenerateStreamResponse>(status);
        }
        auto* reactor = new rpc::QueuedWriter<GenerateStreamResponse>(metrics_, "GenerateStream");
        std::shared_ptr<rpc::QueuedWriter<GenerateStreamResponse>::Feed> feed = reactor->feed();
        auto call = std::make_shared<DispatchCall>();
        feed->SetOnCancel([call] { call->Cancel(); });
        const std::string id = prepared->generation.request_id;
        // Keep-alives while the request waits, prefills or decodes silently: a client can
        // tell a live stream from a dead one (sdk::ClientOptions::idle_timeout).
        GenerateStreamResponse heartbeat;
        heartbeat.set_request_id(id);
        heartbeat.set_heartbeat(true);
        rpc::QueuedWriter<GenerateStreamResponse>::Feed::StartHeartbeats(
            feed, config_.stream_heartbeat, std::move(heartbeat));
        Execute(*std::move(prepared), call, std::make_shared<StreamSink>(feed, id));
        return reactor;
      });
}

grpc::ServerUnaryReactor* GatewayService::Tokenize(grpc::CallbackServerContext* context,
                                                   const tandem::v1::TokenizeRequest* request,
                                                   tandem::v1::TokenizeResponse* response) {
  return rpc::GuardedUnary(context, "Tokenize", [&]() -> grpc::ServerUnaryReactor* {
    const util::Instant start = util::Instant::Now();
    if (absl::Status s = CheckModel(request->model()); !s.ok()) {
      return Finish(context, "Tokenize", rpc::ToGrpcStatus(s), start);
    }
    if (request->text().size() > config_.max_prompt_bytes) {
      return Finish(context, "Tokenize",
                    rpc::ToGrpcStatus(
                        Invalid(absl::StrCat("text is ", request->text().size(),
                                             " bytes; the limit is ", config_.max_prompt_bytes))),
                    start);
    }
    absl::StatusOr<std::vector<int32_t>> ids = TokenizePrompt(
        request->text(), !request->has_add_special_tokens() || request->add_special_tokens());
    if (!ids.ok()) return Finish(context, "Tokenize", rpc::ToGrpcStatus(ids.status()), start);
    for (int32_t id : *ids) {
      response->add_token_ids(id);
      // BOS decodes to nothing; pieces stay aligned with ids.
      response->add_pieces(
          id == tokenizer_->bos_id() && tokenizer_->IsControl(id) ? "" : tokenizer_->IdToPiece(id));
    }
    return Finish(context, "Tokenize", grpc::Status::OK, start);
  });
}

grpc::ServerUnaryReactor* GatewayService::ListModels(grpc::CallbackServerContext* context,
                                                     const tandem::v1::ListModelsRequest* request,
                                                     tandem::v1::ListModelsResponse* response) {
  return rpc::GuardedUnary(context, "ListModels", [&]() -> grpc::ServerUnaryReactor* {
    auto* model = response->add_models();
    model->set_name(config_.model_name);
    model->set_context_length(static_cast<int32_t>(config_.model_config.max_position_embeddings));
    model->set_architecture(std::string(config_.model_config.model_type()));
    return Finish(context, "ListModels", grpc::Status::OK, util::Instant::Now());
  });
}

}  // namespace tandem::gateway
