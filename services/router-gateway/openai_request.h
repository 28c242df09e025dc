// Reading an OpenAI completions or chat completions request body into the gateway's
// GenerateRequest. The body is the client's and may be anything: every field is read through
// type-checked accessors, so a wrong type, a value out of range, an unsupported field, bad
// JSON or JSON nested too deep is an INVALID_ARGUMENT that names the field (`param`), never an
// exception. docs/openai.md lists the fields.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/router-gateway/chat_template.h"
#include "tandem/v1/gateway.pb.h"

namespace tandem::gateway {

// JSON nested deeper than this (objects and arrays) is refused before it is parsed.
inline constexpr int kMaxJsonDepth = 64;

// Choices one request may ask for (n, best_of).
inline constexpr int kMaxChoices = 16;
// Alternatives per token (logprobs, top_logprobs), as vLLM's default limit.
inline constexpr int kMaxLogprobs = 20;

struct CompletionRequest {
  // One choice's generation; choice i of several runs it with seed + i when a seed is given.
  tandem::v1::GenerateRequest request;
  bool stream = false;
  bool include_usage = false;
  std::string model;
  int n = 1;          // choices returned
  int best_of = 1;    // choices generated, >= n; the n of highest cumulative log-probability return
  bool echo = false;  // completions: the prompt (and its log-probabilities) before the text
  // Alternatives shown per token, or -1 for no log-probabilities (completions: `logprobs`;
  // chat: `top_logprobs` once `logprobs` is true).
  int logprobs = -1;
};

// `chat`: /v1/chat/completions (messages through `chat_template`, or the reason there is
// none), else /v1/completions. `context`: the model's context length; `vocab_size`: its
// vocabulary's (logit_bias keys are token ids). An error names the request field it concerns
// in its message and in ParamOf.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(
    absl::string_view body, bool chat, const absl::StatusOr<ChatTemplate>& chat_template,
    int context, int vocab_size);

// The request field an error concerns (OpenAI's `param`), or empty.
std::string ParamOf(const absl::Status& status);
// `status` naming `param` as the field it concerns.
absl::Status WithParam(absl::Status status, absl::string_view param);

// The deepest nesting of objects and arrays in `json` text (strings skipped), stopping early
// once past `limit`.
int JsonDepth(absl::string_view json, int limit);

}  // namespace tandem::gateway
