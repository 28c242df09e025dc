// Splits a chat reply's text, as it streams, into reasoning, content and tool calls:
//
//   reasoning   the text between <think> and </think> (OpenAI-compatible servers return it as
//               `reasoning_content`, vLLM's and DeepSeek's field). A reply starts in reasoning
//               when it opens with <think>, or when the prompt itself ended by opening one
//               (templates that put "<think>\n" in the generation prompt); a reply that never
//               closes it stays reasoning to its end.
//   tool calls  Hermes / Qwen blocks <tool_call>{"name": ..., "arguments": {...}}</tool_call>
//               in the content, when the request offered tools. Each block is parsed on its
//               own when it closes (or when the reply ends inside it); one that is not a JSON
//               object with a string "name" stays in the content as the text it was.
//               Whitespace between a tool call and what is next to it (text, another call, the
//               reply's start or end) is dropped; other text stays content.
//
// Streaming and whole replies are parsed by the same code: the concatenation of every Add's
// and Finish's output is the same whatever the text's split into pieces (so a streamed reply
// and an unstreamed one agree), and text that may still turn out to be a tag ("<thi") is held
// until it is known. One instance per reply; not thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::chat {

enum class ReasoningFormat { kNone, kThink };  // kThink: <think> ... </think>
enum class ToolCallFormat { kNone, kHermes };  // kHermes: <tool_call>{json}</tool_call>

// Names as flags spell them: "none", "think" / "none", "hermes".
absl::StatusOr<ReasoningFormat> ParseReasoningFormat(std::string_view name);
absl::StatusOr<ToolCallFormat> ParseToolCallFormat(std::string_view name);

// What a model's chat template implies, for servers whose flags say "auto": think when the
// template writes <think>, hermes when it writes <tool_call>.
ReasoningFormat ReasoningFormatOf(std::string_view template_source);
ToolCallFormat ToolCallFormatOf(std::string_view template_source);

struct ToolCall {
  int index = 0;
  std::string id;  // "call_" + 24 random hex digits
  std::string name;
  std::string arguments;  // JSON text of the arguments object
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void Append(ChatDelta other);
};

// A reply constrained to tool calls (tool_choice "required" or a named function, with the
// output held to the tools' schemas by constrained decoding): the whole reply is JSON, read
// when it ends. Named: the function's arguments object. Required: an array of
// {"name": ..., "parameters": {...}} objects, one call each (vLLM's form).
struct ForcedToolCalls {
  enum class Kind { kNone, kNamed, kRequired };
  Kind kind = Kind::kNone;
  std::string name;  // kNamed: the function
};

class ChatOutputParser {
 public:
  // `tools`: the request offered tools (and did not say tool_choice "none"), so tool-call
  // blocks are parsed. `prompt_opens_reasoning`: the prompt ended inside <think> (see
  // PromptOpensReasoning). `forced`: the reply is tool calls as JSON; it is held whole and
  // given as calls by Finish (as content instead, if it does not parse: a reply cut short).
  ChatOutputParser(ReasoningFormat reasoning, ToolCallFormat tool_calls, bool tools,
                   bool prompt_opens_reasoning, ForcedToolCalls forced = {});

  // The next piece of the reply; returns what is now known.
  ChatDelta Add(std::string_view text);
  // The reply has ended: what was held (an unclosed tool call is parsed as if closed).
  ChatDelta Finish();

  // Whether any tool call was returned (finish_reason "tool_calls").
  bool called_tools() const { return next_index_ > 0; }

  // Whether `prompt` ends by opening reasoning: its last tag is <think>, followed only by
  // whitespace.
  static bool PromptOpensReasoning(ReasoningFormat reasoning, std::string_view prompt);

 private:
  enum class State { kStart, kReasoning, kContent, kToolCall };

  // Consumes as much of pending_ as is decided.
  void Run(bool final, ChatDelta* out);
  void EmitContent(std::string_view text, ChatDelta* out);
  // The block in call_ has ended (`closed`: by its tag, else by the reply's end).
  void EndToolCall(bool closed, ChatDelta* out);

  // Finish for a forced reply: the calls pending_ holds.
  void FinishForced(ChatDelta* out);

  const ReasoningFormat reasoning_;
  const ToolCallFormat tool_calls_;
  const ForcedToolCalls forced_;
  const bool tools_;
  State state_;
  std::string pending_;      // text not yet decided
  std::string call_;         // the current tool call block's body
  std::string space_;        // content whitespace held until what follows it is known
  bool after_call_ = false;  // nothing but whitespace since the last tool call
  int next_index_ = 0;
};

}  // namespace tandem::chat
