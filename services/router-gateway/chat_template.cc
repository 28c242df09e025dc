#include "services/router-gateway/chat_template.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace tandem::gateway {

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(const std::string& json) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return absl::InvalidArgumentError("chat template is not a JSON object");
  ChatTemplate chat;
  const auto roles = doc.find("roles");
  if (roles == doc.end() || !roles->is_object() || roles->empty()) {
    return absl::InvalidArgumentError("chat template needs a non-empty \"roles\" object");
  }
  for (const auto& [name, role] : roles->items()) {
    if (!role.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template role '", name, "' must be {\"prefix\", \"suffix\"}"));
    }
    Role& r = chat.roles_[name];
    for (const auto& [key, out] :
         {std::pair{"prefix", &r.prefix}, std::pair{"suffix", &r.suffix}}) {
      const auto field = role.find(key);
      if (field == role.end()) continue;
      if (!field->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("chat template role '", name, "': ", key, " must be a string"));
      }
      *out = field->get<std::string>();
    }
  }
  if (const auto prompt = doc.find("generation_prompt"); prompt != doc.end()) {
    if (!prompt->is_string()) {
      return absl::InvalidArgumentError("chat template generation_prompt must be a string");
    }
    chat.generation_prompt_ = prompt->get<std::string>();
  }
  if (const auto stop = doc.find("stop"); stop != doc.end()) {
    if (!stop->is_array()) return absl::InvalidArgumentError("chat template stop must be a list");
    for (const auto& s : *stop) {
      if (!s.is_string() || s.get<std::string>().empty()) {
        return absl::InvalidArgumentError("chat template stop entries must be non-empty strings");
      }
      chat.stop_.push_back(s.get<std::string>());
    }
  }
  return chat;
}

absl::StatusOr<ChatTemplate> ChatTemplate::Load(const std::string& model_dir) {
  const std::string path = model_dir + "/chat_template.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("the model has no chat template (", path, ")"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ChatTemplate> chat = Parse(text.str());
  if (!chat.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", chat.status().message()));
  return chat;
}

absl::StatusOr<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& messages) const {
  if (messages.empty()) return absl::InvalidArgumentError("messages is empty");
  std::string prompt;
  for (const ChatMessage& message : messages) {
    const auto role = roles_.find(message.role);
    if (role == roles_.end()) {
      std::vector<std::string> known;
      for (const auto& [name, unused] : roles_) known.push_back(name);
      return absl::InvalidArgumentError(absl::StrCat("unknown message role '", message.role,
                                                     "'; this model's chat template knows ",
                                                     absl::StrJoin(known, ", ")));
    }
    absl::StrAppend(&prompt, role->second.prefix, message.content, role->second.suffix);
  }
  absl::StrAppend(&prompt, generation_prompt_);
  return prompt;
}

}  // namespace tandem::gateway
