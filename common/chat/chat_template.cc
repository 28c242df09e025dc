#include "common/chat/chat_template.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/hf_tokenizer.h"
#include "common/util/clock.h"
#include "common/util/file.h"

namespace tandem::chat {
namespace {

using nlohmann::ordered_json;

// Templates and tokenizer configs are small; anything larger is not one.
constexpr size_t kMaxFileBytes = 64 << 20;

absl::Status Invalid(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, " ", what));
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromSources(std::vector<Named> templates,
                                                       ordered_json special_tokens) {
  if (templates.empty()) return absl::NotFoundError("the model has no chat template");
  ChatTemplate chat;
  for (Named& t : templates) {
    absl::StatusOr<JinjaTemplate> jinja = JinjaTemplate::Parse(t.source);
    if (!jinja.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template '", t.name, "': ", jinja.status().message()));
    }
    chat.templates_.push_back(std::make_shared<const Compiled>(
        Compiled{std::move(t.name), std::move(t.source), *std::move(jinja)}));
  }
  chat.special_tokens_ =
      special_tokens.is_object() ? std::move(special_tokens) : ordered_json::object();
  return chat;
}

absl::StatusOr<ChatTemplate> ChatTemplate::Load(const model::ModelDir& dir,
                                                const std::string& override_path) {
  ordered_json special = ordered_json::object();
  const model::TokenizerConfig& tokens = dir.tokenizer_config();
  for (const auto& [key, token] :
       {std::pair{"bos_token", &tokens.bos_token}, std::pair{"eos_token", &tokens.eos_token},
        std::pair{"unk_token", &tokens.unk_token}, std::pair{"pad_token", &tokens.pad_token}}) {
    if (token->has_value()) special[key] = **token;
  }
  const ordered_json& from_config = dir.chat_template_config();
  const std::string config_path = dir.tokenizer_config_path();

  std::vector<Named> templates;
  std::string origin;
  if (!override_path.empty()) {
    absl::StatusOr<std::string> source = util::ReadFile(override_path, kMaxFileBytes);
    if (!source.ok()) return absl::InvalidArgumentError(source.status().message());
    templates.push_back({"default", *std::move(source)});
    origin = override_path;
  } else if (dir.chat_template_file().has_value()) {
    templates.push_back({"default", *dir.chat_template_file()});
    origin = dir.chat_template_origin();
  } else if (from_config.is_string()) {
    templates.push_back({"default", from_config.get<std::string>()});
    origin = config_path;
  } else if (from_config.is_array()) {
    origin = config_path;
    for (size_t i = 0; i < from_config.size(); ++i) {
      const ordered_json& entry = from_config[i];
      const std::string where = absl::StrCat(origin, ": chat_template[", i, "]");
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
          !entry.contains("template") || !entry["template"].is_string()) {
        return Invalid(where, "must be {\"name\": string, \"template\": string}");
      }
      templates.push_back({entry["name"].get<std::string>(), entry["template"].get<std::string>()});
    }
  } else if (!from_config.is_null()) {
    return Invalid(absl::StrCat(origin.empty() ? config_path : origin, ": chat_template"),
                   "must be a string or a list of {\"name\", \"template\"}");
  }
  if (templates.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "the model has no chat template (no chat_template.jinja, and no chat_template in ",
        config_path, "); give one with --chat_template"));
  }
  absl::StatusOr<ChatTemplate> chat = FromSources(std::move(templates), std::move(special));
  if (!chat.ok()) {
    return absl::Status(chat.status().code(), absl::StrCat(origin, ": ", chat.status().message()));
  }
  return chat;
}

std::vector<std::string> ChatTemplate::names() const {
  std::vector<std::string> out;
  for (const auto& t : templates_) out.push_back(t->name);
  return out;
}

std::string ChatTemplate::source() const {
  std::string out;
  for (const auto& t : templates_) absl::StrAppend(&out, t->source, "\n");
  return out;
}

absl::StatusOr<std::string> ChatTemplate::Apply(const ChatInput& input,
                                                absl::Duration deadline) const {
  if (!input.messages.is_array() || input.messages.empty()) {
    return absl::InvalidArgumentError("messages must be a non-empty list");
  }
  if (input.continue_final_message && input.add_generation_prompt) {
    return absl::InvalidArgumentError(
        "continue_final_message and add_generation_prompt cannot both be true");
  }
  // transformers' choice: "tool_use" for a request with tools where the model has one, else
  // "default", else the only template.
  const bool has_tools = input.tools.is_array() && !input.tools.empty();
  const Compiled* chosen = nullptr;
  for (const auto& t : templates_) {
    if (has_tools && t->name == "tool_use") chosen = t.get();
  }
  for (const auto& t : templates_) {
    if (chosen == nullptr && t->name == "default") chosen = t.get();
  }
  if (chosen == nullptr && templates_.size() == 1) chosen = templates_.front().get();
  if (chosen == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's chat templates (", absl::StrJoin(names(), ", "), ") include no \"default\""));
  }

  ordered_json context = special_tokens_;
  context["messages"] = input.messages;
  context["tools"] = input.tools;
  context["documents"] = input.documents;
  context["add_generation_prompt"] = input.add_generation_prompt;
  // transformers passes tools=None and documents=None when a request has none (defined, but
  // None), which templates test with `if tools` or `tools is not none`.
  for (const auto& [key, value] : input.kwargs.items()) context[key] = value;

  RenderLimits limits;
  limits.deadline = util::Instant::Now() + deadline;
  limits.max_output_bytes = 8 << 20;
  absl::StatusOr<std::string> prompt = chosen->jinja.Render(context, limits);
  if (!prompt.ok()) {
    return absl::Status(prompt.status().code(),
                        absl::StrCat("chat template: ", prompt.status().message()));
  }
  if (!input.continue_final_message) return prompt;

  // Continue the last message: cut the rendering right after the last occurrence of its
  // content, stripped, as transformers does (what the template adds after it goes).
  const ordered_json& last = input.messages.back();
  std::string content;
  if (last.is_object() && last.contains("content") && last["content"].is_string()) {
    content = last["content"].get<std::string>();
  }
  const std::string trimmed(absl::StripAsciiWhitespace(content));
  const size_t at = trimmed.empty() ? std::string::npos : prompt->rfind(trimmed);
  if (at == std::string::npos) {
    return absl::InvalidArgumentError(
        "continue_final_message: the final message's content is not in the rendered prompt");
  }
  prompt->resize(at + trimmed.size());
  return prompt;
}

absl::StatusOr<ordered_json> NormalizeMessages(const ordered_json& messages) {
  if (!messages.is_array() || messages.empty()) {
    return Invalid("messages", "must be a non-empty list");
  }
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& m = messages[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Invalid(where, "is not an object");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return Invalid(where + ".role", "must be a string");
    ordered_json message = m;
    if (const auto content = m.find("content"); content != m.end()) {
      if (content->is_array()) {
        // vLLM's "string" content format: text parts joined by newlines.
        std::vector<std::string> texts;
        for (size_t p = 0; p < content->size(); ++p) {
          const ordered_json& part = (*content)[p];
          const std::string part_where = absl::StrCat(where, ".content[", p, "]");
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
            return Invalid(part_where, "must be an object with a \"type\"");
          }
          if (part["type"] != "text") {
            return Invalid(part_where, absl::StrCat("has type \"", part["type"].get<std::string>(),
                                                    "\": only \"text\" parts are supported"));
          }
          if (!part.contains("text") || !part["text"].is_string()) {
            return Invalid(part_where + ".text", "must be a string");
          }
          texts.push_back(part["text"].get<std::string>());
        }
        message["content"] = absl::StrJoin(texts, "\n");
      } else if (!content->is_string() && !content->is_null()) {
        return Invalid(where + ".content", "must be a string, a list of parts, or null");
      }
    }
    if (const auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (!calls->is_array()) return Invalid(where + ".tool_calls", "must be a list");
      for (size_t c = 0; c < calls->size(); ++c) {
        const std::string call_where = absl::StrCat(where, ".tool_calls[", c, "]");
        ordered_json& call = message["tool_calls"][c];
        if (!call.is_object()) return Invalid(call_where, "is not an object");
        const auto function = call.find("function");
        if (function == call.end() || !function->is_object()) {
          return Invalid(call_where + ".function", "must be an object");
        }
        const auto name = function->find("name");
        if (name == function->end() || !name->is_string()) {
          return Invalid(call_where + ".function.name", "must be a string");
        }
        const auto arguments = function->find("arguments");
        if (arguments != function->end() && arguments->is_string()) {
          // Templates print arguments with tojson: as vLLM does, give them the object.
          ordered_json parsed = ordered_json::parse(arguments->get<std::string>(), nullptr,
                                                    /*allow_exceptions=*/false);
          if (!parsed.is_discarded() && parsed.is_object()) *arguments = std::move(parsed);
        } else if (arguments != function->end() && !arguments->is_object()) {
          return Invalid(call_where + ".function.arguments", "must be a JSON string or an object");
        }
      }
    }
    out.push_back(std::move(message));
  }
  return out;
}

absl::Status ValidateTools(const ordered_json& tools) {
  if (!tools.is_array()) return Invalid("tools", "must be a list");
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& tool = tools[i];
    const std::string where = absl::StrCat("tools[", i, "]");
    if (!tool.is_object()) return Invalid(where, "is not an object");
    if (const auto type = tool.find("type");
        type != tool.end() && !(type->is_string() && *type == "function")) {
      return Invalid(where + ".type", "must be \"function\"");
    }
    const auto function = tool.find("function");
    if (function == tool.end() || !function->is_object()) {
      return Invalid(where + ".function", "must be an object");
    }
    const auto name = function->find("name");
    if (name == function->end() || !name->is_string() || name->get<std::string>().empty()) {
      return Invalid(where + ".function.name", "must be a non-empty string");
    }
    if (const auto params = function->find("parameters");
        params != function->end() && !params->is_object() && !params->is_null()) {
      return Invalid(where + ".function.parameters", "must be a JSON Schema object");
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::chat
