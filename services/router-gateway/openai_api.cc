#include "services/router-gateway/openai_api.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
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

// The text a token stands for inside a sequence: a byte-fallback piece (<0xE6>) as its byte,
// a byte-level piece as its bytes, a word-leading "▁" as a space (which decoding a token
// alone would strip); control tokens (BOS) as their piece.
std::string TokenText(const model::Tokenizer& tokenizer, int32_t id) {
  const std::string piece = tokenizer.IdToPiece(id);
  if (tokenizer.IsByte(id) && piece.size() == 6 && piece.compare(0, 3, "<0x") == 0) {
    return std::string(1, static_cast<char>(std::strtol(piece.substr(3, 2).c_str(), nullptr, 16)));
  }
  constexpr char kWordStart[] = "\xe2\x96\x81";  // ▁
  absl::StatusOr<std::string> text =
      tokenizer.IsControl(id) ? absl::StatusOr<std::string>("") : tokenizer.Decode({id});
  if (!text.ok() || text->empty()) return absl::StrReplaceAll(piece, {{kWordStart, " "}});
  if (piece.starts_with(kWordStart) && !text->starts_with(" ")) return " " + *text;
  return *text;
}

// Characters (code points) in UTF-8 text: OpenAI's text_offset counts those.
int Characters(absl::string_view text) {
  int n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// JSON has no -inf: vLLM's stand-in.
float Finite(float logprob) { return std::isfinite(logprob) ? logprob : -9999.0f; }

json Bytes(absl::string_view text) {
  json bytes = json::array();
  for (char c : text) bytes.push_back(static_cast<unsigned char>(c));
  return bytes;
}

// Completions' logprobs object, a token at a time: the token, its log-probability (null for
// the prompt's first), the alternatives with the chosen token among them, and its offset in
// the choice's text (in characters, where the detokenizer puts the token's text).
class CompletionLogprobs {
 public:
  explicit CompletionLogprobs(const model::Tokenizer* tokenizer)
      : tokenizer_(tokenizer), detok_(tokenizer) {}

  void Add(int32_t id, const tandem::v1::TokenLogprobs* p) {
    const std::string text = TokenText(*tokenizer_, id);
    value_["tokens"].push_back(text);
    value_["text_offset"].push_back(base_ + emitted_);
    if (absl::StatusOr<std::string> piece = detok_.Add(id); piece.ok()) {
      emitted_ += Characters(*piece);
    }
    if (p == nullptr) {
      value_["token_logprobs"].push_back(nullptr);
      value_["top_logprobs"].push_back(nullptr);
      return;
    }
    value_["token_logprobs"].push_back(Finite(p->logprob()));
    json top = json::object();
    for (const tandem::v1::TokenLogprob& t : p->top()) {
      const std::string key = TokenText(*tokenizer_, t.token_id());
      if (!top.contains(key)) top[key] = Finite(t.logprob());  // the likelier of equal texts
    }
    if (!top.contains(text)) top[text] = Finite(p->logprob());
    value_["top_logprobs"].push_back(std::move(top));
  }

  // The generated tokens begin, at `offset` characters (after an echoed prompt): their text
  // is detokenized on its own, as the engine's.
  void StartGenerated(int offset) {
    detok_.Reset();
    base_ = offset;
    emitted_ = 0;
  }

  // The object so far, and a fresh one that goes on at the same offset (streaming).
  json Take() {
    json out = std::move(value_);
    value_ = Empty();
    return out;
  }

 private:
  static json Empty() {
    return {{"tokens", json::array()},
            {"token_logprobs", json::array()},
            {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  }

  const model::Tokenizer* const tokenizer_;
  model::StreamingDetokenizer detok_;
  json value_ = Empty();
  int base_ = 0;
  int emitted_ = 0;
};

// Chat's logprobs entry for one generated token.
json ChatLogprob(const model::Tokenizer& tokenizer, const tandem::v1::TokenLogprobs& p) {
  const std::string text = TokenText(tokenizer, p.token_id());
  json top = json::array();
  for (const tandem::v1::TokenLogprob& t : p.top()) {
    const std::string alt = TokenText(tokenizer, t.token_id());
    top.push_back({{"token", alt}, {"logprob", Finite(t.logprob())}, {"bytes", Bytes(alt)}});
  }
  return {{"token", text},
          {"logprob", Finite(p.logprob())},
          {"bytes", Bytes(text)},
          {"top_logprobs", std::move(top)}};
}

// What a request's answer is made from.
struct Request {
  std::shared_ptr<http::ResponseWriter> out;
  serving::GatewayMetrics* metrics;
  const model::Tokenizer* tokenizer;
  std::string path;
  bool chat;
  CompletionRequest parsed;
  std::string id;
  int64_t created;
  std::string model;
  std::shared_ptr<DispatchCall> call;  // shared by the choices: cancelling ends them all
  std::vector<int32_t> prompt;         // token ids, for echo
  std::string prompt_text;             // for echo
  const ModelFront* front;             // chat: how replies carry reasoning and tool calls
};

// A chat reply's parts as OpenAI's message or delta fields: content, reasoning_content,
// tool_calls (whole calls; a streamed call arrives in one delta).
json ToolCallsJson(const std::vector<chat::ToolCall>& calls, bool delta) {
  json out = json::array();
  for (const chat::ToolCall& call : calls) {
    json entry = {{"id", call.id},
                  {"type", "function"},
                  {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
    if (delta) entry["index"] = call.index;
    out.push_back(std::move(entry));
  }
  return out;
}

// One response for best_of generations (one per choice, run side by side): a whole JSON
// response once all have ended, or server-sent events as they come (the HTTP status is 200
// once the first event is out; an error before that is an ordinary error response). The
// first choice to fail ends the rest and the response says why.
class Answer {
 public:
  explicit Answer(Request request)
      : r_(std::move(request)), choices_(r_.parsed.best_of), remaining_(r_.parsed.best_of) {
    for (Choice& c : choices_) {
      c.logprobs.emplace(r_.tokenizer);
      if (r_.chat) {
        c.parser.emplace(r_.front->reasoning, r_.front->tool_calls, r_.parsed.parse_tool_calls,
                         r_.parsed.prompt_opens_reasoning, r_.parsed.forced_tools);
      }
    }
  }

  void OnChunk(int index, const GenerateStreamResponse& c) {
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      if (!error_.ok()) return;  // ending: nothing more is shown
      Choice& choice = choices_[index];
      if (c.prompt_logprobs_size() > 0) {
        choice.prompt_logprobs.assign(c.prompt_logprobs().begin(), c.prompt_logprobs().end());
      }
      if (c.has_usage()) usage_[index] = c.usage();
      if (c.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
        choice.finish = FinishReason(c.finish_reason());
      }
      for (const tandem::v1::TokenLogprobs& p : c.logprobs()) choice.cumulative += p.logprob();
      if (r_.parsed.stream) {
        cancel = !Stream(index, c);
      } else {
        choice.text += c.text();
        choice.ids.insert(choice.ids.end(), c.token_ids().begin(), c.token_ids().end());
        choice.token_logprobs.insert(choice.token_logprobs.end(), c.logprobs().begin(),
                                     c.logprobs().end());
      }
    }
    if (cancel) r_.call->Cancel();
  }

  // A comment line: ignored by clients, but it keeps proxies' idle timers from closing a
  // stream that waits (and shows a closed connection sooner).
  void OnKeepAlive() {
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      cancel = r_.parsed.stream && r_.out->started() && error_.ok() &&
               !r_.out->Write(": keep-alive\n\n");
    }
    if (cancel) r_.call->Cancel();
  }

  void OnDone(const absl::Status& status) {
    bool end_others = false, last = false;
    {
      absl::MutexLock lock(&mu_);
      if (!status.ok() && error_.ok()) {
        error_ = status;
        end_others = true;
      }
      last = --remaining_ == 0;
      if (last) Finish();
    }
    // Outside the lock: the others' ends come back here.
    if (end_others && !last) r_.call->Cancel();
  }

 private:
  struct Choice {
    std::string text;
    std::vector<int32_t> ids;
    std::vector<tandem::v1::TokenLogprobs> token_logprobs;  // per id, when asked for
    std::vector<tandem::v1::TokenLogprobs> prompt_logprobs;
    const char* finish = nullptr;
    double cumulative = 0;                         // of the tokens generated, for best_of
    std::optional<CompletionLogprobs> logprobs;    // streaming: the running text_offset
    bool began = false;                            // streaming: role or echo sent
    std::optional<chat::ChatOutputParser> parser;  // chat: reasoning and tool calls
  };

  bool shows_reasoning() const { return r_.front->reasoning != chat::ReasoningFormat::kNone; }

  // A chat delta's fields; empty when the parser holds everything so far.
  json DeltaJson(const chat::ChatDelta& d) const {
    json delta = json::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) delta["tool_calls"] = ToolCallsJson(d.tool_calls, true);
    return delta;
  }

  // A finished choice's reason: a reply that called tools ends with "tool_calls".
  static const char* ChatFinish(const Choice& c, const char* finish) {
    return finish != nullptr && c.parser && c.parser->called_tools() ? "tool_calls" : finish;
  }

  bool want_logprobs() const { return r_.parsed.logprobs >= 0; }
  const char* Object() const { return r_.chat ? "chat.completion.chunk" : "text_completion"; }

  // Echo: the prompt's tokens first, the first of them with no log-probability.
  void AddPrompt(const Choice& choice, CompletionLogprobs* lp) const {
    for (size_t i = 0; i < r_.prompt.size(); ++i) {
      const bool scored = i > 0 && i - 1 < choice.prompt_logprobs.size();
      lp->Add(r_.prompt[i], scored ? &choice.prompt_logprobs[i - 1] : nullptr);
    }
    lp->StartGenerated(Characters(r_.prompt_text));
  }

  // The chunk's events; false when the client is gone (the request is then cancelled).
  bool Stream(int index, const GenerateStreamResponse& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Choice& choice = choices_[index];
    const char* finish = c.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED
                             ? FinishReason(c.finish_reason())
                             : nullptr;
    std::string events;
    if (!choice.began) {
      choice.began = true;
      if (r_.chat) {
        events += Event({{"index", index},
                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                         {"logprobs", nullptr},
                         {"finish_reason", nullptr}});
      } else if (r_.parsed.echo) {
        json logprobs = nullptr;
        if (want_logprobs()) {
          AddPrompt(choice, &*choice.logprobs);
          logprobs = choice.logprobs->Take();
        }
        events += Event({{"index", index},
                         {"text", r_.prompt_text},
                         {"logprobs", std::move(logprobs)},
                         {"finish_reason", nullptr}});
      }
    }
    const bool has_logprobs = want_logprobs() && c.logprobs_size() > 0;
    if (!c.text().empty() || finish != nullptr || has_logprobs) {
      json choice_json = {{"index", index}};
      json logprobs = nullptr;
      if (has_logprobs && r_.chat) {
        json content = json::array();
        for (const tandem::v1::TokenLogprobs& p : c.logprobs()) {
          content.push_back(ChatLogprob(*r_.tokenizer, p));
        }
        logprobs = {{"content", std::move(content)}};
      } else if (has_logprobs) {
        for (int i = 0; i < c.logprobs_size() && i < c.token_ids_size(); ++i) {
          choice.logprobs->Add(c.token_ids(i), &c.logprobs(i));
        }
        logprobs = choice.logprobs->Take();
      }
      bool show = true;
      if (r_.chat) {
        chat::ChatDelta d = choice.parser->Add(c.text());
        if (finish != nullptr) d.Append(choice.parser->Finish());
        choice_json["delta"] = DeltaJson(d);
        finish = ChatFinish(choice, finish);
        // Text the parser holds (a tag may be starting) waits for the next chunk.
        show = !choice_json["delta"].empty() || finish != nullptr || has_logprobs;
      } else {
        choice_json["text"] = c.text();
      }
      choice_json["logprobs"] = std::move(logprobs);
      choice_json["finish_reason"] = finish == nullptr ? json(nullptr) : json(finish);
      if (show) events += Event(std::move(choice_json));
    }
    if (events.empty()) return true;
    return Begin() && r_.out->Write(events);
  }

  // Every choice has ended: the response, or its end.
  void Finish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (r_.out->client_gone()) return Count(r_.metrics, r_.path, 499);  // nobody to answer
    if (!error_.ok() && !r_.out->started()) {
      const http::Response error = ErrorResponse(error_);
      r_.out->Send(error);
      return Count(r_.metrics, r_.path, error.status);
    }
    tandem::v1::Usage usage;
    usage.set_prompt_tokens(usage_.empty() ? 0 : usage_.begin()->second.prompt_tokens());
    for (const auto& [index, u] : usage_) {
      usage.set_completion_tokens(usage.completion_tokens() + u.completion_tokens());
    }
    if (!r_.parsed.stream) {
      r_.out->Send({200, kJson, Dump(Whole(usage))});
      return Count(r_.metrics, r_.path, 200);
    }
    if (!Begin()) return Count(r_.metrics, r_.path, 499);  // nothing was generated
    std::string tail;
    if (!error_.ok()) {
      tail += absl::StrCat("data: ", http::ErrorBody(HttpStatus(error_.code()), error_.message()),
                           "\n\n");
    } else if (r_.parsed.include_usage) {
      const json chunk = {{"id", r_.id},       {"object", Object()},       {"created", r_.created},
                          {"model", r_.model}, {"choices", json::array()}, {"usage", Usage(usage)}};
      tail += absl::StrCat("data: ", Dump(chunk), "\n\n");
    }
    tail += "data: [DONE]\n\n";
    r_.out->Write(tail);
    r_.out->Finish();
    Count(r_.metrics, r_.path, 200);
  }

  json Whole(const tandem::v1::Usage& usage) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // best_of: the n of highest cumulative log-probability, best first (as vLLM ranks them).
    std::vector<int> order(choices_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    if (r_.parsed.best_of > r_.parsed.n) {
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return choices_[a].cumulative > choices_[b].cumulative;
      });
    }
    order.resize(r_.parsed.n);
    json choices = json::array();
    for (size_t i = 0; i < order.size(); ++i) {
      Choice& c = choices_[order[i]];
      json logprobs = nullptr;
      if (want_logprobs() && r_.chat) {
        json content = json::array();
        for (const tandem::v1::TokenLogprobs& p : c.token_logprobs) {
          content.push_back(ChatLogprob(*r_.tokenizer, p));
        }
        logprobs = {{"content", std::move(content)}};
      } else if (want_logprobs()) {
        if (r_.parsed.echo) AddPrompt(c, &*c.logprobs);
        for (size_t t = 0; t < c.ids.size() && t < c.token_logprobs.size(); ++t) {
          c.logprobs->Add(c.ids[t], &c.token_logprobs[t]);
        }
        logprobs = c.logprobs->Take();
      }
      const char* finish = c.finish;
      json message;
      if (r_.chat) {
        chat::ChatDelta d = c.parser->Add(c.text);
        d.Append(c.parser->Finish());
        finish = ChatFinish(c, finish);
        message = {{"role", "assistant"},
                   {"content",
                    d.content.empty() && !d.tool_calls.empty() ? json(nullptr) : json(d.content)}};
        if (shows_reasoning()) {
          message["reasoning_content"] = d.reasoning.empty() ? json(nullptr) : json(d.reasoning);
        }
        if (!d.tool_calls.empty()) message["tool_calls"] = ToolCallsJson(d.tool_calls, false);
      }
      json choice = {{"index", i},
                     {"logprobs", std::move(logprobs)},
                     {"finish_reason", finish == nullptr ? json(nullptr) : json(finish)}};
      if (r_.chat) {
        choice["message"] = std::move(message);
      } else {
        choice["text"] = r_.parsed.echo ? r_.prompt_text + c.text : c.text;
      }
      choices.push_back(std::move(choice));
    }
    return {{"id", r_.id},
            {"object", r_.chat ? "chat.completion" : "text_completion"},
            {"created", r_.created},
            {"model", r_.model},
            {"choices", std::move(choices)},
            {"usage", Usage(usage)}};
  }

  bool Begin() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return r_.out->started() || r_.out->Start(200, "text/event-stream");
  }

  // One event: the choice (text or delta) and, with include_usage, "usage": null.
  std::string Event(json choice) const {
    json chunk = {{"id", r_.id},
                  {"object", Object()},
                  {"created", r_.created},
                  {"model", r_.model},
                  {"choices", json::array({std::move(choice)})}};
    if (r_.parsed.include_usage) chunk["usage"] = nullptr;
    return absl::StrCat("data: ", Dump(chunk), "\n\n");
  }

  const Request r_;
  absl::Mutex mu_;
  std::vector<Choice> choices_ ABSL_GUARDED_BY(mu_);
  std::map<int, tandem::v1::Usage> usage_ ABSL_GUARDED_BY(mu_);
  int remaining_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // the first failure
};

// One choice's generation, into the shared answer.
class ChoiceSink : public GenerationSink {
 public:
  ChoiceSink(std::shared_ptr<Answer> answer, int index)
      : answer_(std::move(answer)), index_(index) {}
  void OnChunk(const GenerateStreamResponse& chunk) override { answer_->OnChunk(index_, chunk); }
  void OnKeepAlive() override { answer_->OnKeepAlive(); }
  void OnDone(const absl::Status& status) override { answer_->OnDone(status); }

 private:
  const std::shared_ptr<Answer> answer_;
  const int index_;
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

OpenAiApi::OpenAiApi(GatewayService* gateway, ModelFront front, serving::GatewayMetrics* metrics)
    : gateway_(gateway), front_(std::move(front)), metrics_(metrics) {}

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
      {"/tokenize",
       [this](const http::Request& r) {
         http::Response response = Tokenize(r);
         Count(metrics_, r.path, response.status);
         return response;
       }},
      {"/detokenize",
       [this](const http::Request& r) {
         http::Response response = Detokenize(r);
         Count(metrics_, r.path, response.status);
         return response;
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

http::Response OpenAiApi::Tokenize(const http::Request& request) const {
  if (request.method != "POST") {
    return ErrorResponse(405, absl::StrCat(request.method, " /tokenize: use POST"), "");
  }
  absl::StatusOr<TokenizeInput> input = ParseTokenizeRequest(request.body, front_);
  if (!input.ok()) return ErrorResponse(input.status());
  const GatewayConfig& config = gateway_->config();
  if (!input->model.empty() && input->model != config.model_name) {
    return ErrorResponse(
        absl::NotFoundError(absl::StrCat("model '", input->model, "' is not served here")));
  }
  if (input->text.size() > config.max_prompt_bytes) {
    return ErrorResponse(WithParam(
        absl::InvalidArgumentError(absl::StrCat("prompt is ", input->text.size(),
                                                " bytes; the limit is ", config.max_prompt_bytes)),
        "prompt"));
  }
  absl::StatusOr<std::vector<int32_t>> ids =
      gateway_->TokenizePrompt(input->text, input->add_special_tokens);
  if (!ids.ok()) return ErrorResponse(ids.status());
  json body = {{"count", ids->size()},
               {"max_model_len", config.model_config.max_position_embeddings},
               {"tokens", *ids},
               {"token_strs", nullptr}};
  if (input->return_token_strs) {
    json strs = json::array();
    for (int32_t id : *ids) strs.push_back(gateway_->tokenizer().IdToPiece(id));
    body["token_strs"] = std::move(strs);
  }
  return {200, kJson, Dump(body)};
}

http::Response OpenAiApi::Detokenize(const http::Request& request) const {
  if (request.method != "POST") {
    return ErrorResponse(405, absl::StrCat(request.method, " /detokenize: use POST"), "");
  }
  const GatewayConfig& config = gateway_->config();
  absl::StatusOr<DetokenizeInput> input =
      ParseDetokenizeRequest(request.body, static_cast<int>(config.model_config.vocab_size));
  if (!input.ok()) return ErrorResponse(input.status());
  if (!input->model.empty() && input->model != config.model_name) {
    return ErrorResponse(
        absl::NotFoundError(absl::StrCat("model '", input->model, "' is not served here")));
  }
  absl::StatusOr<std::string> text = gateway_->tokenizer().Decode(input->tokens);
  if (!text.ok()) return ErrorResponse(WithParam(text.status(), "tokens"));
  return {200, kJson, Dump(json{{"prompt", *text}})};
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
      ParseCompletionRequest(http_request.body, chat, front_);
  if (!parsed.ok()) return fail(ErrorResponse(parsed.status()));
  absl::StatusOr<GatewayService::Prepared> prepared = gateway_->Prepare(parsed->request);
  if (!prepared.ok()) return fail(ErrorResponse(prepared.status()));

  Request r;
  r.out = out;
  r.metrics = metrics_;
  r.tokenizer = &gateway_->tokenizer();
  r.path = path;
  r.chat = chat;
  r.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", prepared->generation.request_id);
  r.created = absl::ToUnixSeconds(absl::Now());
  r.model = config.model_name;
  r.call = std::make_shared<DispatchCall>();
  r.front = &front_;
  if (parsed->echo) {
    r.prompt = prepared->generation.prompt;
    if (parsed->request.input_case() == tandem::v1::GenerateRequest::kPrompt) {
      r.prompt_text = parsed->request.prompt();
    } else {
      absl::StatusOr<std::string> text = r.tokenizer->Decode(r.prompt);
      if (!text.ok()) return fail(ErrorResponse(WithParam(text.status(), "prompt")));
      r.prompt_text = *std::move(text);
    }
  }
  const int choices = parsed->best_of;
  r.parsed = *std::move(parsed);
  std::shared_ptr<DispatchCall> call = r.call;
  auto answer = std::make_shared<Answer>(std::move(r));
  out->OnClientGone([call] { call->Cancel(); });
  for (int i = 0; i < choices; ++i) {
    GatewayService::Prepared choice = *prepared;
    if (choices > 1) {
      // Each choice its own stream of draws: seed + i, as n requests would be sent.
      absl::StrAppend(&choice.generation.request_id, "-", i);
      if (choice.generation.sampling.has_seed()) {
        choice.generation.sampling.set_seed(choice.generation.sampling.seed() + i);
      }
    }
    gateway_->Execute(std::move(choice), call, std::make_shared<ChoiceSink>(answer, i));
  }
}

}  // namespace tandem::gateway
