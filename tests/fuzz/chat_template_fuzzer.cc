// A model's chat_template.json as the gateway loads it (gateway::ChatTemplate::Load) and the
// prompt it renders for arbitrary messages (Apply), as /v1/chat/completions does.
// Input: the template, a NUL byte, then messages as NUL-separated role, content, role, ...
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "services/router-gateway/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

namespace tandem::gateway {
namespace {

struct State {
  fuzz::MemFile file;
  fuzz::TempDir dir;  // holds chat_template.json -> the memory file

  State() { std::filesystem::create_symlink(file.path(), dir.path() / "chat_template.json"); }
};

std::vector<std::string_view> Split(std::string_view s) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t end = s.find('\0', start);
    parts.push_back(s.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

}  // namespace
}  // namespace tandem::gateway

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::gateway;
  static State* state = new State();
  const std::vector<std::string_view> parts = Split(tandem::fuzz::AsText(data, size));
  state->file.Write(reinterpret_cast<const uint8_t*>(parts[0].data()), parts[0].size());
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::Load(state->dir.path().string());
  if (!chat.ok()) {
    FUZZ_CHECK(chat.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  for (const std::string& stop : chat->stop()) FUZZ_CHECK(!stop.empty());
  // A template that loaded is a JSON object whose "roles" object names the roles it renders.
  const nlohmann::json doc = nlohmann::json::parse(parts[0], nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(doc.is_object() && doc.contains("roles") && doc["roles"].is_object());

  std::vector<ChatMessage> messages;
  bool known_roles = true;
  for (size_t i = 1; i + 1 < parts.size(); i += 2) {
    messages.push_back({std::string(parts[i]), std::string(parts[i + 1])});
    known_roles &= doc["roles"].contains(messages.back().role);
  }
  absl::StatusOr<std::string> prompt = chat->Apply(messages);
  if (messages.empty() || !known_roles) {
    FUZZ_CHECK(prompt.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(prompt.ok());
  // Every message's content appears, in order.
  size_t at = 0;
  for (const ChatMessage& message : messages) {
    at = prompt->find(message.content, at);
    FUZZ_CHECK(at != std::string::npos);
    at += message.content.size();
  }
  return 0;
}
