// A model's chat template as Hugging Face publishes and applies it: Jinja source from the
// model directory, rendered over an OpenAI-style conversation with the variables
// transformers' apply_chat_template passes (messages, tools, documents,
// add_generation_prompt, the tokenizer's special tokens, and the request's
// chat_template_kwargs at top level). vLLM, SGLang and llama.cpp render the same way, so a
// prompt built here is byte-identical to theirs for the same template and conversation.
//
// Rendering is bounded (time, output bytes, steps; see RenderLimits): a template that raises
// (raise_exception), loops or grows without end is an INVALID_ARGUMENT or
// RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED that names the problem, never a hang. Immutable
// after Load, so one instance serves every request thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/chat/jinja.h"
#include "common/model/model_dir.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {

// What a conversation is rendered from. Messages and tools are the request's own JSON (key
// order kept), already checked by the caller (ValidateMessages).
struct ChatInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      // null when the request has none
  nlohmann::ordered_json documents;  // null when the request has none
  bool add_generation_prompt = true;
  // Render the last (assistant) message open, for the model to continue it; with this,
  // add_generation_prompt must be false (as in transformers).
  bool continue_final_message = false;
  // The request's chat_template_kwargs (e.g. {"enable_thinking": false}): top-level template
  // variables, over the special tokens.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // The template of the model in `dir`: `override_path` when given (--chat_template: a Jinja
  // file), else chat_template.jinja, else tokenizer_config.json's chat_template (a string, or a
  // list of {"name", "template"}: "default", and "tool_use" for requests with tools). Special
  // tokens (bos_token, eos_token, unk_token, pad_token) come from tokenizer_config.json, as
  // strings or {"content": ...} objects. NOT_FOUND when the model has no template;
  // INVALID_ARGUMENT naming the file and the problem (including a Jinja syntax error with its
  // line).
  static absl::StatusOr<ChatTemplate> Load(const model::ModelDir& dir,
                                           const std::string& override_path = "");

  // One named template ("default", "tool_use", ...) and its source.
  struct Named {
    std::string name;
    std::string source;
  };
  // From sources and special tokens ({"bos_token": "<s>", ...}); used by Load and tests.
  static absl::StatusOr<ChatTemplate> FromSources(std::vector<Named> templates,
                                                  nlohmann::ordered_json special_tokens);

  // The prompt text for `input` (special tokens written out as text, e.g. "<|im_start|>",
  // which the tokenizer maps to their ids). `deadline` bounds the rendering.
  absl::StatusOr<std::string> Apply(const ChatInput& input,
                                    absl::Duration deadline = absl::Seconds(1)) const;

  // Template names, for messages.
  std::vector<std::string> names() const;
  // Every template's source, joined: what tells which reply parsers the model needs.
  std::string source() const;

 private:
  struct Compiled {
    std::string name;
    std::string source;
    JinjaTemplate jinja;
  };
  ChatTemplate() = default;

  std::vector<std::shared_ptr<const Compiled>> templates_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

// Checks an OpenAI chat request's `messages` and normalises them the way vLLM does before
// rendering: content parts of type "text" joined by "\n" into a string; assistant tool calls'
// `function.arguments` given as a JSON string parsed into an object (templates print them with
// tojson); other keys (name, tool_call_id, reasoning_content) passed through. INVALID_ARGUMENT
// naming the message and field (e.g. "messages[2].tool_calls[0].function.name must be a
// string").
absl::StatusOr<nlohmann::ordered_json> NormalizeMessages(const nlohmann::ordered_json& messages);

// Checks OpenAI `tools` ([{"type": "function", "function": {"name", "description",
// "parameters"}}]); INVALID_ARGUMENT naming the entry.
absl::Status ValidateTools(const nlohmann::ordered_json& tools);

}  // namespace tandem::chat
