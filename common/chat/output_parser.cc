#include "common/chat/output_parser.h"

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

// The length of the longest suffix of `text` that is a proper prefix of `tag`: text that may
// still become the tag, held until more arrives.
size_t PartialTagSuffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

bool IsSpace(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return absl::ascii_isspace(static_cast<unsigned char>(c)); });
}

std::string CallId() {
  static thread_local absl::BitGen gen;
  return absl::StrFormat("call_%016x%08x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint32_t>(gen));
}

}  // namespace

absl::StatusOr<ReasoningFormat> ParseReasoningFormat(std::string_view name) {
  if (name == "none") return ReasoningFormat::kNone;
  if (name == "think") return ReasoningFormat::kThink;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown reasoning parser '", std::string(name), "' (known: none, think)"));
}

absl::StatusOr<ToolCallFormat> ParseToolCallFormat(std::string_view name) {
  if (name == "none") return ToolCallFormat::kNone;
  if (name == "hermes") return ToolCallFormat::kHermes;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tool call parser '", std::string(name), "' (known: none, hermes)"));
}

ReasoningFormat ReasoningFormatOf(std::string_view source) {
  return source.find(kThinkOpen) != std::string_view::npos ? ReasoningFormat::kThink
                                                           : ReasoningFormat::kNone;
}

ToolCallFormat ToolCallFormatOf(std::string_view source) {
  return source.find(kCallOpen) != std::string_view::npos ? ToolCallFormat::kHermes
                                                          : ToolCallFormat::kNone;
}

void ChatDelta::Append(ChatDelta other) {
  reasoning += other.reasoning;
  content += other.content;
  for (ToolCall& call : other.tool_calls) tool_calls.push_back(std::move(call));
}

ChatOutputParser::ChatOutputParser(ReasoningFormat reasoning, ToolCallFormat tool_calls, bool tools,
                                   bool prompt_opens_reasoning, ForcedToolCalls forced)
    : reasoning_(reasoning),
      tool_calls_(tool_calls),
      forced_(std::move(forced)),
      tools_(tools && tool_calls != ToolCallFormat::kNone),
      state_(reasoning == ReasoningFormat::kNone ? State::kContent
             : prompt_opens_reasoning            ? State::kReasoning
                                                 : State::kStart) {}

bool ChatOutputParser::PromptOpensReasoning(ReasoningFormat reasoning, std::string_view prompt) {
  if (reasoning == ReasoningFormat::kNone) return false;
  const size_t open = prompt.rfind(kThinkOpen);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt.rfind(kThinkClose);
  if (close != std::string_view::npos && close > open) return false;
  return IsSpace(prompt.substr(open + kThinkOpen.size()));
}

ChatDelta ChatOutputParser::Add(std::string_view text) {
  ChatDelta out;
  pending_.append(text);
  if (forced_.kind == ForcedToolCalls::Kind::kNone) Run(/*final=*/false, &out);
  return out;
}

void ChatOutputParser::FinishForced(ChatDelta* out) {
  using nlohmann::json;
  const json parsed = json::parse(pending_, nullptr, /*allow_exceptions=*/false);
  const auto arguments = [](const json& v) {
    return v.dump(-1, ' ', false, json::error_handler_t::replace);
  };
  std::vector<ToolCall> calls;
  if (forced_.kind == ForcedToolCalls::Kind::kNamed && parsed.is_object()) {
    calls.push_back({.index = 0, .id = "", .name = forced_.name, .arguments = arguments(parsed)});
  } else if (forced_.kind == ForcedToolCalls::Kind::kRequired && parsed.is_array()) {
    for (const json& call : parsed) {
      if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) {
        calls.clear();
        break;
      }
      calls.push_back({.index = 0,
                       .id = "",
                       .name = call["name"].get<std::string>(),
                       .arguments = arguments(call.value("parameters", json::object()))});
    }
  }
  if (calls.empty()) {
    out->content = std::move(pending_);  // not calls (cut short by max_tokens): shown as it is
  } else {
    for (ToolCall& call : calls) {
      call.index = next_index_++;
      call.id = CallId();
      out->tool_calls.push_back(std::move(call));
    }
  }
  pending_.clear();
}

ChatDelta ChatOutputParser::Finish() {
  ChatDelta out;
  if (forced_.kind != ForcedToolCalls::Kind::kNone) {
    FinishForced(&out);
    return out;
  }
  Run(/*final=*/true, &out);
  // Trailing whitespace is the reply's, unless a tool call came before it.
  if (!after_call_) out.content += space_;
  space_.clear();
  return out;
}

void ChatOutputParser::EmitContent(std::string_view text, ChatDelta* out) {
  if (!tools_) {
    out->content.append(text);
    return;
  }
  // Whitespace at the end is held: a tool call may follow it (then it is dropped).
  space_.append(text);
  const size_t last = space_.find_last_not_of(" \t\r\n");
  if (last == std::string::npos) return;
  // After a tool call, the whitespace that separates it from this text is dropped too.
  const size_t first = after_call_ ? space_.find_first_not_of(" \t\r\n") : 0;
  out->content.append(space_, first, last + 1 - first);
  space_.erase(0, last + 1);
  after_call_ = false;
}

void ChatOutputParser::EndToolCall(bool closed, ChatDelta* out) {
  const std::string body(absl::StripAsciiWhitespace(call_));
  const nlohmann::json parsed = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  const bool valid = parsed.is_object() && parsed.contains("name") && parsed["name"].is_string() &&
                     (!parsed.contains("arguments") || parsed["arguments"].is_object() ||
                      parsed["arguments"].is_string());
  if (!valid) {
    // Not a call: the text it was stays in the content.
    EmitContent(std::string(kCallOpen) + call_ + std::string(closed ? kCallClose : ""), out);
    call_.clear();
    return;
  }
  ToolCall call;
  call.index = next_index_++;
  call.id = CallId();
  call.name = parsed["name"].get<std::string>();
  if (!parsed.contains("arguments")) {
    call.arguments = "{}";
  } else if (parsed["arguments"].is_string()) {
    call.arguments = parsed["arguments"].get<std::string>();
  } else {
    call.arguments =
        parsed["arguments"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  out->tool_calls.push_back(std::move(call));
  call_.clear();
  space_.clear();  // whitespace before the call
  after_call_ = true;
}

void ChatOutputParser::Run(bool final, ChatDelta* out) {
  while (true) {
    switch (state_) {
      case State::kStart: {
        if (pending_.starts_with(kThinkOpen)) {
          pending_.erase(0, kThinkOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!final && kThinkOpen.starts_with(pending_)) return;  // may still be <think>
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t close = pending_.find(kThinkClose);
        if (close != std::string::npos) {
          out->reasoning.append(pending_, 0, close);
          pending_.erase(0, close + kThinkClose.size());
          state_ = State::kContent;
          continue;
        }
        const size_t keep = final ? 0 : PartialTagSuffix(pending_, kThinkClose);
        out->reasoning.append(pending_, 0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case State::kContent: {
        if (!tools_) {
          EmitContent(pending_, out);
          pending_.clear();
          return;
        }
        const size_t open = pending_.find(kCallOpen);
        if (open != std::string::npos) {
          EmitContent(std::string_view(pending_).substr(0, open), out);
          space_.clear();  // whitespace right before a call
          pending_.erase(0, open + kCallOpen.size());
          call_.clear();
          state_ = State::kToolCall;
          continue;
        }
        const size_t keep = final ? 0 : PartialTagSuffix(pending_, kCallOpen);
        EmitContent(std::string_view(pending_).substr(0, pending_.size() - keep), out);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case State::kToolCall: {
        const size_t close = pending_.find(kCallClose);
        if (close != std::string::npos) {
          call_.append(pending_, 0, close);
          pending_.erase(0, close + kCallClose.size());
          EndToolCall(/*closed=*/true, out);
          state_ = State::kContent;
          continue;
        }
        const size_t keep = final ? 0 : PartialTagSuffix(pending_, kCallClose);
        call_.append(pending_, 0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        if (final) {
          EndToolCall(/*closed=*/false, out);  // the reply ended inside the block
          state_ = State::kContent;
        }
        return;
      }
    }
  }
}

}  // namespace tandem::chat
