#include "services/router-gateway/openai_api.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace tandem::gateway {
namespace {

using nlohmann::json;
using tandem::v1::GenerateStreamResponse;

constexpr char kJson[] = "application/json";

// An error with its HTTP status and the request field it concerns (empty: none).
struct ApiError {
  int status;
  std::string message;
  std::string param;
};

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
    case absl::StatusCode::kCancelled:  // by Drain: the client is still there
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

ApiError FromStatus(const absl::Status& status) {
  return {HttpStatus(status.code()), std::string(status.message()), ""};
}

// OpenAI's error object.
json ErrorJson(const ApiError& error) {
  const char* type = "internal_error";
  const char* code = nullptr;
  switch (error.status) {
    case 400:
      type = "invalid_request_error";
      break;
    case 404:
      type = "invalid_request_error";
      code = "model_not_found";
      break;
    case 413:
      type = "invalid_request_error";
      code = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      code = "overloaded";
      break;
    case 503:
      type = "service_unavailable";
      break;
    case 504:
      type = "timeout";
      break;
    default:
      break;
  }
  json body = {{"message", error.message},
               {"type", type},
               {"param", error.param.empty() ? json(nullptr) : json(error.param)},
               {"code", code == nullptr ? json(nullptr) : json(code)}};
  return {{"error", body}};
}

http::Response ErrorResponse(const ApiError& error) {
  return {error.status, kJson, ErrorJson(error).dump()};
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

// A field that may be absent or null.
const json* Field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// Reads an integer field; an error names it.
absl::Status ReadInt(const json& body, const char* name, int64_t min, int64_t max,
                     std::optional<int64_t>* out) {
  const json* f = Field(body, name);
  if (f == nullptr) return absl::OkStatus();
  if (!f->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be an integer"));
  }
  const int64_t v = f->get<int64_t>();
  if (v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is ", v, "; it must be in [", min, ", ", max, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadNumber(const json& body, const char* name, std::optional<double>* out) {
  const json* f = Field(body, name);
  if (f == nullptr) return absl::OkStatus();
  if (!f->is_number()) return absl::InvalidArgumentError(absl::StrCat(name, " must be a number"));
  *out = f->get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const json& body, const char* name, bool* out) {
  const json* f = Field(body, name);
  if (f == nullptr) return absl::OkStatus();
  if (!f->is_boolean()) return absl::InvalidArgumentError(absl::StrCat(name, " must be a boolean"));
  *out = f->get<bool>();
  return absl::OkStatus();
}

// What a completions request asks for beyond the GenerateRequest.
struct Parsed {
  tandem::v1::GenerateRequest request;
  bool stream = false;
  bool include_usage = false;
  std::string model;
};

// Token ids from a JSON array of integers; false if it is not one.
bool TokenIds(const json& value, tandem::v1::TokenIds* ids) {
  if (!value.is_array() || value.empty()) return false;
  for (const json& id : value) {
    if (!id.is_number_integer()) return false;
    const int64_t v = id.get<int64_t>();
    if (v < INT32_MIN || v > INT32_MAX) return false;
    ids->add_ids(static_cast<int32_t>(v));
  }
  return true;
}

absl::Status ReadPrompt(const json& body, tandem::v1::GenerateRequest* request) {
  const json* prompt = Field(body, "prompt");
  if (prompt == nullptr) return absl::InvalidArgumentError("prompt is required");
  if (prompt->is_string()) {
    request->set_prompt(prompt->get<std::string>());
    return absl::OkStatus();
  }
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    request->set_prompt((*prompt)[0].get<std::string>());
    return absl::OkStatus();
  }
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_array()) {
    if (TokenIds((*prompt)[0], request->mutable_prompt_token_ids())) return absl::OkStatus();
  } else if (TokenIds(*prompt, request->mutable_prompt_token_ids())) {
    return absl::OkStatus();
  }
  if (prompt->is_array() && prompt->size() > 1 &&
      ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    return absl::InvalidArgumentError("one prompt per request is supported (batches are not)");
  }
  return absl::InvalidArgumentError(
      "prompt must be a string, a list of token ids, or a list holding one of those");
}

absl::StatusOr<std::vector<ChatMessage>> ReadMessages(const json& body) {
  const json* messages = Field(body, "messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return absl::InvalidArgumentError("messages must be a non-empty list");
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return absl::InvalidArgumentError(where + " is not an object");
    const json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) {
      return absl::InvalidArgumentError(where + ".role must be a string");
    }
    ChatMessage message{role->get<std::string>(), ""};
    const json* content = Field(m, "content");
    if (content != nullptr && content->is_string()) {
      message.content = content->get<std::string>();
    } else if (content != nullptr && content->is_array()) {
      for (const json& part : *content) {
        const json* type = part.is_object() ? Field(part, "type") : nullptr;
        const json* text = part.is_object() ? Field(part, "text") : nullptr;
        if (type == nullptr || *type != "text" || text == nullptr || !text->is_string()) {
          return absl::InvalidArgumentError(
              where + ".content: only {\"type\": \"text\"} parts are supported");
        }
        message.content += text->get<std::string>();
      }
    } else if (content != nullptr) {
      return absl::InvalidArgumentError(where + ".content must be a string or a list of parts");
    }
    out.push_back(std::move(message));
  }
  return out;
}

// Fields Tandem does not implement: refused (400, as vLLM does) unless absent or at their
// no-op value.
absl::Status RefuseUnsupported(const json& body, bool chat) {
  auto refuse = [](const char* name) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is not supported by Tandem"));
  };
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    if (const json* f = Field(body, name); f != nullptr && !(f->is_number() && *f == 0)) {
      return refuse(name);
    }
  }
  if (const json* f = Field(body, "logit_bias"); f != nullptr && !f->empty()) {
    return refuse("logit_bias");
  }
  if (const json* f = Field(body, "logprobs");
      f != nullptr && !(f->is_boolean() && !f->get<bool>()) && !(f->is_number() && *f == 0)) {
    return refuse("logprobs");
  }
  if (const json* f = Field(body, "top_logprobs"); f != nullptr && !(f->is_number() && *f == 0)) {
    return refuse("top_logprobs");
  }
  if (chat) {
    for (const char* name : {"tools", "functions"}) {
      if (const json* f = Field(body, name); f != nullptr && !f->empty()) return refuse(name);
    }
    if (const json* f = Field(body, "response_format");
        f != nullptr && !(f->is_object() && f->value("type", "") == "text")) {
      return refuse("response_format other than {\"type\": \"text\"}");
    }
  } else {
    if (const json* f = Field(body, "echo");
        f != nullptr && !(f->is_boolean() && !f->get<bool>())) {
      return refuse("echo");
    }
    if (const json* f = Field(body, "suffix"); f != nullptr) return refuse("suffix");
  }
  return absl::OkStatus();
}

// The body of a completions request as a GenerateRequest; errors are INVALID_ARGUMENT, naming
// the field (also for a field Tandem does not serve).
absl::StatusOr<Parsed> ParseCompletion(const std::string& text, bool chat,
                                       const absl::StatusOr<ChatTemplate>& chat_template,
                                       int context) {
  const json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) return absl::InvalidArgumentError("the request body is not a JSON object");
  if (absl::Status s = RefuseUnsupported(body, chat); !s.ok()) return s;
  Parsed parsed;
  tandem::v1::GenerateRequest& request = parsed.request;
  if (const json* model = Field(body, "model"); model != nullptr) {
    if (!model->is_string()) return absl::InvalidArgumentError("model must be a string");
    parsed.model = model->get<std::string>();
    request.set_model(parsed.model);
  }
  if (chat) {
    if (!chat_template.ok()) return absl::InvalidArgumentError(chat_template.status().message());
    absl::StatusOr<std::vector<ChatMessage>> messages = ReadMessages(body);
    if (!messages.ok()) return messages.status();
    absl::StatusOr<std::string> prompt = chat_template->Apply(*messages);
    if (!prompt.ok()) return prompt.status();
    request.set_prompt(*std::move(prompt));
  } else if (absl::Status s = ReadPrompt(body, &request); !s.ok()) {
    return s;
  }
  tandem::v1::SamplingParams& sampling = *request.mutable_sampling();
  std::optional<int64_t> n, best_of, max_tokens, max_completion_tokens, seed, top_k;
  for (const auto& [name, out, min, max] :
       {std::tuple{"n", &n, int64_t{1}, int64_t{1}},
        std::tuple{"best_of", &best_of, int64_t{1}, int64_t{1}},
        std::tuple{"max_tokens", &max_tokens, int64_t{1}, int64_t{context} - 1},
        std::tuple{"max_completion_tokens", &max_completion_tokens, int64_t{1},
                   int64_t{context} - 1},
        std::tuple{"seed", &seed, INT64_MIN, INT64_MAX},
        std::tuple{"top_k", &top_k, int64_t{-1}, int64_t{1} << 20}}) {
    if (absl::Status s = ReadInt(body, name, min, max, out); !s.ok()) {
      if (std::string(name) == "n" || std::string(name) == "best_of") {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " must be 1 (one choice per request)"));
      }
      return s;
    }
  }
  if (max_completion_tokens) max_tokens = max_completion_tokens;
  // Unset: 16 tokens for a completion (OpenAI's and vLLM's default), the rest of the context
  // for a chat reply.
  sampling.set_max_tokens(static_cast<int>(max_tokens.value_or(chat ? context - 1 : 16)));
  if (seed) sampling.set_seed(static_cast<uint64_t>(*seed));
  if (top_k && *top_k > 0) sampling.set_top_k(static_cast<int>(*top_k));
  std::optional<double> temperature, top_p;
  if (absl::Status s = ReadNumber(body, "temperature", &temperature); !s.ok()) return s;
  if (absl::Status s = ReadNumber(body, "top_p", &top_p); !s.ok()) return s;
  sampling.set_temperature(static_cast<float>(temperature.value_or(1.0)));  // OpenAI's default
  if (top_p) {
    if (!(*top_p > 0 && *top_p <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat("top_p ", *top_p, " is outside (0, 1]"));
    }
    sampling.set_top_p(static_cast<float>(*top_p));
  }
  if (const json* stop = Field(body, "stop"); stop != nullptr) {
    if (stop->is_string()) {
      sampling.add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) return absl::InvalidArgumentError("stop entries must be strings");
        sampling.add_stop(s.get<std::string>());
      }
    } else {
      return absl::InvalidArgumentError("stop must be a string or a list of strings");
    }
  }
  if (chat && chat_template.ok()) {
    for (const std::string& s : chat_template->stop()) sampling.add_stop(s);
  }
  if (const json* ids = Field(body, "stop_token_ids"); ids != nullptr) {
    tandem::v1::TokenIds stop_ids;
    if (!ids->empty() && !TokenIds(*ids, &stop_ids)) {
      return absl::InvalidArgumentError("stop_token_ids must be a list of token ids");
    }
    sampling.mutable_stop_token_ids()->Assign(stop_ids.ids().begin(), stop_ids.ids().end());
  }
  bool ignore_eos = false;
  if (absl::Status s = ReadBool(body, "ignore_eos", &ignore_eos); !s.ok()) return s;
  sampling.set_ignore_eos(ignore_eos);
  if (absl::Status s = ReadBool(body, "stream", &parsed.stream); !s.ok()) return s;
  if (const json* options = Field(body, "stream_options"); options != nullptr) {
    if (!parsed.stream) {
      return absl::InvalidArgumentError("stream_options is only allowed with \"stream\": true");
    }
    if (!options->is_object())
      return absl::InvalidArgumentError("stream_options must be an object");
    if (absl::Status s = ReadBool(*options, "include_usage", &parsed.include_usage); !s.ok()) {
      return absl::InvalidArgumentError("stream_options.include_usage must be a boolean");
    }
  }
  return parsed;
}

}  // namespace

OpenAiApi::OpenAiApi(GatewayService* gateway, absl::StatusOr<ChatTemplate> chat,
                     serving::GatewayMetrics* metrics)
    : gateway_(gateway), chat_(std::move(chat)), metrics_(metrics) {}

std::vector<http::Route> OpenAiApi::Routes() {
  return {
      {"/v1/completions", nullptr,
       [this](const http::Request& r, http::ResponseWriter* out) { Completions(r, out, false); }},
      {"/v1/chat/completions", nullptr,
       [this](const http::Request& r, http::ResponseWriter* out) { Completions(r, out, true); }},
      {"/v1/models",
       [this](const http::Request& r) {
         http::Response response =
             r.method == "GET"
                 ? Models()
                 : ErrorResponse({405, absl::StrCat(r.method, " /v1/models: use GET"), ""});
         Count(r.path, response.status);
         return response;
       }},
  };
}

void OpenAiApi::Count(const std::string& path, int status) {
  metrics_->http_requests->Add({{"path", path}, {"code", absl::StrCat(status)}}).Increment();
}

http::Response OpenAiApi::Models() const {
  const GatewayConfig& config = gateway_->config();
  json model = {{"id", config.model_name},
                {"object", "model"},
                {"created", absl::ToUnixSeconds(absl::Now())},
                {"owned_by", "tandem"},
                {"max_model_len", config.model_config.max_position_embeddings}};
  return {200, kJson, json{{"object", "list"}, {"data", json::array({model})}}.dump()};
}

bool OpenAiApi::Enter(DispatchCall* call) {
  absl::MutexLock lock(&mu_);
  if (draining_) return false;
  running_.insert(call);
  return true;
}

void OpenAiApi::Leave(DispatchCall* call) {
  absl::MutexLock lock(&mu_);
  running_.erase(call);
}

void OpenAiApi::Drain(absl::Duration deadline) {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_.empty(); };
  if (mu_.AwaitWithTimeout(absl::Condition(&idle), deadline)) return;
  for (DispatchCall* call : running_) call->Cancel();
  mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(5));
}

void OpenAiApi::Completions(const http::Request& http_request, http::ResponseWriter* out,
                            bool chat) {
  const std::string& path = http_request.path;
  auto fail = [&](const ApiError& error) {
    out->Send(ErrorResponse(error));
    Count(path, error.status);
  };
  if (http_request.method != "POST") {
    return fail({405, absl::StrCat(http_request.method, " ", path, ": use POST"), ""});
  }
  const GatewayConfig& config = gateway_->config();
  absl::StatusOr<Parsed> parsed =
      ParseCompletion(http_request.body, chat, chat_,
                      static_cast<int>(config.model_config.max_position_embeddings));
  if (!parsed.ok()) return fail(FromStatus(parsed.status()));
  absl::StatusOr<GatewayService::Prepared> prepared = gateway_->Prepare(parsed->request);
  if (!prepared.ok()) return fail(FromStatus(prepared.status()));

  // Shared with the socket watch, which may still run for a moment after this returns.
  auto call = std::make_shared<DispatchCall>();
  if (!Enter(call.get())) return fail({503, "the gateway is draining", ""});
  out->OnClientGone([call] { call->Cancel(); });

  const std::string id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", prepared->request_id);
  const int64_t created = absl::ToUnixSeconds(absl::Now());
  const std::string& model = config.model_name;
  const char* object = chat ? "chat.completion.chunk" : "text_completion";
  // One streamed event: the choice (text or delta) and, with include_usage, "usage": null.
  auto event = [&](json choice) {
    json chunk = {{"id", id},
                  {"object", object},
                  {"created", created},
                  {"model", model},
                  {"choices", json::array({std::move(choice)})}};
    if (parsed->include_usage) chunk["usage"] = nullptr;
    return absl::StrCat("data: ", chunk.dump(), "\n\n");
  };
  std::string text;
  tandem::v1::Usage usage;
  const char* finish = nullptr;
  bool wrote_role = false;
  absl::Status status =
      gateway_->Execute(*prepared, call.get(), [&](const GenerateStreamResponse& c) {
        text += c.text();
        if (c.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
          finish = FinishReason(c.finish_reason());
          usage = c.usage();
        }
        if (!parsed->stream || (c.text().empty() && finish == nullptr)) return;
        if (!out->started() && !out->Start(200, "text/event-stream")) return call->Cancel();
        std::string events;
        if (chat && !wrote_role) {
          events += event({{"index", 0},
                           {"delta", {{"role", "assistant"}, {"content", ""}}},
                           {"logprobs", nullptr},
                           {"finish_reason", nullptr}});
          wrote_role = true;
        }
        json choice = {{"index", 0}, {"logprobs", nullptr}};
        if (chat) {
          choice["delta"] = c.text().empty() ? json::object() : json{{"content", c.text()}};
        } else {
          choice["text"] = c.text();
        }
        choice["finish_reason"] = finish == nullptr ? json(nullptr) : json(finish);
        events += event(std::move(choice));
        if (!out->Write(events)) call->Cancel();
      });
  Leave(call.get());
  if (call->cancelled() && out->client_gone()) return Count(path, 499);  // nobody to answer
  if (!status.ok() && !out->started()) return fail(FromStatus(status));
  if (parsed->stream) {
    if (!out->started()) out->Start(200, "text/event-stream");  // nothing was generated
    std::string tail;
    if (!status.ok()) {
      tail += absl::StrCat("data: ", ErrorJson(FromStatus(status)).dump(), "\n\n");
    } else if (parsed->include_usage) {
      json chunk = {{"id", id},       {"object", object},         {"created", created},
                    {"model", model}, {"choices", json::array()}, {"usage", Usage(usage)}};
      tail += absl::StrCat("data: ", chunk.dump(), "\n\n");
    }
    tail += "data: [DONE]\n\n";
    out->Write(tail);
    return Count(path, 200);
  }
  json choice = {{"index", 0},
                 {"logprobs", nullptr},
                 {"finish_reason", finish == nullptr ? json(nullptr) : json(finish)}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  json body = {{"id", id},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", created},
               {"model", model},
               {"choices", json::array({std::move(choice)})},
               {"usage", Usage(usage)}};
  out->Send({200, kJson, body.dump()});
  Count(path, 200);
}

}  // namespace tandem::gateway
