// The OpenAI front's request reader on what chat clients of published models send: tools,
// tool_choice, chat_template_kwargs, add_special_tokens, and generation_config.json's defaults.
#include "services/router-gateway/openai_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::gateway {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A ChatML template with Qwen-style tools and thinking, and Qwen3's generation defaults.
ModelFront Front() {
  ModelFront front;
  front.chat_template = chat::ChatTemplate::FromSources(
      {{"default",
        "{%- if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>\n"
        "{%- endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
        "{% elif open_think is defined %}<think>\n{% endif %}{% endif %}"}},
      {{"eos_token", "<|im_end|>"}});
  front.reasoning = chat::ReasoningFormat::kThink;
  front.tool_calls = chat::ToolCallFormat::kHermes;
  front.generation = *model::ParseGenerationConfig(
      R"({"eos_token_id": [151645, 151643], "temperature": 0.6, "top_k": 20, "top_p": 0.95,
          "max_new_tokens": 100, "stop_strings": ["STOP"]})");
  front.context = 4096;
  front.vocab_size = 151936;
  return front;
}

TEST(OpenAiRequestTest, ChatRendersToolsAndKwargsWithoutAddedSpecialTokens) {
  const ModelFront front = Front();
  auto parsed = ParseCompletionRequest(R"({"messages": [{"role": "user", "content": "Hi"}],
      "tools": [{"type": "function", "function": {"name": "get_weather",
                 "parameters": {"type": "object"}}}],
      "chat_template_kwargs": {"enable_thinking": false}})",
                                       /*chat=*/true, front);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->request.prompt(),
            "<tools>get_weather;</tools><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n");
  EXPECT_TRUE(parsed->request.has_add_special_tokens());
  EXPECT_FALSE(parsed->request.add_special_tokens());
  EXPECT_TRUE(parsed->parse_tool_calls);
  EXPECT_FALSE(parsed->prompt_opens_reasoning);
  // generation_config.json where the request is silent; its stop strings end chat replies.
  const v1::SamplingParams& s = parsed->request.sampling();
  EXPECT_FLOAT_EQ(s.temperature(), 0.6f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.95f);
  EXPECT_EQ(s.top_k(), 20);
  EXPECT_EQ(s.max_tokens(), 100);
  EXPECT_THAT(s.stop(), ElementsAre("STOP"));

  parsed = ParseCompletionRequest(
      R"({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"open_think": 1},
          "tool_choice": "none", "temperature": 0, "max_tokens": 7, "add_special_tokens": true})",
      true, front);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->prompt_opens_reasoning);
  EXPECT_FALSE(parsed->parse_tool_calls);
  EXPECT_TRUE(parsed->request.add_special_tokens());
  EXPECT_EQ(parsed->request.sampling().temperature(), 0);
  EXPECT_EQ(parsed->request.sampling().max_tokens(), 7);
}

TEST(OpenAiRequestTest, CompletionsKeepTheirDefaultsAndAddSpecialTokens) {
  auto parsed = ParseCompletionRequest(R"({"prompt": "Hello"})", false, Front());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->request.has_add_special_tokens());  // default: true
  EXPECT_EQ(parsed->request.sampling().max_tokens(), 16);
  EXPECT_TRUE(parsed->request.sampling().stop().empty());  // stop strings are chat's
  EXPECT_FLOAT_EQ(parsed->request.sampling().temperature(), 0.6f);
}

TEST(OpenAiRequestTest, OutputConstraintsInEveryForm) {
  const ModelFront front = Front();
  const auto structured = [&](const std::string& body, bool chat = false) {
    auto parsed = ParseCompletionRequest(body, chat, front);
    EXPECT_TRUE(parsed.ok()) << body << ": " << parsed.status();
    return parsed.ok() ? parsed->request.sampling().structured() : tandem::v1::StructuredOutput();
  };
  const std::string schema =
      R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}})";
  // Property order survives (it is the order of the output's members).
  EXPECT_EQ(structured(absl::StrCat(R"({"prompt": "x", "response_format": {"type": "json_schema",
      "json_schema": {"name": "r", "strict": true, "schema": )",
                                    schema, "}}}"))
                .json_schema(),
            schema);
  EXPECT_EQ(
      structured(absl::StrCat(R"({"prompt": "x", "guided_json": )", schema, "}")).json_schema(),
      schema);
  EXPECT_EQ(structured(R"({"prompt": "x", "guided_json": "{\"type\": \"null\"}"})").json_schema(),
            R"({"type":"null"})");
  EXPECT_TRUE(
      structured(R"({"prompt": "x", "response_format": {"type": "json_object"}})").json_object());
  EXPECT_EQ(structured(R"({"prompt": "x", "structured_outputs": {"regex": "a+"}})").regex(), "a+");
  EXPECT_EQ(structured(R"({"prompt": "x", "guided_choice": ["p", "q"]})").choice().choices_size(),
            2);
  EXPECT_EQ(structured(R"({"prompt": "x", "response_format": {"type": "text"}})").kind_case(),
            tandem::v1::StructuredOutput::KIND_NOT_SET);
  // Tools: a named function's parameters; "required" an array of calls.
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
      "$defs": {"n": {"type": "integer"}}}}}])";
  auto named = ParseCompletionRequest(
      absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", tools,
                   R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})"),
      true, front);
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->forced_tools.kind, chat::ForcedToolCalls::Kind::kNamed);
  EXPECT_EQ(named->forced_tools.name, "f");
  auto required =
      ParseCompletionRequest(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )",
                                          tools, R"(, "tool_choice": "required"})"),
                             true, front);
  ASSERT_TRUE(required.ok()) << required.status();
  EXPECT_EQ(required->forced_tools.kind, chat::ForcedToolCalls::Kind::kRequired);
  // The parameters' references now point into the array schema.
  EXPECT_THAT(required->request.sampling().structured().json_schema(),
              HasSubstr(R"("$ref":"#/items/anyOf/0/properties/parameters/$defs/n")"));
}

TEST(OpenAiRequestTest, BadChatFieldsNameThemselves) {
  const ModelFront front = Front();
  for (const auto& [body, param, says] :
       {std::tuple{R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})",
                   "tool_choice", "needs tools"},
        std::tuple{R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type":
                      "function", "function": {"name": "f"}}], "tool_choice": {"type": "function",
                      "function": {"name": "g"}}})",
                   "tool_choice", "not among the tools"},
        std::tuple{R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type":
                      "function", "function": {"name": "f"}}], "tool_choice": "required",
                      "response_format": {"type": "json_object"}})",
                   "response_format", "cannot be combined"},
        std::tuple{R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type":
                      "function", "function": {"name": "f", "parameters": {"type": "object",
                      "properties": {"a": {"not": {}}}}}}], "tool_choice": "required"})",
                   "tools", "keyword \"not\""},
        std::tuple{R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": 3})",
                   "tool_choice", "tool_choice"},
        std::tuple{
            R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {}}]})",
            "tools", "tools[0].function.name"},
        std::tuple{R"({"messages": [{"role": "user", "content": "x"}],
                      "chat_template_kwargs": {"messages": []}})",
                   "chat_template_kwargs", "may not set"},
        std::tuple{R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 1})",
                   "chat_template_kwargs", "must be an object"},
        std::tuple{R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
                   "messages", "only \"text\" parts"},
        std::tuple{R"({"messages": []})", "messages", "non-empty"}}) {
    auto parsed = ParseCompletionRequest(body, true, front);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_EQ(ParamOf(parsed.status()), param) << body;
    EXPECT_THAT(parsed.status().message(), HasSubstr(says)) << body;
  }
  // A model without a template says so.
  ModelFront none;
  none.context = 512;
  none.vocab_size = 100;
  auto parsed =
      ParseCompletionRequest(R"({"messages": [{"role": "user", "content": "x"}]})", true, none);
  EXPECT_THAT(parsed.status().message(), HasSubstr("no chat template"));
}

TEST(OpenAiRequestTest, TokenizeAndDetokenizeBodies) {
  const ModelFront front = Front();
  auto prompt = ParseTokenizeRequest(R"({"prompt": "Hi", "add_special_tokens": false})", front);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(prompt->text, "Hi");
  EXPECT_FALSE(prompt->add_special_tokens);
  auto chat = ParseTokenizeRequest(
      R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "return_token_strs": true})",
      front);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->model, "m");
  EXPECT_EQ(chat->text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_FALSE(chat->add_special_tokens);
  EXPECT_TRUE(chat->return_token_strs);
  EXPECT_EQ(ParamOf(ParseTokenizeRequest(R"({"prompt": 3})", front).status()), "prompt");

  auto ids = ParseDetokenizeRequest(R"({"tokens": [1, 2, 3]})", 10);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(ids->tokens, ElementsAre(1, 2, 3));
  EXPECT_THAT(ParseDetokenizeRequest(R"({"tokens": [10]})", 10).status().message(),
              HasSubstr("outside the vocabulary"));
  EXPECT_EQ(ParamOf(ParseDetokenizeRequest(R"({"tokens": "x"})", 10).status()), "tokens");
  EXPECT_TRUE(ParseDetokenizeRequest(R"({"tokens": []})", 10).ok());
}

}  // namespace
}  // namespace tandem::gateway
