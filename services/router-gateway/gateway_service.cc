#include "services/router-gateway/gateway_service.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/queued_writer.h"
#include "common/rpc/status.h"

namespace tandem::gateway {
namespace {

constexpr int kMaxStopStrings = 4;
constexpr size_t kMaxStopBytes = 64;
constexpr size_t kMaxRequestIdBytes = 128;

absl::Status Invalid(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

}  // namespace

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
      if (ids.size() >= context) {
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
  if (sampling.stop_size() > kMaxStopStrings) {
    return Invalid(absl::StrCat("at most ", kMaxStopStrings, " stop strings"));
  }
  for (const auto& stop : sampling.stop()) {
    if (stop.empty() || stop.size() > kMaxStopBytes) {
      return Invalid(absl::StrCat("stop strings must be 1 to ", kMaxStopBytes, " bytes"));
    }
  }
  for (int id : sampling.stop_token_ids()) {
    if (id < 0 || id >= config_.model_config.vocab_size) {
      return Invalid(absl::StrCat("stop token id ", id, " is outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* GatewayService::Finish(grpc::CallbackServerContext* context,
                                                 absl::string_view rpc, const grpc::Status& status,
                                                 absl::Time start) {
  metrics_->Record(rpc, status, absl::Now() - start);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

namespace {

using tandem::v1::GenerateStreamResponse;

// Generate: the worker fills the response and finishes; a client that goes away cancels it.
class UnaryReactor : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor(rpc::RpcMetrics* metrics, absl::Time start)
      : metrics_(metrics), start_(start), call_(std::make_shared<DispatchCall>()) {}
  std::shared_ptr<DispatchCall> call() const { return call_; }
  void Done(const grpc::Status& status) {
    status_ = status;
    Finish(status);
  }
  void OnCancel() override { call_->Cancel(); }
  void OnDone() override {
    metrics_->Record("Generate", status_, absl::Now() - start_);
    delete this;
  }

 private:
  rpc::RpcMetrics* const metrics_;
  const absl::Time start_;
  const std::shared_ptr<DispatchCall> call_;
  grpc::Status status_;
};

}  // namespace

GatewayService::GatewayService(GatewayConfig config, std::unique_ptr<model::Tokenizer> tokenizer,
                               std::unique_ptr<GenerationBackend> backend, rpc::RpcMetrics* metrics,
                               serving::GatewayMetrics* serving_metrics)
    : config_(std::move(config)),
      tokenizer_(std::move(tokenizer)),
      metrics_(metrics),
      serving_metrics_(serving_metrics),
      backend_(std::move(backend)) {}

GatewayService::~GatewayService() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_ == 0; };
  mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(10));
}

absl::Status GatewayService::Dispatch(
    const Prepared& request, DispatchCall* call,
    const std::function<void(const GenerateStreamResponse&)>& on_chunk) {
  const absl::Time start = request.start;
  absl::Time last = start;
  bool first = true;
  tandem::v1::Usage usage;
  absl::Status status = backend_->Run(
      request.request_id, request.prompt, request.sampling, request.max_tokens, call,
      [&](const GenerateStreamResponse& chunk) {
        if (chunk.token_ids_size() > 0) {
          const absl::Time now = absl::Now();
          if (first) {
            serving_metrics_->time_to_first_token->Observe(absl::ToDoubleSeconds(now - start));
            first = false;
          } else {
            serving_metrics_->inter_token->Observe(absl::ToDoubleSeconds(now - last) /
                                                   chunk.token_ids_size());
          }
          last = now;
        }
        if (chunk.has_usage()) usage = chunk.usage();
        on_chunk(chunk);
      });
  if (status.ok()) {
    serving_metrics_->requests_ok->Increment();
    serving_metrics_->end_to_end->Observe(absl::ToDoubleSeconds(absl::Now() - start));
    serving_metrics_->prompt_tokens->Increment(usage.prompt_tokens());
    serving_metrics_->generation_tokens->Increment(usage.completion_tokens());
    serving_metrics_->request_prompt_tokens->Observe(usage.prompt_tokens());
    serving_metrics_->request_generation_tokens->Observe(usage.completion_tokens());
  } else if (status.code() == absl::StatusCode::kCancelled) {
    serving_metrics_->requests_cancelled->Increment();
  } else {
    serving_metrics_->requests_error->Increment();
  }
  return status;
}

absl::Status GatewayService::Enter() {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the gateway is stopping");
  if (active_ >= config_.max_inflight) {
    serving_metrics_->requests_rejected->Increment();
    return absl::ResourceExhaustedError(absl::StrCat(
        "the gateway is running ", active_, " requests, its limit (--max_inflight); retry later"));
  }
  ++active_;
  return absl::OkStatus();
}

void GatewayService::Leave() {
  absl::MutexLock lock(&mu_);
  --active_;
}

absl::Status GatewayService::Spawn(std::function<void()> fn) {
  if (absl::Status s = Enter(); !s.ok()) return s;
  std::thread([this, fn = std::move(fn)] {
    fn();
    Leave();
  }).detach();
  return absl::OkStatus();
}

absl::Status GatewayService::Execute(
    const Prepared& request, DispatchCall* call,
    const std::function<void(const GenerateStreamResponse&)>& on_chunk) {
  if (absl::Status s = Enter(); !s.ok()) return s;
  absl::Status status = Dispatch(request, call, on_chunk);
  Leave();
  return status;
}

absl::StatusOr<GatewayService::Prepared> GatewayService::Prepare(
    const tandem::v1::GenerateRequest& request) {
  if (absl::Status s = ValidateGenerate(request); !s.ok()) return s;
  Prepared prepared;
  prepared.start = absl::Now();
  prepared.sampling = request.sampling();
  std::vector<int32_t>& ids = prepared.prompt;
  if (request.input_case() == tandem::v1::GenerateRequest::kPromptTokenIds) {
    ids.assign(request.prompt_token_ids().ids().begin(), request.prompt_token_ids().ids().end());
  } else {
    absl::StatusOr<std::vector<int32_t>> encoded = tokenizer_->Encode(request.prompt());
    if (!encoded.ok()) return encoded.status();
    if (config_.add_bos_token) ids.push_back(tokenizer_->bos_id());
    ids.insert(ids.end(), encoded->begin(), encoded->end());
  }
  const int context = static_cast<int>(config_.model_config.max_position_embeddings);
  const int n = static_cast<int>(ids.size());
  if (n >= context) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", n, " tokens; the context length is ", context));
  }
  // max_tokens 0 = the server default; a request that would run past the context ends there
  // with a length finish, as vLLM's does.
  int max_tokens = request.sampling().max_tokens() == 0 ? 16 : request.sampling().max_tokens();
  prepared.max_tokens = std::min(max_tokens, context - n);
  if (request.request_id().empty()) {
    absl::MutexLock lock(&mu_);
    prepared.request_id = absl::StrCat("gw-", next_request_++);
  } else {
    prepared.request_id = request.request_id();
  }
  return prepared;
}

grpc::ServerUnaryReactor* GatewayService::Generate(grpc::CallbackServerContext* context,
                                                   const tandem::v1::GenerateRequest* request,
                                                   tandem::v1::GenerateResponse* response) {
  auto* reactor = new UnaryReactor(metrics_, absl::Now());
  absl::StatusOr<Prepared> prepared = Prepare(*request);
  if (!prepared.ok()) {
    reactor->Done(rpc::ToGrpcStatus(prepared.status()));
    return reactor;
  }
  response->set_request_id(prepared->request_id);
  auto shared = std::make_shared<Prepared>(*std::move(prepared));
  const absl::Status spawned = Spawn([this, reactor, response, shared, call = reactor->call()] {
    absl::Status s = Dispatch(*shared, call.get(), [response](const GenerateStreamResponse& chunk) {
      response->mutable_text()->append(chunk.text());
      response->mutable_token_ids()->Add(chunk.token_ids().begin(), chunk.token_ids().end());
      if (chunk.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
        response->set_finish_reason(chunk.finish_reason());
        *response->mutable_usage() = chunk.usage();
      }
    });
    reactor->Done(rpc::ToGrpcStatus(s));
  });
  if (!spawned.ok()) reactor->Done(rpc::ToGrpcStatus(spawned));
  return reactor;
}

grpc::ServerWriteReactor<GenerateStreamResponse>* GatewayService::GenerateStream(
    grpc::CallbackServerContext* context, const tandem::v1::GenerateRequest* request) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Prepared> prepared = Prepare(*request);
  if (!prepared.ok()) {
    const grpc::Status status = rpc::ToGrpcStatus(prepared.status());
    metrics_->Record("GenerateStream", status, absl::Now() - start);
    return rpc::FinishedWriter<GenerateStreamResponse>(status);
  }
  // A worker thread feeds the stream; a client that goes away cancels the dispatch.
  auto* reactor = new rpc::QueuedWriter<GenerateStreamResponse>(metrics_, "GenerateStream");
  std::shared_ptr<rpc::QueuedWriter<GenerateStreamResponse>::Feed> feed = reactor->feed();
  auto call = std::make_shared<DispatchCall>();
  feed->SetOnCancel([call] { call->Cancel(); });
  auto shared = std::make_shared<Prepared>(*std::move(prepared));
  const absl::Status spawned = Spawn([this, feed, call, shared] {
    absl::Status s = Dispatch(*shared, call.get(), [&](const GenerateStreamResponse& chunk) {
      GenerateStreamResponse copy = chunk;
      copy.set_request_id(shared->request_id);
      feed->Push(std::move(copy));
    });
    feed->End(rpc::ToGrpcStatus(s));
  });
  if (!spawned.ok()) feed->End(rpc::ToGrpcStatus(spawned));
  return reactor;
}

grpc::ServerUnaryReactor* GatewayService::Tokenize(grpc::CallbackServerContext* context,
                                                   const tandem::v1::TokenizeRequest* request,
                                                   tandem::v1::TokenizeResponse* response) {
  const absl::Time start = absl::Now();
  if (absl::Status s = CheckModel(request->model()); !s.ok()) {
    return Finish(context, "Tokenize", rpc::ToGrpcStatus(s), start);
  }
  if (request->text().size() > config_.max_prompt_bytes) {
    return Finish(
        context, "Tokenize",
        rpc::ToGrpcStatus(Invalid(absl::StrCat("text is ", request->text().size(),
                                               " bytes; the limit is ", config_.max_prompt_bytes))),
        start);
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode(request->text());
  if (!ids.ok()) return Finish(context, "Tokenize", rpc::ToGrpcStatus(ids.status()), start);
  const bool add_bos =
      request->has_add_special_tokens() ? request->add_special_tokens() : config_.add_bos_token;
  if (add_bos) {
    response->add_token_ids(tokenizer_->bos_id());
    response->add_pieces("");  // BOS decodes to nothing; pieces stay aligned with ids
  }
  for (int32_t id : *ids) {
    response->add_token_ids(id);
    response->add_pieces(tokenizer_->IdToPiece(id));
  }
  return Finish(context, "Tokenize", grpc::Status::OK, start);
}

grpc::ServerUnaryReactor* GatewayService::ListModels(grpc::CallbackServerContext* context,
                                                     const tandem::v1::ListModelsRequest* request,
                                                     tandem::v1::ListModelsResponse* response) {
  auto* model = response->add_models();
  model->set_name(config_.model_name);
  model->set_context_length(static_cast<int32_t>(config_.model_config.max_position_embeddings));
  model->set_architecture(std::string(config_.model_config.model_type()));
  return Finish(context, "ListModels", grpc::Status::OK, absl::Now());
}

}  // namespace tandem::gateway
