// Chat formatting for /v1/chat/completions: a model's chat_template.json turns a list of
// messages into one prompt. The format is Tandem's own, deliberately simple (no Jinja): each
// role has a prefix and a suffix around its content, and a generation prompt follows the last
// message. docs/openai.md documents it; models/tiny-moe/chat_template.json is an example.
//
//   {"roles": {"system":    {"prefix": "", "suffix": "\n\n"},
//              "user":      {"prefix": "\"", "suffix": "\" he asked.\n"},
//              "assistant": {"prefix": "\"", "suffix": "\" she said.\n"}},
//    "generation_prompt": "\"",
//    "stop": ["\""]}
//
// "stop" (optional) lists strings that end a chat reply, added to the request's own.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::gateway {

struct ChatMessage {
  std::string role;
  std::string content;
};

class ChatTemplate {
 public:
  // Parses a chat_template.json document; INVALID_ARGUMENT says what is wrong with it.
  static absl::StatusOr<ChatTemplate> Parse(const std::string& json);
  // Reads DIR/chat_template.json: NOT_FOUND when the model has none.
  static absl::StatusOr<ChatTemplate> Load(const std::string& model_dir);

  // The prompt for `messages`: INVALID_ARGUMENT for no messages or a role the template lacks.
  absl::StatusOr<std::string> Apply(const std::vector<ChatMessage>& messages) const;
  const std::vector<std::string>& stop() const { return stop_; }

 private:
  struct Role {
    std::string prefix, suffix;
  };
  std::map<std::string, Role> roles_;
  std::string generation_prompt_;
  std::vector<std::string> stop_;
};

}  // namespace tandem::gateway
