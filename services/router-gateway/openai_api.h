// The gateway's OpenAI-compatible HTTP front, served on the service's HTTP port beside
// /metrics (as vLLM serves both on one port):
//   POST /v1/completions       prompt: text, [text], token ids or [token ids] (one prompt)
//   POST /v1/chat/completions  messages, formatted by the model's chat template
//   GET  /v1/models
// Both completions stream with server-sent events ("stream": true) or answer whole, and
// carry `usage`. Requests become the gateway's GenerateRequest and run through
// GatewayService on the HTTP worker thread, with the same checks, dispatch and metrics as
// gRPC. Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}}, and
// status: 400 bad input, 404 unknown model, 413 body too large, 429 overloaded, 503 nothing
// can serve now (or draining), 504 past a deadline, 500 otherwise. A client that disconnects
// cancels its request through prefill and decode. docs/openai.md lists the fields.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/http/http_server.h"
#include "services/common/serving_metrics.h"
#include "services/router-gateway/chat_template.h"
#include "services/router-gateway/gateway_service.h"

namespace tandem::gateway {

class OpenAiApi {
 public:
  // `chat` is the model's chat template, or why it has none (chat requests then get 400 with
  // that reason). `gateway` and `metrics` must outlive the routes.
  OpenAiApi(GatewayService* gateway, absl::StatusOr<ChatTemplate> chat,
            serving::GatewayMetrics* metrics);

  std::vector<http::Route> Routes();

  // New requests get 503; running ones get `deadline` to finish, then are cancelled (and
  // given 5 s more to wind down).
  void Drain(absl::Duration deadline);

 private:
  void Completions(const http::Request& request, http::ResponseWriter* out, bool chat);
  http::Response Models() const;
  // Counts a running request for Drain; false while draining.
  bool Enter(DispatchCall* call);
  void Leave(DispatchCall* call);
  void Count(const std::string& path, int status);

  GatewayService* const gateway_;
  const absl::StatusOr<ChatTemplate> chat_;
  serving::GatewayMetrics* const metrics_;
  absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::set<DispatchCall*> running_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::gateway
