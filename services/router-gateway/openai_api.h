// The gateway's OpenAI-compatible HTTP front, served on the service's HTTP port beside
// /metrics (as vLLM serves both on one port):
//   POST /v1/completions       prompt: text, [text], token ids or [token ids] (one prompt)
//   POST /v1/chat/completions  messages, tools and chat_template_kwargs, rendered by the
//                              model's Jinja chat template; replies split into content,
//                              reasoning_content and tool_calls (common/chat/output_parser.h)
//   POST /tokenize, /detokenize  vLLM's shapes: a prompt or chat messages to token ids, and back
//   GET  /v1/models
// Both completions stream with server-sent events ("stream": true) or answer whole, and
// carry `usage`. Requests (openai_request.h) become the gateway's GenerateRequest and run
// through GatewayService with the same checks, admission, dispatch and metrics as gRPC; a
// request holds no thread while it runs (its output goes to the HTTP server's writer as it
// comes). Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}}, and
// status: 400 bad input, 404 unknown model, 413 body too large, 429 overloaded, 503 nothing
// can serve now (or draining), 504 past a deadline, 500 otherwise. A client that disconnects
// cancels its request through prefill and decode. docs/openai.md lists the fields.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http/http_server.h"
#include "services/common/serving_metrics.h"
#include "services/router-gateway/gateway_service.h"
#include "services/router-gateway/openai_request.h"

namespace tandem::gateway {

class OpenAiApi {
 public:
  // `front`: the model's chat template (or why it has none: chat requests then get 400 with
  // that reason), reply parsers and generation defaults; its context and vocabulary sizes
  // are taken from the gateway's config. `gateway` and `metrics` must outlive the routes and
  // every request they started (the HTTP server and the gateway service go first).
  OpenAiApi(GatewayService* gateway, ModelFront front, serving::GatewayMetrics* metrics);

  std::vector<http::Route> Routes();

 private:
  void Completions(const http::Request& request, std::shared_ptr<http::ResponseWriter> out,
                   bool chat);
  http::Response Models() const;
  http::Response Tokenize(const http::Request& request) const;
  http::Response Detokenize(const http::Request& request) const;

  GatewayService* const gateway_;
  const ModelFront front_;
  serving::GatewayMetrics* const metrics_;
};

// The HTTP status for a request that ended with `code`.
int HttpStatus(absl::StatusCode code);

}  // namespace tandem::gateway
