#include "services/router-gateway/openai_api.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "services/router-gateway/openai_request.h"

namespace tandem::gateway {
namespace {

using nlohmann::json;
using tandem::v1::GenerateStreamResponse;

constexpr char kJson[] = "application/json";

// JSON text for a response: strings that are not valid UTF-8 (they should not occur: the
// engine emits whole characters) are repaired rather than allowed to throw.
std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

http::Response ErrorResponse(int status, absl::string_view message, absl::string_view param) {
  return {status, kJson, http::ErrorBody(status, message, param)};
}

http::Response ErrorResponse(const absl::Status& status) {
  const int code = HttpStatus(status.code());
  // NOT_FOUND from the gateway is always an unknown model.
  return {
      code, kJson,
      http::ErrorBody(code, status.message(), ParamOf(status),
                      status.code() == absl::StatusCode::kNotFound ? "model_not_found" : nullptr)};
}

const char* FinishReason(tandem::v1::FinishReason reason) {
  switch (reason) {
    case tandem::v1::FINISH_REASON_STOP:
      return "stop";
    case tandem::v1::FINISH_REASON_LENGTH:
      return "length";
    case tandem::v1::FINISH_REASON_CANCELLED:
      return "abort";
    default:
      return nullptr;
  }
}

json Usage(const tandem::v1::Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens()},
          {"completion_tokens", usage.completion_tokens()},
          {"total_tokens", usage.prompt_tokens() + usage.completion_tokens()}};
}

void Count(serving::GatewayMetrics* metrics, const std::string& path, int status) {
  metrics->http_requests->Add({{"path", path}, {"code", absl::StrCat(status)}}).Increment();
}

// What both kinds of answer share.
struct Answer {
  std::shared_ptr<http::ResponseWriter> out;
  serving::GatewayMetrics* metrics;
  std::string path;
  bool chat;
  CompletionRequest parsed;
  std::string id;
  int64_t created;
  std::string model;
  std::shared_ptr<DispatchCall> call;
};

// A whole JSON response once the generation ends.
class WholeSink : public GenerationSink {
 public:
  explicit WholeSink(Answer answer) : a_(std::move(answer)) {}

  void OnChunk(const GenerateStreamResponse& c) override {
    text_ += c.text();
    if (c.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      finish_ = FinishReason(c.finish_reason());
      usage_ = c.usage();
    }
  }

  void OnDone(const absl::Status& status) override {
    if (a_.out->client_gone()) return Count(a_.metrics, a_.path, 499);  // nobody to answer
    if (!status.ok()) {
      const http::Response error = ErrorResponse(status);
      a_.out->Send(error);
      return Count(a_.metrics, a_.path, error.status);
    }
    json choice = {{"index", 0},
                   {"logprobs", nullptr},
                   {"finish_reason", finish_ == nullptr ? json(nullptr) : json(finish_)}};
    if (a_.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", text_}};
    } else {
      choice["text"] = text_;
    }
    const json body = {{"id", a_.id},
                       {"object", a_.chat ? "chat.completion" : "text_completion"},
                       {"created", a_.created},
                       {"model", a_.model},
                       {"choices", json::array({std::move(choice)})},
                       {"usage", Usage(usage_)}};
    a_.out->Send({200, kJson, Dump(body)});
    Count(a_.metrics, a_.path, 200);
  }

 private:
  const Answer a_;
  std::string text_;
  const char* finish_ = nullptr;
  tandem::v1::Usage usage_;
};

// Server-sent events as the text comes; the HTTP status is 200 once the first event is out
// (an error before that is an ordinary error response).
class StreamSink : public GenerationSink {
 public:
  explicit StreamSink(Answer answer) : a_(std::move(answer)) {}

  void OnChunk(const GenerateStreamResponse& c) override {
    const char* finish = c.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED
                             ? FinishReason(c.finish_reason())
                             : nullptr;
    if (c.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) usage_ = c.usage();
    if (c.text().empty() && finish == nullptr) return;
    if (!Begin()) return;
    std::string events;
    if (a_.chat && !wrote_role_) {
      events += Event({{"index", 0},
                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                       {"logprobs", nullptr},
                       {"finish_reason", nullptr}});
      wrote_role_ = true;
    }
    json choice = {{"index", 0}, {"logprobs", nullptr}};
    if (a_.chat) {
      choice["delta"] = c.text().empty() ? json::object() : json{{"content", c.text()}};
    } else {
      choice["text"] = c.text();
    }
    choice["finish_reason"] = finish == nullptr ? json(nullptr) : json(finish);
    events += Event(std::move(choice));
    if (!a_.out->Write(events)) a_.call->Cancel();
  }

  // A comment line: ignored by clients, but it keeps proxies' idle timers from closing a
  // stream that waits (and shows a closed connection sooner).
  void OnKeepAlive() override {
    if (a_.out->started() && !a_.out->Write(": keep-alive\n\n")) a_.call->Cancel();
  }

  void OnDone(const absl::Status& status) override {
    if (a_.out->client_gone()) return Count(a_.metrics, a_.path, 499);
    if (!status.ok() && !a_.out->started()) {
      const http::Response error = ErrorResponse(status);
      a_.out->Send(error);
      return Count(a_.metrics, a_.path, error.status);
    }
    if (!Begin()) return Count(a_.metrics, a_.path, 499);  // nothing was generated
    std::string tail;
    if (!status.ok()) {
      tail += absl::StrCat("data: ", http::ErrorBody(HttpStatus(status.code()), status.message()),
                           "\n\n");
    } else if (a_.parsed.include_usage) {
      const json chunk = {
          {"id", a_.id},       {"object", Object()},       {"created", a_.created},
          {"model", a_.model}, {"choices", json::array()}, {"usage", Usage(usage_)}};
      tail += absl::StrCat("data: ", Dump(chunk), "\n\n");
    }
    tail += "data: [DONE]\n\n";
    a_.out->Write(tail);
    a_.out->Finish();
    Count(a_.metrics, a_.path, 200);
  }

 private:
  const char* Object() const { return a_.chat ? "chat.completion.chunk" : "text_completion"; }

  bool Begin() {
    if (a_.out->started()) return true;
    if (a_.out->Start(200, "text/event-stream")) return true;
    a_.call->Cancel();
    return false;
  }

  // One event: the choice (text or delta) and, with include_usage, "usage": null.
  std::string Event(json choice) const {
    json chunk = {{"id", a_.id},
                  {"object", Object()},
                  {"created", a_.created},
                  {"model", a_.model},
                  {"choices", json::array({std::move(choice)})}};
    if (a_.parsed.include_usage) chunk["usage"] = nullptr;
    return absl::StrCat("data: ", Dump(chunk), "\n\n");
  }

  const Answer a_;
  tandem::v1::Usage usage_;
  bool wrote_role_ = false;
};

}  // namespace

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:  // by a drain: the client is still there
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

OpenAiApi::OpenAiApi(GatewayService* gateway, absl::StatusOr<ChatTemplate> chat,
                     serving::GatewayMetrics* metrics)
    : gateway_(gateway), chat_(std::move(chat)), metrics_(metrics) {}

std::vector<http::Route> OpenAiApi::Routes() {
  return {
      {"/v1/completions", nullptr,
       [this](const http::Request& r, std::shared_ptr<http::ResponseWriter> out) {
         Completions(r, std::move(out), false);
       }},
      {"/v1/chat/completions", nullptr,
       [this](const http::Request& r, std::shared_ptr<http::ResponseWriter> out) {
         Completions(r, std::move(out), true);
       }},
      {"/v1/models",
       [this](const http::Request& r) {
         http::Response response =
             r.method == "GET" || r.method == "HEAD"
                 ? Models()
                 : ErrorResponse(405, absl::StrCat(r.method, " /v1/models: use GET"), "");
         Count(metrics_, r.path, response.status);
         return response;
       }},
  };
}

http::Response OpenAiApi::Models() const {
  const GatewayConfig& config = gateway_->config();
  json model = {{"id", config.model_name},
                {"object", "model"},
                {"created", absl::ToUnixSeconds(absl::Now())},
                {"owned_by", "tandem"},
                {"max_model_len", config.model_config.max_position_embeddings}};
  return {200, kJson, Dump(json{{"object", "list"}, {"data", json::array({model})}})};
}

void OpenAiApi::Completions(const http::Request& http_request,
                            std::shared_ptr<http::ResponseWriter> out, bool chat) {
  const std::string& path = http_request.path;
  auto fail = [&](const http::Response& error) {
    out->Send(error);
    Count(metrics_, path, error.status);
  };
  if (http_request.method != "POST") {
    return fail(ErrorResponse(405, absl::StrCat(http_request.method, " ", path, ": use POST"), ""));
  }
  const GatewayConfig& config = gateway_->config();
  absl::StatusOr<CompletionRequest> parsed =
      ParseCompletionRequest(http_request.body, chat, chat_,
                             static_cast<int>(config.model_config.max_position_embeddings));
  if (!parsed.ok()) return fail(ErrorResponse(parsed.status()));
  absl::StatusOr<GatewayService::Prepared> prepared = gateway_->Prepare(parsed->request);
  if (!prepared.ok()) return fail(ErrorResponse(prepared.status()));

  Answer answer;
  answer.out = out;
  answer.metrics = metrics_;
  answer.path = path;
  answer.chat = chat;
  answer.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", prepared->generation.request_id);
  answer.created = absl::ToUnixSeconds(absl::Now());
  answer.model = config.model_name;
  answer.call = std::make_shared<DispatchCall>();
  const bool stream = parsed->stream;
  answer.parsed = *std::move(parsed);
  std::shared_ptr<DispatchCall> call = answer.call;
  std::shared_ptr<GenerationSink> sink;
  if (stream) {
    sink = std::make_shared<StreamSink>(std::move(answer));
  } else {
    sink = std::make_shared<WholeSink>(std::move(answer));
  }
  out->OnClientGone([call] { call->Cancel(); });
  gateway_->Execute(*std::move(prepared), call, std::move(sink));
}

}  // namespace tandem::gateway
