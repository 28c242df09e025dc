#include "common/chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::chat {
namespace {

using nlohmann::ordered_json;
using ::testing::HasSubstr;

ordered_json Messages(std::initializer_list<std::pair<const char*, const char*>> list) {
  ordered_json out = ordered_json::array();
  for (const auto& [role, content] : list) out.push_back({{"role", role}, {"content", content}});
  return out;
}

void Write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

// The template of the model directory `dir` (opened again: files may have changed).
absl::StatusOr<ChatTemplate> Load(const std::string& dir, const std::string& override_path = "") {
  absl::StatusOr<std::unique_ptr<model::ModelDir>> opened = model::ModelDir::Open(dir);
  if (!opened.ok()) return opened.status();
  return ChatTemplate::Load(**opened, override_path);
}

TEST(ChatTemplateTest, TheShippedModelsWriteQuotedDialogue) {
  for (const char* model : {"/models/tiny-moe", "/models/tiny-fg-moe"}) {
    auto chat = ChatTemplate::Load(*testing::OpenModelDir(testing::SourceDir() + model));
    ASSERT_TRUE(chat.ok()) << chat.status();
    ChatInput input;
    input.messages = Messages({{"system", "Be brief."},
                               {"user", "Where did you go?"},
                               {"assistant", "Home"},
                               {"user", "Why"}});
    auto prompt = chat->Apply(input);
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    EXPECT_EQ(*prompt,
              "<s>Be brief.\n\n\"Where did you go?\" he asked.\n\"Home\" she said.\n\"Why\" he "
              "asked.\n\"");
    input.add_generation_prompt = false;
    EXPECT_FALSE(chat->Apply(input)->ends_with("\""));
    // An unknown role: the template's raise_exception, as a 400 naming it.
    input.messages = Messages({{"robot", "beep"}});
    auto refused = chat->Apply(input);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr("unknown message role 'robot'"));
  }
}

TEST(ChatTemplateTest, SourcesSpecialTokensAndNamedTemplates) {
  testing::TempDir dir;
  const std::filesystem::path d(dir.path());
  std::filesystem::copy_file(testing::SourceDir() + "/models/tiny-moe/config.json",
                             d / "config.json");
  // None at all: NOT_FOUND, saying where it looked.
  EXPECT_EQ(Load(dir.path()).status().code(), absl::StatusCode::kNotFound);
  Write(d / "tokenizer_config.json",
        R"({"bos_token": {"content": "<B>", "special": true}, "eos_token": "<E>",
            "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"},
                              {"name": "tool_use", "template": "{{ tools[0].function.name }}|{{ x }}"}]})");
  auto chat = Load(dir.path());
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_THAT(chat->names(), ::testing::ElementsAre("default", "tool_use"));
  ChatInput input;
  input.messages = Messages({{"user", "hi"}});
  EXPECT_EQ(*chat->Apply(input), "<B>hi<E>");
  input.tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  input.kwargs = {{"x", 7}};
  EXPECT_EQ(*chat->Apply(input), "f|7");
  // chat_template.jinja wins over tokenizer_config.json, and --chat_template over both.
  Write(d / "chat_template.jinja", "jinja:{{ messages | length }}");
  EXPECT_EQ(*Load(dir.path())->Apply(input), "jinja:1");
  Write(d / "override.jinja", "override");
  EXPECT_EQ(*Load(dir.path(), (d / "override.jinja").string())->Apply(input), "override");
  // A syntax error names the file and the line.
  Write(d / "chat_template.jinja", "ok\n{% for m in messages %}\n{% endif %}");
  auto bad = Load(dir.path());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("chat_template.jinja"));
  EXPECT_THAT(bad.status().message(), HasSubstr("line 3"));
}

TEST(ChatTemplateTest, ContinueFinalMessageCutsAfterItsContent) {
  auto chat = ChatTemplate::FromSources(
      {{"default",
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n"
        "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"}},
      ordered_json::object());
  ASSERT_TRUE(chat.ok()) << chat.status();
  ChatInput input;
  input.messages = Messages({{"user", "Say hi"}, {"assistant", "Hi, I am "}});
  input.add_generation_prompt = false;
  input.continue_final_message = true;
  EXPECT_EQ(*chat->Apply(input), "<user>Say hi</user>\n<assistant>Hi, I am");
  input.add_generation_prompt = true;
  EXPECT_EQ(chat->Apply(input).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, ARunawayTemplateIsStoppedAndSaysWhy) {
  auto chat = ChatTemplate::FromSources(
      {{"default",
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ messages[0].content }}"
        "{% endfor %}{% endfor %}"}},
      ordered_json::object());
  ASSERT_TRUE(chat.ok()) << chat.status();
  ChatInput input;
  input.messages = Messages({{"user", "xxxxxxxxxxxxxxxx"}});
  const absl::Status status = chat->Apply(input).status();
  EXPECT_TRUE(status.code() == absl::StatusCode::kResourceExhausted ||
              status.code() == absl::StatusCode::kDeadlineExceeded)
      << status;
}

TEST(ChatTemplateTest, MessagesAreNormalisedAsVllmDoes) {
  auto messages = NormalizeMessages(ordered_json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [2]}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "42"}])"));
  ASSERT_TRUE(messages.ok()) << messages.status();
  EXPECT_EQ((*messages)[0]["content"], "a\nb");
  // Arguments as an object, keys in the order they were written.
  EXPECT_EQ((*messages)[1]["tool_calls"][0]["function"]["arguments"].dump(), R"({"z":1,"a":[2]})");
  EXPECT_EQ((*messages)[2]["tool_call_id"], "call_1");

  for (const auto& [bad, named] :
       {std::pair{R"([{"role": "user", "content": [{"type": "image_url"}]}])",
                  "messages[0].content[0]"},
        std::pair{R"([{"content": "x"}])", "messages[0].role"},
        std::pair{R"([{"role": "user", "content": 3}])", "messages[0].content"},
        std::pair{R"([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])",
                  "messages[0].tool_calls[0].function.name"},
        std::pair{R"([])", "messages"}}) {
    auto refused = NormalizeMessages(ordered_json::parse(bad));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr(named)) << bad;
  }
  EXPECT_TRUE(ValidateTools(ordered_json::parse(
                                R"([{"type": "function", "function": {"name": "f",
                                     "parameters": {"type": "object"}}}])"))
                  .ok());
  EXPECT_THAT(
      ValidateTools(ordered_json::parse(R"([{"type": "function", "function": {}}])")).message(),
      HasSubstr("tools[0].function.name"));
}

}  // namespace
}  // namespace tandem::chat
