// Reading an OpenAI completions or chat completions request body into the gateway's
// GenerateRequest. The body is the client's and may be anything: every field is read through
// type-checked accessors, so a wrong type, a value out of range, an unsupported field, bad
// JSON or JSON nested too deep is an INVALID_ARGUMENT that names the field (`param`), never an
// exception. docs/openai.md lists the fields.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/chat/chat_template.h"
#include "common/chat/output_parser.h"
#include "common/model/generation_config.h"
#include "tandem/v1/gateway.pb.h"

namespace tandem::gateway {

// JSON nested deeper than this (objects and arrays) is refused before it is parsed.
inline constexpr int kMaxJsonDepth = 64;

// Choices one request may ask for (n, best_of).
inline constexpr int kMaxChoices = 16;
// Alternatives per token (logprobs, top_logprobs), as vLLM's default limit.
inline constexpr int kMaxLogprobs = 20;

// What the OpenAI front knows of the model it serves.
struct ModelFront {
  // The chat template, or why there is none (chat requests then get 400 with the reason).
  absl::StatusOr<chat::ChatTemplate> chat_template =
      absl::NotFoundError("the model has no chat template");
  // How the model's replies carry reasoning and tool calls (chat/output_parser.h).
  chat::ReasoningFormat reasoning = chat::ReasoningFormat::kNone;
  chat::ToolCallFormat tool_calls = chat::ToolCallFormat::kNone;
  // generation_config.json: sampling defaults where a request is silent, chat stop strings.
  model::GenerationDefaults generation;
  int context = 0;     // tokens, prompt plus generated
  int vocab_size = 0;  // logit_bias keys are token ids
};

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
  // Chat: the reply's tool-call blocks are parsed (the request offered tools and did not say
  // tool_choice "none"), and whether the rendered prompt left reasoning open (<think>).
  bool parse_tool_calls = false;
  bool prompt_opens_reasoning = false;
  // Chat with tool_choice "required" or a named function: the reply is constrained to JSON
  // tool calls (sampling.structured holds their schema) and read back as calls.
  chat::ForcedToolCalls forced_tools;
};

// `chat`: /v1/chat/completions (messages, tools and chat_template_kwargs rendered by the
// model's chat template into a prompt tokenized without added special tokens, as vLLM's
// default), else /v1/completions. An error names the request field it concerns in its
// message and in ParamOf; a template that raises is a 400 with the template's message.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view body, bool chat,
                                                         const ModelFront& front);

// POST /tokenize (vLLM's shape): {"prompt": text, "add_special_tokens": true} or
// {"messages": [...], "add_generation_prompt", "continue_final_message", "tools",
//  "chat_template_kwargs", "add_special_tokens": false}; either may name the "model".
struct TokenizeInput {
  std::string model;
  std::string text;  // the prompt, or the rendered conversation
  bool add_special_tokens = true;
  bool return_token_strs = false;
};
absl::StatusOr<TokenizeInput> ParseTokenizeRequest(absl::string_view body, const ModelFront& front);
// POST /detokenize: {"tokens": [ids]}, each in [0, vocab_size).
struct DetokenizeInput {
  std::string model;
  std::vector<int32_t> tokens;
};
absl::StatusOr<DetokenizeInput> ParseDetokenizeRequest(absl::string_view body, int vocab_size);

// The request field an error concerns (OpenAI's `param`), or empty.
std::string ParamOf(const absl::Status& status);
// `status` naming `param` as the field it concerns.
absl::Status WithParam(absl::Status status, absl::string_view param);

// The deepest nesting of objects and arrays in `json` text (strings skipped), stopping early
// once past `limit`.
int JsonDepth(absl::string_view json, int limit);

}  // namespace tandem::gateway
