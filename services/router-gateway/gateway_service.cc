#include "services/router-gateway/gateway_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

grpc::Status GenerationUnavailable() {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      "generation through the cluster is not available in this build: the "
                      "prefill -> KV transfer -> decode path (issue #5) has not landed yet");
}

}  // namespace

grpc::ServerUnaryReactor* GatewayService::Generate(grpc::CallbackServerContext* context,
                                                   const tandem::v1::GenerateRequest* request,
                                                   tandem::v1::GenerateResponse* response) {
  const absl::Time start = absl::Now();
  grpc::Status status = ValidateGenerate(*request);
  if (status.ok()) status = GenerationUnavailable();
  return Finish(context, "Generate", status, start);
}

grpc::ServerWriteReactor<tandem::v1::GenerateStreamResponse>* GatewayService::GenerateStream(
    grpc::CallbackServerContext* context, const tandem::v1::GenerateRequest* request) {
  const absl::Time start = absl::Now();
  grpc::Status status = ValidateGenerate(*request);
  if (status.ok()) status = GenerationUnavailable();
  metrics_->Record("GenerateStream", status, absl::Now() - start);
  return rpc::FinishedWriter<tandem::v1::GenerateStreamResponse>(status);
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
