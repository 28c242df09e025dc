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

grpc::Status Invalid(std::string message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::move(message));
}

}  // namespace

grpc::Status GatewayService::CheckModel(const std::string& model) const {
  if (!model.empty() && model != config_.model_name) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown model '", model, "'; this gateway serves '",
                                     config_.model_name, "'"));
  }
  return grpc::Status::OK;
}

grpc::Status GatewayService::ValidateGenerate(const tandem::v1::GenerateRequest& request) const {
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return Invalid(absl::StrCat("request_id longer than ", kMaxRequestIdBytes, " bytes"));
  }
  for (char c : request.request_id()) {
    if (c < 0x21 || c > 0x7e) return Invalid("request_id must be printable ASCII without spaces");
  }
  if (grpc::Status s = CheckModel(request.model()); !s.ok()) return s;
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
  return grpc::Status::OK;
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
    const std::string& request_id, const std::vector<int32_t>& prompt,
    const tandem::v1::SamplingParams& sampling, int max_tokens, DispatchCall* call,
    absl::Time start, const std::function<void(const GenerateStreamResponse&)>& on_chunk) {
  absl::Time last = start;
  bool first = true;
  absl::Status status = backend_->Run(
      request_id, prompt, sampling, max_tokens, call, [&](const GenerateStreamResponse& chunk) {
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
        on_chunk(chunk);
      });
  if (status.ok()) {
    serving_metrics_->requests_ok->Increment();
    serving_metrics_->end_to_end->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  } else if (status.code() == absl::StatusCode::kCancelled) {
    serving_metrics_->requests_cancelled->Increment();
  } else {
    serving_metrics_->requests_error->Increment();
  }
  return status;
}

bool GatewayService::Spawn(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
    ++active_;
  }
  std::thread([this, fn = std::move(fn)] {
    fn();
    absl::MutexLock lock(&mu_);
    --active_;
  }).detach();
  return true;
}

absl::Status GatewayService::Prepare(const tandem::v1::GenerateRequest& request,
                                     std::vector<int32_t>* ids, int* max_tokens,
                                     std::string* request_id) {
  if (request.input_case() == tandem::v1::GenerateRequest::kPromptTokenIds) {
    ids->assign(request.prompt_token_ids().ids().begin(), request.prompt_token_ids().ids().end());
  } else {
    absl::StatusOr<std::vector<int32_t>> encoded = tokenizer_->Encode(request.prompt());
    if (!encoded.ok()) return encoded.status();
    if (config_.add_bos_token) ids->push_back(tokenizer_->bos_id());
    ids->insert(ids->end(), encoded->begin(), encoded->end());
  }
  const int context = static_cast<int>(config_.model_config.max_position_embeddings);
  const int n = static_cast<int>(ids->size());
  if (n >= context) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", n, " tokens; the context length is ", context));
  }
  // max_tokens 0 = the server default; a request that would run past the context ends there
  // with a length finish, as vLLM's does.
  *max_tokens = request.sampling().max_tokens() == 0 ? 16 : request.sampling().max_tokens();
  *max_tokens = std::min(*max_tokens, context - n);
  if (request.request_id().empty()) {
    absl::MutexLock lock(&mu_);
    *request_id = absl::StrCat("gw-", next_request_++);
  } else {
    *request_id = request.request_id();
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* GatewayService::Generate(grpc::CallbackServerContext* context,
                                                   const tandem::v1::GenerateRequest* request,
                                                   tandem::v1::GenerateResponse* response) {
  const absl::Time start = absl::Now();
  auto* reactor = new UnaryReactor(metrics_, start);
  grpc::Status status = ValidateGenerate(*request);
  auto ids = std::make_shared<std::vector<int32_t>>();
  int max_tokens = 0;
  std::string request_id;
  if (status.ok())
    status = rpc::ToGrpcStatus(Prepare(*request, ids.get(), &max_tokens, &request_id));
  if (!status.ok()) {
    reactor->Done(status);
    return reactor;
  }
  response->set_request_id(request_id);
  const bool spawned = Spawn([this, reactor, request, response, ids, max_tokens, request_id, start,
                              call = reactor->call()] {
    absl::Status s = Dispatch(
        request_id, *ids, request->sampling(), max_tokens, call.get(), start,
        [response](const GenerateStreamResponse& chunk) {
          response->mutable_text()->append(chunk.text());
          response->mutable_token_ids()->Add(chunk.token_ids().begin(), chunk.token_ids().end());
          if (chunk.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
            response->set_finish_reason(chunk.finish_reason());
            *response->mutable_usage() = chunk.usage();
          }
        });
    reactor->Done(rpc::ToGrpcStatus(s));
  });
  if (!spawned) {
    reactor->Done(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the gateway is stopping"));
  }
  return reactor;
}

grpc::ServerWriteReactor<GenerateStreamResponse>* GatewayService::GenerateStream(
    grpc::CallbackServerContext* context, const tandem::v1::GenerateRequest* request) {
  const absl::Time start = absl::Now();
  grpc::Status status = ValidateGenerate(*request);
  auto ids = std::make_shared<std::vector<int32_t>>();
  int max_tokens = 0;
  std::string request_id;
  if (status.ok())
    status = rpc::ToGrpcStatus(Prepare(*request, ids.get(), &max_tokens, &request_id));
  if (!status.ok()) {
    metrics_->Record("GenerateStream", status, absl::Now() - start);
    return rpc::FinishedWriter<GenerateStreamResponse>(status);
  }
  // A worker thread feeds the stream; a client that goes away cancels the dispatch.
  auto* reactor = new rpc::QueuedWriter<GenerateStreamResponse>(metrics_, "GenerateStream");
  std::shared_ptr<rpc::QueuedWriter<GenerateStreamResponse>::Feed> feed = reactor->feed();
  auto call = std::make_shared<DispatchCall>();
  feed->SetOnCancel([call] { call->Cancel(); });
  const tandem::v1::SamplingParams sampling = request->sampling();
  const bool spawned = Spawn([this, feed, call, ids, max_tokens, request_id, sampling, start] {
    absl::Status s = Dispatch(request_id, *ids, sampling, max_tokens, call.get(), start,
                              [&](const GenerateStreamResponse& chunk) {
                                GenerateStreamResponse copy = chunk;
                                copy.set_request_id(request_id);
                                feed->Push(std::move(copy));
                              });
    feed->End(rpc::ToGrpcStatus(s));
  });
  if (!spawned) {
    feed->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the gateway is stopping"));
  }
  return reactor;
}

grpc::ServerUnaryReactor* GatewayService::Tokenize(grpc::CallbackServerContext* context,
                                                   const tandem::v1::TokenizeRequest* request,
                                                   tandem::v1::TokenizeResponse* response) {
  const absl::Time start = absl::Now();
  if (grpc::Status s = CheckModel(request->model()); !s.ok()) {
    return Finish(context, "Tokenize", s, start);
  }
  if (request->text().size() > config_.max_prompt_bytes) {
    return Finish(context, "Tokenize",
                  Invalid(absl::StrCat("text is ", request->text().size(), " bytes; the limit is ",
                                       config_.max_prompt_bytes)),
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
