// A model's chat template as the OpenAI front loads it (model::ModelDir::Open reads
// tokenizer_config.json, chat::ChatTemplate::Load its Jinja source and special tokens) and the
// prompt it renders for
// arbitrary messages (Apply), as /v1/chat/completions does. Loading either succeeds or says
// what is wrong; rendering either succeeds or fails with a status, within its deadline.
// Input: tokenizer_config.json, a NUL byte, then messages as NUL-separated role, content, ...
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/chat/chat_template.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

namespace tandem::chat {
namespace {

struct State {
  fuzz::MemFile file;
  fuzz::TempDir dir;  // holds tokenizer_config.json -> the memory file, and the tiny config.json

  State() {
    std::filesystem::create_symlink(file.path(), dir.path() / "tokenizer_config.json");
    std::filesystem::create_symlink(fuzz::TinyModelDir() + "/config.json",
                                    dir.path() / "config.json");
  }
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
}  // namespace tandem::chat

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::chat;
  static State* state = new State();
  const std::vector<std::string_view> parts = Split(tandem::fuzz::AsText(data, size));
  state->file.Write(reinterpret_cast<const uint8_t*>(parts[0].data()), parts[0].size());
  absl::StatusOr<std::unique_ptr<tandem::model::ModelDir>> model =
      tandem::model::ModelDir::Open(state->dir.path().string());
  absl::StatusOr<ChatTemplate> chat =
      model.ok() ? ChatTemplate::Load(**model) : absl::StatusOr<ChatTemplate>(model.status());
  if (!chat.ok()) {
    FUZZ_CHECK(chat.status().code() == absl::StatusCode::kInvalidArgument ||
               chat.status().code() == absl::StatusCode::kNotFound);
    FUZZ_CHECK(!chat.status().message().empty());
    return 0;
  }
  ChatInput input;
  for (size_t i = 1; i + 1 < parts.size(); i += 2) {
    input.messages.push_back(
        {{"role", std::string(parts[i])}, {"content", std::string(parts[i + 1])}});
  }
  absl::StatusOr<std::string> prompt = chat->Apply(input, absl::Milliseconds(200));
  if (input.messages.empty()) {
    FUZZ_CHECK(prompt.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  if (!prompt.ok()) {
    const absl::StatusCode code = prompt.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument ||
               code == absl::StatusCode::kResourceExhausted ||
               code == absl::StatusCode::kDeadlineExceeded);
  }
  return 0;
}
