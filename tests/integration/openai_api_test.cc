// The gateway's OpenAI-compatible HTTP front, through real processes: tandem-prefill,
// tandem-decode and tandem-gateway on ephemeral ports (tandem-serve for overload and drain).
// The official `openai` npm package (tests/openai/client.mjs, installed by scripts/setup.sh)
// drives completions and chat, streaming and not, and an error case; what it gets equals the
// gRPC SDK's answer to the same greedy request. Bad requests get OpenAI-shaped errors with
// the right status and leave the server serving; a client that disconnects cancels its
// request in the gateway and the decoder; overload answers 429 and draining 503.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <regex>
#include <set>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/chat/chat_template.h"
#include "common/http/client.h"
#include "common/http/http_server.h"
#include "common/model/generation_config.h"
#include "common/model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tandem/client.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

using nlohmann::json;
using testing::MetricValue;

constexpr char kPrompt[] = "The jury said it did find that";
constexpr char kChatMessage[] = "Where did you go last night";
constexpr int kMaxTokens = 12;

std::string Post(const std::string& path, const std::string& body) {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
                      "Content-Length: ", body.size(), "\r\n\r\n", body);
}

class OpenAiApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    set_ = new testing::ServiceSet();
    auto cluster = set_->StartCluster({}, {"--kv_blocks=160"});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    decode_ = cluster->decode;
    gateway_ = cluster->gateway;
  }
  static void TearDownTestSuite() {
    delete set_;
    set_ = nullptr;
  }

  static absl::StatusOr<http::ClientResponse> Call(const std::string& method,
                                                   const std::string& path,
                                                   const std::string& body = "") {
    return http::Fetch("127.0.0.1", gateway_.http_port, method, path, body, 30000);
  }

  // The gRPC SDK's greedy answer to `prompt` (a chat prompt holds its BOS already).
  static v1::GenerateResponse Sdk(const std::string& prompt,
                                  const std::vector<std::string>& stop = {},
                                  bool add_special_tokens = true) {
    auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", gateway_.grpc_port));
    EXPECT_TRUE(client.ok()) << client.status();
    v1::GenerateRequest request;
    request.set_prompt(prompt);
    request.set_add_special_tokens(add_special_tokens);
    request.mutable_sampling()->set_max_tokens(kMaxTokens);
    for (const std::string& s : stop) request.mutable_sampling()->add_stop(s);
    auto response = (*client)->Generate(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : v1::GenerateResponse();
  }

  static inline testing::ServiceSet* set_ = nullptr;
  static inline testing::Ports gateway_, decode_;
};

TEST_F(OpenAiApiTest, OfficialClientGetsWhatTheGrpcSdkGets) {
  const std::string dir = testing::SourceDir() + "/tests/openai";
  ASSERT_TRUE(std::filesystem::exists(dir + "/node_modules/openai"))
      << "the openai npm package is missing: run scripts/setup.sh";
  const auto [out, status] = testing::RunCommand(
      absl::StrCat("node ", dir, "/client.mjs http://127.0.0.1:", gateway_.http_port, "/v1 '",
                   kPrompt, "' ", kMaxTokens, " '", kChatMessage, "'"));
  ASSERT_EQ(status, 0) << out << set_->Log("tandem-gateway");
  const json got = json::parse(out, nullptr, false);
  ASSERT_TRUE(got.is_object()) << out;

  EXPECT_EQ(got["models"], json::array({"tiny-moe"}));
  const v1::GenerateResponse expected = Sdk(kPrompt);
  ASSERT_FALSE(expected.text().empty());
  EXPECT_EQ(got["completion"]["text"], expected.text());
  EXPECT_EQ(got["completion"]["finish_reason"], "length");
  EXPECT_EQ(got["completion"]["usage"]["prompt_tokens"], expected.usage().prompt_tokens());
  EXPECT_EQ(got["completion"]["usage"]["completion_tokens"], kMaxTokens);
  EXPECT_EQ(got["completion"]["usage"]["total_tokens"],
            expected.usage().prompt_tokens() + kMaxTokens);
  EXPECT_EQ(got["completion_stream"]["text"], expected.text());
  EXPECT_GT(got["completion_stream"]["chunks"].get<int>(), 1);  // streamed, not one piece
  EXPECT_EQ(got["completion_stream"]["finish_reason"], "length");
  EXPECT_EQ(got["completion_stream"]["usage"], got["completion"]["usage"]);

  // Chat: the same as the SDK given the template's prompt (BOS written by the template) and
  // the model's stop strings (generation_config.json).
  const std::string model_dir = testing::SourceDir() + "/models/tiny-moe";
  const std::unique_ptr<model::ModelDir> model = testing::OpenModelDir(model_dir);
  auto chat_template = chat::ChatTemplate::Load(*model);
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  chat::ChatInput input;
  input.messages.push_back({{"role", "user"}, {"content", kChatMessage}});
  auto chat_prompt = chat_template->Apply(input);
  ASSERT_TRUE(chat_prompt.ok()) << chat_prompt.status();
  const v1::GenerateResponse chat =
      Sdk(*chat_prompt, model->generation().stop_strings, /*add_special_tokens=*/false);
  EXPECT_EQ(got["chat"]["role"], "assistant");
  EXPECT_EQ(got["chat"]["content"], chat.text());
  EXPECT_EQ(got["chat"]["finish_reason"],
            chat.finish_reason() == v1::FINISH_REASON_STOP ? "stop" : "length");
  EXPECT_EQ(got["chat_stream"]["role"], "assistant");
  EXPECT_EQ(got["chat_stream"]["content"], chat.text());
  EXPECT_EQ(got["chat_stream"]["finish_reason"], got["chat"]["finish_reason"]);

  EXPECT_EQ(got["errors"]["unknown_model"]["status"], 404);
  EXPECT_EQ(got["errors"]["unknown_model"]["class"], "NotFoundError");
  EXPECT_TRUE(absl::StrContains(got["errors"]["unknown_model"]["message"].get<std::string>(),
                                "no-such-model"));
  EXPECT_EQ(got["errors"]["bad_temperature"]["status"], 400);
  EXPECT_EQ(got["errors"]["bad_temperature"]["class"], "BadRequestError");
  EXPECT_EQ(got["errors"]["bad_temperature"]["type"], "invalid_request_error");
  EXPECT_TRUE(absl::StrContains(got["errors"]["bad_temperature"]["message"].get<std::string>(),
                                "temperature"));
}

// Token ids repeated within `tokens` (each repeat counted).
int Repeats(const json& tokens) {
  std::set<std::string> seen;
  int repeats = 0;
  for (const json& t : tokens) repeats += !seen.insert(t.get<std::string>()).second;
  return repeats;
}

// Runs tests/openai/features.mjs against the gateway at `http_port` (its gRPC SDK at
// `grpc_port`) and checks every answer: log-probabilities against the gRPC SDK's and against
// echo scoring of the same tokens, echo, n with a seed, best_of, penalties, bias, errors.
void CheckFeatures(int http_port, int grpc_port, const std::string& log) {
  const std::string dir = testing::SourceDir() + "/tests/openai";
  ASSERT_TRUE(std::filesystem::exists(dir + "/node_modules/openai"))
      << "the openai npm package is missing: run scripts/setup.sh";
  auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", grpc_port));
  ASSERT_TRUE(client.ok()) << client.status();
  v1::GenerateRequest request;
  request.set_prompt(kPrompt);
  request.mutable_sampling()->set_max_tokens(kMaxTokens);
  request.mutable_sampling()->set_logprobs(3);
  request.mutable_sampling()->set_prompt_logprobs(1);
  auto sdk = (*client)->Generate(request);
  ASSERT_TRUE(sdk.ok()) << sdk.status();
  ASSERT_EQ(sdk->token_ids_size(), kMaxTokens);
  ASSERT_EQ(sdk->logprobs_size(), kMaxTokens);
  const int prompt_tokens = sdk->usage().prompt_tokens();
  ASSERT_EQ(sdk->prompt_logprobs_size(), prompt_tokens - 1);
  v1::TokenizeRequest tokenize;
  tokenize.set_text(kPrompt);
  auto tokens = (*client)->Tokenize(tokenize);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  json scored = json::array();
  for (int32_t id : tokens->token_ids()) scored.push_back(id);
  for (int32_t id : sdk->token_ids()) scored.push_back(id);
  ASSERT_EQ(scored.size(), static_cast<size_t>(prompt_tokens + kMaxTokens));

  const auto [out, status] = testing::RunCommand(
      absl::StrCat("node ", dir, "/features.mjs http://127.0.0.1:", http_port, "/v1 '", kPrompt,
                   "' ", kMaxTokens, " '", kChatMessage, "' '", scored.dump(), "'"));
  ASSERT_EQ(status, 0) << out << log;
  const json got = json::parse(out, nullptr, false);
  ASSERT_TRUE(got.is_object()) << out;

  // Completions: as many entries as tokens, the greedy token the likeliest of its top 3 (and
  // listed among them), offsets rising, the same as the gRPC SDK's, streamed or not.
  const json& lp = got["completion"]["logprobs"];
  EXPECT_EQ(got["completion"]["text"], sdk->text());
  ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(kMaxTokens)) << lp.dump();
  int last_offset = -1;
  for (int k = 0; k < kMaxTokens; ++k) {
    const double logprob = lp["token_logprobs"][k].get<double>();
    EXPECT_LE(logprob, 0.0);
    EXPECT_NEAR(logprob, sdk->logprobs(k).logprob(), 1e-4) << "token " << k;
    const json& top = lp["top_logprobs"][k];
    EXPECT_GE(top.size(), 3u);
    EXPECT_LE(top.size(), 4u);
    double best = -1e9;
    for (const auto& [text, value] : top.items()) best = std::max(best, value.get<double>());
    EXPECT_NEAR(best, logprob, 1e-6) << top.dump();
    EXPECT_TRUE(top.contains(lp["tokens"][k].get<std::string>()));
    EXPECT_GT(lp["text_offset"][k].get<int>(), last_offset);
    last_offset = lp["text_offset"][k].get<int>();
  }
  const json& streamed = got["completion_stream"];
  EXPECT_EQ(streamed["text"], got["completion"]["text"]);
  EXPECT_EQ(streamed["tokens"], lp["tokens"]);
  EXPECT_EQ(streamed["text_offset"], lp["text_offset"]);
  ASSERT_EQ(streamed["token_logprobs"].size(), lp["token_logprobs"].size());
  for (size_t k = 0; k < lp["token_logprobs"].size(); ++k) {
    EXPECT_NEAR(streamed["token_logprobs"][k].get<double>(), lp["token_logprobs"][k].get<double>(),
                1e-4);
  }

  // Echo scoring of the prompt and its continuation: the prompt's first token has none; the
  // rest are the prefill's log-softmax, which for the continuation equals what generation
  // reported (decode's, or the colocated engine's) within the engines' batch invariance.
  const json& echo = got["echo_scored"]["logprobs"];
  ASSERT_EQ(echo["tokens"].size(), scored.size()) << got["echo_scored"].dump();
  EXPECT_TRUE(echo["token_logprobs"][0].is_null());
  EXPECT_TRUE(echo["top_logprobs"][0].is_null());
  EXPECT_EQ(got["echo_scored"]["usage"]["prompt_tokens"], scored.size());
  EXPECT_EQ(got["echo_scored"]["usage"]["completion_tokens"], 0);
  for (int i = 1; i < prompt_tokens; ++i) {
    EXPECT_NEAR(echo["token_logprobs"][i].get<double>(), sdk->prompt_logprobs(i - 1).logprob(),
                1e-4)
        << "prompt token " << i;
  }
  double largest = 0;
  for (int k = 0; k < kMaxTokens; ++k) {
    const double scored_logprob = echo["token_logprobs"][prompt_tokens + k].get<double>();
    const double generated_logprob = lp["token_logprobs"][k].get<double>();
    EXPECT_NEAR(scored_logprob, generated_logprob, 2e-3) << "continuation token " << k;
    largest = std::max(largest, std::abs(scored_logprob - generated_logprob));
  }
  std::cout << "echo scoring vs generation: largest difference " << largest << " over "
            << kMaxTokens << " tokens\n";
  // Echo before a generation: the prompt, its tokens, then the new ones; streamed the same.
  const json& echo_gen = got["echo_generate"];
  EXPECT_TRUE(absl::StartsWith(echo_gen["text"].get<std::string>(), kPrompt)) << echo_gen.dump();
  EXPECT_EQ(echo_gen["logprobs"]["tokens"].size(), static_cast<size_t>(prompt_tokens + 4));
  EXPECT_TRUE(echo_gen["logprobs"]["token_logprobs"][0].is_null());
  EXPECT_EQ(echo_gen["usage"]["completion_tokens"], 4);
  EXPECT_EQ(got["echo_stream"]["text"], echo_gen["text"]);
  EXPECT_EQ(got["echo_stream"]["tokens"], echo_gen["logprobs"]["tokens"]);

  // Chat: an entry per token with its bytes and two alternatives, the likeliest first.
  const json& chat = got["chat"]["logprobs"];
  ASSERT_EQ(chat.size(), got["chat"]["completion_tokens"].get<size_t>());
  ASSERT_FALSE(chat.empty());
  for (const json& entry : chat) {
    EXPECT_LE(entry["logprob"].get<double>(), 0.0);
    ASSERT_EQ(entry["top_logprobs"].size(), 2u) << entry.dump();
    EXPECT_NEAR(entry["top_logprobs"][0]["logprob"].get<double>(), entry["logprob"].get<double>(),
                1e-6);
    EXPECT_EQ(entry["bytes"].size(), entry["token"].get<std::string>().size());
  }
  EXPECT_EQ(got["chat_stream"]["content"], got["chat"]["content"]);
  ASSERT_EQ(got["chat_stream"]["logprobs"].size(), chat.size());
  for (size_t k = 0; k < chat.size(); ++k) {
    EXPECT_EQ(got["chat_stream"]["logprobs"][k]["token"], chat[k]["token"]);
  }

  // n = 3 with a seed: three choices, the same on every run and streamed, not all alike.
  const json& n = got["n"];
  ASSERT_EQ(n["first"].size(), 3u);
  EXPECT_EQ(n["first"], n["second"]);
  EXPECT_EQ(n["first"][0][0], 0);
  EXPECT_EQ(n["first"][2][0], 2);
  EXPECT_FALSE(n["first"][0][1] == n["first"][1][1] && n["first"][1][1] == n["first"][2][1])
      << n.dump();
  EXPECT_EQ(n["usage"]["completion_tokens"], 3 * kMaxTokens);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got["n_stream"][i], n["first"][i][1]);
  EXPECT_EQ(got["chat_n"].size(), 3u);
  // The SDK's n: the same seeds, so the same three texts as the OpenAI front's.
  v1::GenerateRequest sampled;
  sampled.set_prompt(kPrompt);
  sampled.mutable_sampling()->set_max_tokens(kMaxTokens);
  sampled.mutable_sampling()->set_temperature(1.0f);
  sampled.mutable_sampling()->set_seed(1234);
  auto choices = (*client)->GenerateChoices(sampled, 3);
  ASSERT_TRUE(choices.ok()) << choices.status();
  ASSERT_EQ(choices->size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ((*choices)[i].text(), n["first"][i][1]) << i;
  EXPECT_EQ((*client)->GenerateChoices(sampled, 17).status().code(),
            absl::StatusCode::kInvalidArgument);
  // best_of 3: the one of highest cumulative log-probability of the three that n = 3 with the
  // same seed generates.
  ASSERT_EQ(got["best_of"]["choices"], 1);
  auto sum = [](const json& values) {
    double total = 0;
    for (const json& v : values) total += v.get<double>();
    return total;
  };
  double best = -1e9;
  for (const json& candidate : got["best_of_candidates"]) best = std::max(best, sum(candidate));
  EXPECT_NEAR(sum(got["best_of"]["logprobs"]["token_logprobs"]), best, 1e-3);

  // Penalties: greedy output changes, and repeats no more than without them; a banned token
  // is never chosen.
  const json& pen = got["penalties"];
  EXPECT_EQ(pen["none"]["text"], got["completion"]["text"]);
  for (const char* name : {"presence", "frequency", "repetition"}) {
    EXPECT_NE(pen[name]["text"], pen["none"]["text"]) << name;
    EXPECT_LE(Repeats(pen[name]["tokens"]), Repeats(pen["none"]["tokens"])) << name;
  }
  EXPECT_NE(pen["banned"]["tokens"][0], pen["none"]["tokens"][0]);

  for (const auto& [name, error] : got["errors"].items()) {
    EXPECT_EQ(error["status"], 400) << name << ": " << error.dump();
  }
}

TEST_F(OpenAiApiTest, LogprobsEchoNAndPenaltiesThroughTheOfficialClient) {
  CheckFeatures(gateway_.http_port, gateway_.grpc_port, set_->Log("tandem-gateway"));
}

TEST(OpenAiApiServeTest, LogprobsEchoNAndPenaltiesColocated) {
  testing::ServiceSet set;
  auto serve = set.Start("tandem-serve", {});
  ASSERT_TRUE(serve.ok()) << serve.status();
  CheckFeatures(serve->http_port, serve->grpc_port, set.Log("tandem-serve"));
}

// Structured outputs through a live front (`http_port`, `grpc_port`): response_format with a
// JSON Schema (chat, streamed and not), guided regex and choice (completions), tool_choice
// named and required (tool calls read back from the constrained JSON), and the gRPC form.
// Returns the greedy gRPC answer to a schema request, for comparing the two deployments.
std::string CheckStructured(int http_port, int grpc_port, const std::string& log) {
  const auto post = [&](const std::string& path, const json& body) {
    auto got = http::Fetch("127.0.0.1", http_port, "POST", path, body.dump(), 60000);
    EXPECT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got.ok() ? got->status : 0, 200) << (got.ok() ? got->body : "") << log;
    return got.ok() ? got->body : std::string();
  };
  const json schema = json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12},
      "count": {"type": "integer", "minimum": 0, "maximum": 99},
      "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
      "required": ["name", "count", "tags"]})");
  const auto check_record = [](const std::string& text) {
    const json v = json::parse(text, nullptr, false);
    ASSERT_TRUE(v.is_object()) << text;
    ASSERT_EQ(v.size(), 3u) << text;
    EXPECT_TRUE(v["name"].is_string() && v["name"].get<std::string>().size() <= 12) << text;
    EXPECT_TRUE(v["count"].is_number_integer() && v["count"] >= 0 && v["count"] <= 99) << text;
    ASSERT_TRUE(v["tags"].is_array() && v["tags"].size() <= 3) << text;
    for (const json& t : v["tags"]) EXPECT_TRUE(t == "a" || t == "b" || t == "c") << text;
  };
  json chat = {{"messages", {{{"role", "user"}, {"content", "Describe a jar of marbles."}}}},
               {"max_tokens", 120},
               {"temperature", 0}};
  chat["response_format"] = {
      {"type", "json_schema"},
      {"json_schema", {{"name", "record"}, {"schema", schema}, {"strict", true}}}};
  const json reply = json::parse(post("/v1/chat/completions", chat), nullptr, false);
  EXPECT_EQ(reply["choices"][0]["finish_reason"], "stop") << reply;
  check_record(reply["choices"][0]["message"]["content"].get<std::string>());
  // Streamed: the pieces make the same text.
  chat["stream"] = true;
  std::string streamed;
  const std::string events = post("/v1/chat/completions", chat);
  for (absl::string_view line : absl::StrSplit(events, '\n')) {
    if (!absl::StartsWith(line, "data: {")) continue;
    const json chunk = json::parse(line.substr(6));
    const json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string()) streamed += delta["content"];
  }
  EXPECT_EQ(streamed, reply["choices"][0]["message"]["content"]);

  // Completions with vLLM's guided regex and choice, sampled.
  const json regex =
      json::parse(post("/v1/completions", {{"prompt", "Call"},
                                           {"max_tokens", 30},
                                           {"temperature", 1},
                                           {"seed", 3},
                                           {"guided_regex", "[0-9]{3}-[a-z]{2,4}"}}));
  EXPECT_TRUE(std::regex_match(regex["choices"][0]["text"].get<std::string>(),
                               std::regex("[0-9]{3}-[a-z]{2,4}")))
      << regex;
  const json choice = json::parse(
      post("/v1/completions", {{"prompt", "Pick"},
                               {"max_tokens", 8},
                               {"structured_outputs", {{"choice", {"red", "green", "blue"}}}}}));
  const std::string picked = choice["choices"][0]["text"];
  EXPECT_TRUE(picked == "red" || picked == "green" || picked == "blue") << choice;
  EXPECT_EQ(choice["choices"][0]["finish_reason"], "stop") << choice;

  // Tools: a named function gets its arguments; "required" one call or more.
  const json tools = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10},
                       "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
        "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"]}}}])");
  json call = {{"messages", {{{"role", "user"}, {"content", "Weather in Oslo?"}}}},
               {"max_tokens", 80},
               {"temperature", 0},
               {"tools", tools}};
  call["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const json named = json::parse(post("/v1/chat/completions", call));
  const json& calls = named["choices"][0]["message"]["tool_calls"];
  EXPECT_EQ(named["choices"][0]["finish_reason"], "tool_calls") << named;
  if (calls.is_array() && calls.size() == 1) {
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    const json args = json::parse(calls[0]["function"]["arguments"].get<std::string>());
    EXPECT_TRUE(args["city"].is_string() && (args["unit"] == "c" || args["unit"] == "f")) << args;
  } else {
    ADD_FAILURE() << named;
  }
  call["tool_choice"] = "required";
  const json required = json::parse(post("/v1/chat/completions", call));
  const json& some = required["choices"][0]["message"]["tool_calls"];
  EXPECT_TRUE(some.is_array() && !some.empty()) << required;
  for (const json& c : some) {
    const std::string name = c["function"]["name"];
    EXPECT_TRUE(name == "get_weather" || name == "get_time") << required;
    EXPECT_TRUE(json::parse(c["function"]["arguments"].get<std::string>()).is_object());
  }

  // An unsupported keyword: 400 naming it, with OpenAI's error body.
  chat["stream"] = false;
  chat["response_format"]["json_schema"]["schema"]["properties"]["tags"]["uniqueItems"] = true;
  auto refused =
      http::Fetch("127.0.0.1", http_port, "POST", "/v1/chat/completions", chat.dump(), 30000);
  EXPECT_TRUE(refused.ok() && refused->status == 400 &&
              absl::StrContains(refused->body, "uniqueItems") &&
              json::parse(refused->body, nullptr, false)["error"]["param"] == "response_format")
      << (refused.ok() ? refused->body : "");

  // gRPC: SamplingParams.structured.
  auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", grpc_port));
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return "";
  v1::GenerateRequest request;
  request.set_prompt("A record:");
  request.mutable_sampling()->set_max_tokens(100);
  request.mutable_sampling()->mutable_structured()->set_json_schema(schema.dump());
  auto response = (*client)->Generate(request);
  EXPECT_TRUE(response.ok()) << response.status();
  if (!response.ok()) return "";
  check_record(response->text());
  request.mutable_sampling()->mutable_structured()->set_regex("(a");
  EXPECT_EQ((*client)->Generate(request).status().code(), absl::StatusCode::kInvalidArgument);
  return response->text();
}

TEST_F(OpenAiApiTest, StructuredOutputsDisaggregatedEqualColocated) {
  const std::string disaggregated =
      CheckStructured(gateway_.http_port, gateway_.grpc_port, set_->Log("tandem-gateway"));
  testing::ServiceSet set;
  auto serve = set.Start("tandem-serve", {});
  ASSERT_TRUE(serve.ok()) << serve.status();
  const std::string colocated =
      CheckStructured(serve->http_port, serve->grpc_port, set.Log("tandem-serve"));
  // Prefill drew the first token under the grammar and decode went on from its state: the same
  // greedy text as one process.
  EXPECT_FALSE(disaggregated.empty());
  EXPECT_EQ(disaggregated, colocated);
}

// lm-evaluation-harness's loglikelihood request (token ids, echo, logprobs, max_tokens 0) sums
// to what `tandem perplexity` scores for the same text: [BOS] + the line's tokens + EOS.
TEST_F(OpenAiApiTest, LoglikelihoodRequestEqualsTandemPerplexity) {
  const std::string text = "The jury said it did find that the city had been run well .";
  const std::string file = ::testing::TempDir() + "/loglikelihood.txt";
  const std::string result_file = ::testing::TempDir() + "/loglikelihood.json";
  {
    std::ofstream out(file);
    out << text << "\n";
  }
  const auto [printed, status] = testing::RunCommand(
      absl::StrCat(testing::BinDir(), "/tandem perplexity --model ", testing::SourceDir(),
                   "/models/tiny-moe --text ", file, " --out ", result_file, " 2>&1"));
  ASSERT_EQ(status, 0) << printed;
  std::ifstream in(result_file);
  const json perplexity = json::parse(in, nullptr, false);
  ASSERT_TRUE(perplexity.is_object()) << printed;

  auto tokenizer = model::Tokenizer::Load(testing::SourceDir() + "/models/tiny-moe");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto ids = (*tokenizer)->Encode(text);
  ASSERT_TRUE(ids.ok());
  json prompt = json::array({(*tokenizer)->bos_id()});
  for (int32_t id : *ids) prompt.push_back(id);
  prompt.push_back((*tokenizer)->eos_id());
  ASSERT_EQ(perplexity["tokens"].get<size_t>(), prompt.size() - 1);

  const json request = {
      {"prompt", prompt}, {"echo", true}, {"max_tokens", 0}, {"logprobs", 0}, {"temperature", 0}};
  auto got = Call("POST", "/v1/completions", request.dump());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->status, 200) << got->body;
  const json body = json::parse(got->body);
  const json& logprobs = body["choices"][0]["logprobs"]["token_logprobs"];
  ASSERT_EQ(logprobs.size(), prompt.size());
  double sum = 0;
  for (size_t i = 1; i < logprobs.size(); ++i) sum += logprobs[i].get<double>();
  const double want = perplexity["logprob_sum"].get<double>();
  // Float32 log-probabilities, summed: rounding of ~1e-7 relative per term.
  EXPECT_NEAR(sum, want, 1e-4 * std::abs(want)) << "echo " << sum << ", perplexity " << want;
  std::cout << "loglikelihood: echo " << std::setprecision(9) << sum << ", tandem perplexity "
            << want << ", difference " << sum - want << "\n";
}

TEST_F(OpenAiApiTest, BadRequestsGetOpenAiErrorsAndLoseNothing) {
  struct Case {
    std::string method, path, body;
    int status;
    std::string message;  // a part of the error message
  };
  const std::vector<Case> cases = {
      {"POST", "/v1/completions", "not json", 400, "not valid JSON"},
      {"POST", "/v1/completions", "[1, 2]", 400, "not a JSON object"},
      {"POST", "/v1/completions", "{\"prompt\": \"\xff\xfe\"}", 400, "not valid JSON"},
      {"POST", "/v1/completions", std::string(100000, '[') + std::string(100000, ']'), 400,
       "nested deeper"},
      {"POST", "/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": 3}})", 400,
       "response_format"},
      {"POST", "/v1/completions", "{}", 400, "prompt is required"},
      {"POST", "/v1/completions", R"({"prompt": ""})", 400, "prompt is empty"},
      {"POST", "/v1/completions", R"({"prompt": 7})", 400, "prompt must be"},
      {"POST", "/v1/completions", R"({"prompt": ["a", "b"]})", 400, "one prompt per request"},
      {"POST", "/v1/completions", R"({"prompt": [99999]})", 400, "outside the vocabulary"},
      {"POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens"},
      {"POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 512})", 400, "max_tokens"},
      {"POST", "/v1/completions", R"({"prompt": "x", "max_tokens": "9"})", 400,
       "max_tokens must be an integer"},
      {"POST", "/v1/completions", R"({"prompt": "x", "n": 17})", 400, "n is 17"},
      {"POST", "/v1/completions", R"({"prompt": "x", "n": 3, "best_of": 2})", 400,
       "best_of (2) must be at least n (3)"},
      {"POST", "/v1/completions", R"({"prompt": "x", "best_of": 2, "stream": true})", 400,
       "cannot be streamed"},
      {"POST", "/v1/completions", R"({"prompt": "x", "top_p": 0})", 400, "top_p"},
      {"POST", "/v1/completions", R"({"prompt": "x", "stop": [1]})", 400, "stop"},
      {"POST", "/v1/completions", R"({"prompt": "x", "logprobs": 21})", 400, "logprobs"},
      {"POST", "/v1/completions", R"({"prompt": "x", "logit_bias": {"99999": 1}})", 400,
       "outside the vocabulary"},
      {"POST", "/v1/completions", R"({"prompt": "x", "stream_options": {"include_usage": true}})",
       400, "stream_options"},
      {"POST", "/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", 404, "gpt-4"},
      {"GET", "/v1/completions", "", 405, "use POST"},
      {"POST", "/v1/chat/completions", R"({"messages": []})", 400, "messages"},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "robot", "content": "x"}]})", 400,
       "unknown message role 'robot'"},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": 3}]})", 400,
       "content"},
      {"POST", "/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", 400,
       "tools[0].function must be an object"},
      {"POST", "/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", 400,
       "needs tools"},
      {"POST", "/v1/completions", R"({"prompt": "x", "guided_regex": "a", "guided_choice": ["b"]})",
       400, "both constrain the output"},
      {"POST", "/v1/completions", R"({"prompt": "x", "guided_json": {"not": {}}})", 400,
       "JSON Schema keyword \"not\""},
      {"POST", "/v1/completions", R"({"prompt": "x", "guided_grammar": "root ::= x"})", 400,
       "not supported"},
      {"POST", "/v1/models", "", 405, "use GET"},
      {"GET", "/v1/nothing", "", 404, "no such path"},
      {"POST", "/v1/completions", std::string(3 << 20, ' '), 413, "larger than"},
      // A body within the HTTP limit whose prompt is over --max_prompt_bytes (1 MiB).
      {"POST", "/v1/completions",
       absl::StrCat(R"({"prompt": ")", std::string(3 << 19, 'a'), R"("})"), 400,
       "bytes; the limit is"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.method + " " + c.path + " " + c.body.substr(0, 80));
    auto got = Call(c.method, c.path, c.body);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->status, c.status) << got->body;
    const json body = json::parse(got->body, nullptr, false);
    ASSERT_TRUE(body.is_object() && body.contains("error")) << got->body;
    EXPECT_TRUE(absl::StrContains(body["error"].value("message", ""), c.message)) << got->body;
    EXPECT_TRUE(body["error"].contains("type") && body["error"].contains("param") &&
                body["error"].contains("code"));
  }
  // Every field with a value of a type it never takes: 400 naming the field.
  const std::vector<std::pair<std::string, std::vector<std::string>>> wrong = {
      {"model", {"1", "[]", "{}", "true"}},
      {"prompt", {"1", "{}", "true", "[1.5]", "[[\"a\"]]", "[{}]", "[99999999999]"}},
      {"max_tokens", {"\"5\"", "1.5", "[]", "{}", "true", "18446744073709551615", "-1"}},
      {"max_completion_tokens", {"\"5\"", "[]", "{}", "false"}},
      {"temperature", {"\"hot\"", "[]", "{}", "true", "-1", "3"}},
      {"top_p", {"\"x\"", "[]", "{}", "false", "2"}},
      {"top_k", {"\"x\"", "1.5", "[]", "{}"}},
      {"seed", {"\"x\"", "1.5", "[]", "{}", "true"}},
      {"n", {"\"1\"", "[]", "{}", "0", "17"}},
      {"best_of", {"\"1\"", "{}", "0", "17"}},
      {"stop", {"1", "{}", "[1]", "[[]]", "true"}},
      {"stop_token_ids", {"1", "\"x\"", "{}", "[\"x\"]", "[1.5]"}},
      {"ignore_eos", {"1", "\"true\"", "[]"}},
      {"stream", {"1", "\"yes\"", "[]", "{}"}},
      {"logprobs", {"\"x\"", "[]", "{}", "true", "21", "-1"}},
      {"logit_bias",
       {"1", "\"x\"", "[1]", "{\"x\": 5}", "{\"-1\": 5}", "{\"1\": \"a\"}", "{\"1\": 101}"}},
      {"presence_penalty", {"\"x\"", "[]", "3"}},
      {"frequency_penalty", {"{}", "-2.5"}},
      {"repetition_penalty", {"\"x\"", "0", "2.5"}},
      {"echo", {"1", "\"x\""}},
      {"suffix", {"1", "\"x\""}},
  };
  int refused = 0;
  for (const auto& [field, values] : wrong) {
    for (const std::string& value : values) {
      const std::string body =
          field == "prompt"
              ? absl::StrCat(R"({"prompt": )", value, "}")
              : absl::StrCat(R"({"prompt": "x", "max_tokens": 2, ")", field, R"(": )", value, "}");
      SCOPED_TRACE(body);
      auto got = Call("POST", "/v1/completions", body);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->status, 400) << got->body;
      const json error = json::parse(got->body, nullptr, false);
      ASSERT_TRUE(error.is_object() && error.contains("error")) << got->body;
      EXPECT_EQ(error["error"]["param"], field) << got->body;
      ++refused;
    }
  }
  const std::vector<std::pair<std::string, std::vector<std::string>>> wrong_chat = {
      {"messages", {"\"x\"", "1", "{}", "[1]", "[{\"role\": 1}]", "[{}]"}},
      {"messages[0].content",
       {"[{\"type\": 1}]", "[{\"type\": \"text\", \"text\": 1}]", "{}", "1", "[1]"}},
      {"tools", {"1", "\"x\"", "[{}]"}},
      {"functions", {"1", "[{}]"}},
      {"response_format",
       {"1", "\"text\"", "[]", "{\"type\": 1}", "{\"type\": \"json\"}",
        "{\"type\": \"json_schema\"}",
        "{\"type\": \"json_schema\", \"json_schema\": {\"schema\": 1}}"}},
      {"stream_options", {"1", "[]", "{\"include_usage\": 1}"}},
      {"logprobs", {"1", "\"x\""}},
      {"top_logprobs", {"\"x\"", "21", "2"}},  // 2: without "logprobs": true
  };
  for (const auto& [field, values] : wrong_chat) {
    for (const std::string& value : values) {
      std::string body;
      if (field == "messages") {
        body = absl::StrCat(R"({"messages": )", value, "}");
      } else if (field == "messages[0].content") {
        body = absl::StrCat(R"({"messages": [{"role": "user", "content": )", value, "}]}");
      } else {
        body = absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], "stream": true, ")",
                            field, R"(": )", value, "}");
      }
      SCOPED_TRACE(body);
      auto got = Call("POST", "/v1/chat/completions", body);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->status, 400) << got->body;
      const json error = json::parse(got->body, nullptr, false);
      ASSERT_TRUE(error.is_object() && error.contains("error")) << got->body;
      EXPECT_TRUE(absl::StartsWith(error["error"].value("param", ""), field.substr(0, 8)))
          << got->body;
      ++refused;
    }
  }
  EXPECT_GT(refused, 100);

  // Malformed HTTP: bad bytes in the path, the headers and the body framing; a Content-Length
  // that lies; huge headers. Each gets a 4xx with a JSON error body.
  const std::vector<std::pair<std::string, int>> raw = {
      {"GET /%FF HTTP/1.1\r\nConnection: close\r\n\r\n", 404},
      {"GET /v1/models\x01 HTTP/1.1\r\n\r\n", 400},
      {"POST /v1/completions HTTP/1.1\r\nX-Bad\x7f: 1\r\n\r\n", 400},
      {"POST /v1/completions HTTP/1.1\r\nX: a\x01"
       "b\r\n\r\n",
       400},
      {"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400},
      {"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}garbage\r\n\r\n", 400},
      {"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
       400},
      {"GET /v1/models HTTP/1.1\r\nX: " + std::string(100000, 'x') + "\r\n\r\n", 431},
  };
  for (const auto& [bytes, status] : raw) {
    SCOPED_TRACE(absl::CEscape(bytes.substr(0, 80)));
    const int fd =
        testing::ConnectAndSend(gateway_.http_port, std::string(bytes.data(), bytes.size()));
    ASSERT_GE(fd, 0);
    const std::string got = testing::ReadUntilClosed(fd);
    close(fd);
    EXPECT_TRUE(absl::StrContains(got, absl::StrCat("HTTP/1.1 ", status, " "))) << got;
    const size_t last = got.rfind("\r\n\r\n");
    ASSERT_NE(last, std::string::npos) << got;
    EXPECT_TRUE(json::parse(got.substr(last + 4), nullptr, false).contains("error")) << got;
  }

  // Still serving, and a stream without include_usage carries no usage.
  auto good = Call("POST", "/v1/completions",
                   R"({"prompt": "She opened the door and", "max_tokens": 4, "temperature": 0,
                       "stream": true})");
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->status, 200);
  EXPECT_TRUE(absl::EndsWith(good->body, "data: [DONE]\n\n")) << good->body;
  EXPECT_FALSE(absl::StrContains(good->body, "\"usage\"")) << good->body;
  EXPECT_GE(MetricValue(gateway_.http_port, "tandem_http_requests_total",
                        "code=\"400\",model=\"tiny-moe\",path=\"/v1/completions\""),
            13);
}

// Reads from `fd` until `text` has arrived (or 20 s); false if it did not.
bool ReadUntil(int fd, const std::string& text) {
  return absl::StrContains(testing::ReadUntil(fd, text, absl::Seconds(20)), text);
}

// A streamed request whose client leaves once its first event has arrived: the decoder is
// running it then. The gateway cancels it, decode drops the sequence.
TEST_F(OpenAiApiTest, ClientThatDisconnectsCancelsItsRequestDownstream) {
  auto cancelled = [] {
    return MetricValue(gateway_.http_port, "tandem_requests_total", "outcome=\"cancelled\"");
  };
  const double before = std::max(0.0, cancelled());
  const std::string long_request = R"({"prompt": "It is not easy to say what", "max_tokens": 480,
                                       "ignore_eos": true, "temperature": 0, "stream": true})";
  const int fd = testing::ConnectAndSend(gateway_.http_port, Post("/v1/completions", long_request));
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(ReadUntil(fd, "data: {"));
  close(fd);
  EXPECT_TRUE(testing::WaitUntil([&] { return cancelled() >= before + 1; }, absl::Seconds(10)))
      << set_->Log("tandem-gateway");
  EXPECT_TRUE(testing::WaitUntil(
      [] { return MetricValue(decode_.http_port, "tandem_running_sequences") == 0; },
      absl::Seconds(10)));
  EXPECT_GE(MetricValue(gateway_.http_port, "tandem_http_requests_total", "code=\"499\""), 1);
}

// A whole (non-streamed) request whose client leaves while it is in prefill, which is stalled
// (stopped) so that the request cannot finish first: the gateway cancels the prefill call and
// releases decode's reservation at once.
TEST(OpenAiApiDisconnectTest, LeavingDuringPrefillReleasesTheReservation) {
  testing::ServiceSet set;
  auto decode = set.Start("tandem-decode", {});
  ASSERT_TRUE(decode.ok()) << decode.status();
  auto prefill = set.Start("tandem-prefill",
                           {"--kv_chunk_bytes=16384", "--testing_stop_after_kv_bytes=16384"});
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  const pid_t prefill_pid = set.processes().back().pid();
  // Health checks far apart: the client's leaving, not the gateway's abandoning of a silent
  // prefill, must end the request.
  auto gateway =
      set.Start("tandem-gateway",
                {absl::StrCat("--prefill=127.0.0.1:", prefill->grpc_port),
                 absl::StrCat("--decode=127.0.0.1:", decode->grpc_port), "--health_interval_s=5"});
  ASSERT_TRUE(gateway.ok()) << gateway.status();
  const int fd = testing::ConnectAndSend(
      gateway->http_port,
      Post("/v1/completions", R"({"prompt": "It is not easy to say what they had in mind",
                                  "max_tokens": 8, "temperature": 0})"));
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(testing::WaitUntil([&] { return testing::Stopped(prefill_pid); }, absl::Seconds(20)));
  EXPECT_GT(MetricValue(decode->http_port, "tandem_kv_blocks", "state=\"used\""), 0);
  close(fd);
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        return MetricValue(gateway->http_port, "tandem_requests_total", "outcome=\"cancelled\"") ==
               1;
      },
      absl::Seconds(10)))
      << set.Log("tandem-gateway");
  // Released, not left to the lease (30 s).
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return MetricValue(decode->http_port, "tandem_kv_blocks", "state=\"used\"") == 0; },
      absl::Seconds(5)));
  EXPECT_EQ(MetricValue(decode->http_port, "tandem_reservations_expired_total"), 0);
  EXPECT_GE(MetricValue(gateway->http_port, "tandem_http_requests_total", "code=\"499\""), 1);
  kill(prefill_pid, SIGCONT);
}

TEST(OpenAiApiServeTest, OverloadGets429DrainingGets503AndNoInstance503) {
  testing::ServiceSet set;
  auto serve = set.Start("tandem-serve", {"--max_inflight=1", "--max_queued=0"});
  ASSERT_TRUE(serve.ok()) << serve.status();
  const std::string long_request = R"({"prompt": "It is not easy to say what", "max_tokens": 480,
                                       "ignore_eos": true, "stream": true})";
  const int fd = testing::ConnectAndSend(serve->http_port, Post("/v1/completions", long_request));
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return MetricValue(serve->http_port, "tandem_running_sequences") >= 1; },
      absl::Seconds(20)));
  auto refused = http::Fetch("127.0.0.1", serve->http_port, "POST", "/v1/completions",
                             R"({"prompt": "x", "max_tokens": 2})", 10000);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->status, 429) << refused->body;
  EXPECT_EQ(json::parse(refused->body)["error"]["type"], "rate_limit_error");

  // SIGTERM: while the long request drains, new ones get 503.
  ASSERT_EQ(kill(set.processes()[0].pid(), SIGTERM), 0);
  int status = 0;
  testing::WaitUntil(
      [&] {
        auto got = http::Fetch("127.0.0.1", serve->http_port, "POST", "/v1/completions",
                               R"({"prompt": "x", "max_tokens": 2})", 2000);
        status = got.ok() ? got->status : 0;
        return status == 503;
      },
      absl::Seconds(10));
  EXPECT_EQ(status, 503);
  close(fd);

  // A gateway whose decode instance is not there: 503, saying so.
  testing::ServiceSet alone;
  auto gateway = alone.Start("tandem-gateway", {"--prefill=127.0.0.1:1", "--decode=127.0.0.1:1"});
  ASSERT_TRUE(gateway.ok()) << gateway.status();
  auto unavailable = http::Fetch("127.0.0.1", gateway->http_port, "POST", "/v1/completions",
                                 R"({"prompt": "x", "max_tokens": 2})", 30000);
  ASSERT_TRUE(unavailable.ok());
  EXPECT_EQ(unavailable->status, 503) << unavailable->body;
  EXPECT_TRUE(absl::StrContains(unavailable->body, "no decode instance")) << unavailable->body;
}

}  // namespace
}  // namespace tandem
