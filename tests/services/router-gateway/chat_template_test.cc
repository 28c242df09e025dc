#include "services/router-gateway/chat_template.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "tests/testing/subprocess.h"

namespace tandem::gateway {
namespace {

TEST(ChatTemplateTest, WrapsEachMessageAndEndsWithTheGenerationPrompt) {
  auto chat = ChatTemplate::Parse(R"({"roles": {"system": {"suffix": "\n"},
                                                "user": {"prefix": "Q: ", "suffix": "\n"},
                                                "assistant": {"prefix": "A: ", "suffix": "\n"}},
                                      "generation_prompt": "A:", "stop": ["\nQ:"]})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  auto prompt = chat->Apply(
      {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Why?"}});
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(*prompt, "Be brief.\nQ: Hi\nA: Hello\nQ: Why?\nA:");
  EXPECT_EQ(chat->stop(), std::vector<std::string>{"\nQ:"});
}

TEST(ChatTemplateTest, RefusesUnknownRolesAndNoMessages) {
  auto chat = ChatTemplate::Parse(R"({"roles": {"user": {}}})");
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(*chat->Apply({{"user", "x"}}), "x");
  auto robot = chat->Apply({{"robot", "x"}});
  EXPECT_EQ(robot.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(robot.status().message(), "'robot'")) << robot.status();
  EXPECT_EQ(chat->Apply({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, BadTemplatesSayWhatIsWrong) {
  for (const char* bad : {"[]", "{}", R"({"roles": {}})", R"({"roles": {"user": 3}})",
                          R"({"roles": {"user": {"prefix": 1}}})",
                          R"({"roles": {"user": {}}, "generation_prompt": 2})",
                          R"({"roles": {"user": {}}, "stop": "x"})",
                          R"({"roles": {"user": {}}, "stop": [""]})", "not json"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(ChatTemplate::Parse(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(ChatTemplateTest, TheShippedModelHasOneAndOtherDirectoriesSayTheyHaveNone) {
  auto shipped = ChatTemplate::Load(testing::SourceDir() + "/models/tiny-moe");
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  EXPECT_EQ(*shipped->Apply({{"user", "Where to?"}}), "\"Where to?\" he asked.\n\"");
  EXPECT_EQ(ChatTemplate::Load(testing::SourceDir()).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::gateway
