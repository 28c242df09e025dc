#include "services/router-gateway/openai_request.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/util/status.h"
#include "nlohmann/json.hpp"
#include "services/common/structured_output.h"

namespace tandem::gateway {
namespace {

// Ordered: the order of keys in messages and tools reaches the chat template (tojson).
using json = nlohmann::ordered_json;

constexpr char kParamPayload[] = "type.googleapis.com/tandem.v1.RequestParam";

absl::Status Invalid(absl::string_view param, std::string message) {
  return WithParam(absl::InvalidArgumentError(std::move(message)), param);
}

// A field that may be absent or null. Every access below checks the value's type first:
// nlohmann's typed getters throw on a mismatch.
const json* Field(const json& body, const char* name) {
  if (!body.is_object()) return nullptr;
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

absl::Status ReadInt(const json& body, const char* name, int64_t min, int64_t max,
                     std::optional<int64_t>* out) {
  const json* f = Field(body, name);
  if (f == nullptr) return absl::OkStatus();
  if (!f->is_number_integer()) return Invalid(name, absl::StrCat(name, " must be an integer"));
  // Integers above INT64_MAX parse as unsigned: out of every range here.
  if (f->is_number_unsigned() && f->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return Invalid(name,
                   absl::StrCat(name, " is out of range; it must be in [", min, ", ", max, "]"));
  }
  const int64_t v = f->get<int64_t>();
  if (v < min || v > max) {
    return Invalid(name, absl::StrCat(name, " is ", v, "; it must be in [", min, ", ", max, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadNumber(const json& body, const char* name, std::optional<double>* out) {
  const json* f = Field(body, name);
  if (f == nullptr) return absl::OkStatus();
  if (!f->is_number()) return Invalid(name, absl::StrCat(name, " must be a number"));
  *out = f->get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const json& body, const char* name, bool* out) {
  const json* f = Field(body, name);
  if (f == nullptr) return absl::OkStatus();
  if (!f->is_boolean()) return Invalid(name, absl::StrCat(name, " must be a boolean"));
  *out = f->get<bool>();
  return absl::OkStatus();
}

// A string field's value, or empty when it is absent or not a string.
std::string StringOr(const json& body, const char* name, std::string otherwise) {
  const json* f = Field(body, name);
  return f != nullptr && f->is_string() ? f->get<std::string>() : otherwise;
}

// Token ids from a JSON array of integers; false if it is not one.
bool TokenIds(const json& value, tandem::v1::TokenIds* ids) {
  if (!value.is_array() || value.empty()) return false;
  for (const json& id : value) {
    if (!id.is_number_integer()) return false;
    if (id.is_number_unsigned() && id.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)) {
      return false;
    }
    const int64_t v = id.get<int64_t>();
    if (v < INT32_MIN || v > INT32_MAX) return false;
    ids->add_ids(static_cast<int32_t>(v));
  }
  return true;
}

absl::Status ReadPrompt(const json& body, tandem::v1::GenerateRequest* request) {
  const json* prompt = Field(body, "prompt");
  if (prompt == nullptr) return Invalid("prompt", "prompt is required");
  if (prompt->is_string()) {
    request->set_prompt(prompt->get<std::string>());
    return absl::OkStatus();
  }
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    request->set_prompt((*prompt)[0].get<std::string>());
    return absl::OkStatus();
  }
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_array()) {
    if (TokenIds((*prompt)[0], request->mutable_prompt_token_ids())) return absl::OkStatus();
  } else if (TokenIds(*prompt, request->mutable_prompt_token_ids())) {
    return absl::OkStatus();
  }
  if (prompt->is_array() && prompt->size() > 1 &&
      ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    return Invalid("prompt", "one prompt per request is supported (batches are not)");
  }
  return Invalid("prompt",
                 "prompt must be a string, a list of token ids, or a list holding one of those");
}

bool IsEmpty(const json& f) { return (f.is_array() || f.is_object()) && f.empty(); }

// Fields Tandem does not implement: refused (400, as vLLM does) unless absent or at their
// no-op value.
absl::Status RefuseUnsupported(const json& body, bool chat) {
  auto refuse = [](const char* name, const char* what = nullptr) {
    return Invalid(name,
                   absl::StrCat(what == nullptr ? name : what, " is not supported by Tandem"));
  };
  if (chat) {
    if (const json* f = Field(body, "functions"); f != nullptr && !IsEmpty(*f)) {
      return refuse("functions", "functions (the deprecated form of tools)");
    }
  } else {
    if (const json* f = Field(body, "suffix"); f != nullptr) return refuse("suffix");
  }
  return absl::OkStatus();
}

// logit_bias: {"token id": bias}; the ids and values are checked by the gateway.
absl::Status ReadLogitBias(const json& body, int vocab_size, tandem::v1::SamplingParams* sampling) {
  const json* f = Field(body, "logit_bias");
  if (f == nullptr) return absl::OkStatus();
  if (!f->is_object()) {
    return Invalid("logit_bias", "logit_bias must be an object of token ids to numbers");
  }
  for (const auto& [key, value] : f->items()) {
    int64_t id = -1;
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) id = std::stoll(key);
    if (!digits || id > INT32_MAX) {
      return Invalid("logit_bias",
                     absl::StrCat("logit_bias key \"", absl::CEscape(key.substr(0, 32)),
                                  "\" is not a token id"));
    }
    if (id >= vocab_size) {
      return Invalid("logit_bias",
                     absl::StrCat("logit_bias token id ", id, " is outside the vocabulary [0, ",
                                  vocab_size, ")"));
    }
    if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100)) {
      return Invalid("logit_bias",
                     absl::StrCat("logit_bias for token ", id, " must be a number in [-100, 100]"));
    }
    (*sampling->mutable_logit_bias())[static_cast<int32_t>(id)] = value.get<float>();
  }
  return absl::OkStatus();
}

// The body as a JSON object, or why not (nlohmann's parser copes with any depth, but
// copying or printing a value recurses, so deep nesting is refused first).
absl::StatusOr<json> ParseBody(absl::string_view text) {
  if (JsonDepth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is nested deeper than ", kMaxJsonDepth, " levels"));
  }
  json body = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return absl::InvalidArgumentError("the request body is not valid JSON");
  if (!body.is_object()) return absl::InvalidArgumentError("the request body is not a JSON object");
  return body;
}

// Prefixes every local "$ref" ("#...") in `schema` with `base`, for a schema embedded at
// `base` in a larger one.
void RebaseRefs(json* schema, const std::string& base) {
  if (schema->is_object()) {
    for (auto& [key, value] : schema->items()) {
      if (key == "$ref" && value.is_string() && value.get<std::string>().starts_with("#")) {
        value = base + value.get<std::string>().substr(1);
      } else {
        RebaseRefs(&value, base);
      }
    }
  } else if (schema->is_array()) {
    for (json& value : *schema) RebaseRefs(&value, base);
  }
}

// tool_choice "required" or a named function: the reply is constrained to JSON tool calls
// that match the tools' parameter schemas (vLLM's forms: a named function's arguments
// object; for "required", an array of {"name", "parameters"}), read back as tool calls.
absl::Status ForceToolCalls(const json* named, const json& tools, CompletionRequest* parsed) {
  const auto parameters = [](const json& tool) {
    const json& function = tool["function"];
    const auto p = function.find("parameters");
    return p == function.end() || p->is_null() ? json::parse(R"({"type": "object"})") : *p;
  };
  tandem::v1::StructuredOutput* structured =
      parsed->request.mutable_sampling()->mutable_structured();
  if (named != nullptr) {
    const json* function = Field(*named, "function");
    const json* name =
        function != nullptr && function->is_object() ? Field(*function, "name") : nullptr;
    if (StringOr(*named, "type", "") != "function" || name == nullptr || !name->is_string()) {
      return Invalid("tool_choice",
                     "a named tool_choice is {\"type\": \"function\", \"function\": "
                     "{\"name\": ...}}");
    }
    for (const json& tool : tools) {
      if (tool["function"]["name"] != *name) continue;
      structured->set_json_schema(parameters(tool).dump());
      parsed->forced_tools = {chat::ForcedToolCalls::Kind::kNamed, name->get<std::string>()};
      return absl::OkStatus();
    }
    return Invalid("tool_choice",
                   absl::StrCat("tool_choice names the function \"", name->get<std::string>(),
                                "\", which is not among the tools"));
  }
  json calls = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    json p = parameters(tools[i]);
    RebaseRefs(&p, absl::StrCat("#/items/anyOf/", i, "/properties/parameters"));
    json call = json::object();
    call["type"] = "object";
    call["properties"] = json::object();
    call["properties"]["name"] = json::object({{"const", tools[i]["function"]["name"]}});
    call["properties"]["parameters"] = std::move(p);
    call["required"] = json::array({"name", "parameters"});
    calls.push_back(std::move(call));
  }
  json schema = json::object();
  schema["type"] = "array";
  schema["minItems"] = 1;
  schema["items"] = json::object();
  schema["items"]["anyOf"] = std::move(calls);
  structured->set_json_schema(schema.dump());
  parsed->forced_tools = {chat::ForcedToolCalls::Kind::kRequired, ""};
  return absl::OkStatus();
}

// The output constraint of response_format, vLLM's structured_outputs, or its guided_*
// fields (one of them at most); tool_choice's may not be combined with any.
absl::Status ReadStructured(const json& body, CompletionRequest* parsed) {
  tandem::v1::StructuredOutput so;
  std::string from;  // the field that set it
  const auto claim = [&](const std::string& field) -> absl::Status {
    if (!from.empty()) {
      return Invalid(field, absl::StrCat(field, " and ", from,
                                         " both constrain the output; give one of them"));
    }
    from = field;
    return absl::OkStatus();
  };
  const auto schema_of = [&](const std::string& field, const json& v) -> absl::Status {
    // vLLM accepts the schema as an object or as JSON text.
    json schema = v;
    if (v.is_string()) {
      schema = json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return Invalid(field, absl::StrCat(field, " is not valid JSON"));
    }
    if (!schema.is_object() && !schema.is_boolean()) {
      return Invalid(field, absl::StrCat(field, " must be a JSON Schema object"));
    }
    so.set_json_schema(schema.dump());
    return absl::OkStatus();
  };
  const auto regex_of = [&](const std::string& field, const json& v) -> absl::Status {
    if (!v.is_string() || v.get<std::string>().empty()) {
      return Invalid(field, absl::StrCat(field, " must be a non-empty string"));
    }
    so.set_regex(v.get<std::string>());
    return absl::OkStatus();
  };
  const auto choice_of = [&](const std::string& field, const json& v) -> absl::Status {
    if (!v.is_array() || v.empty()) {
      return Invalid(field, absl::StrCat(field, " must be a non-empty list of strings"));
    }
    for (const json& c : v) {
      if (!c.is_string()) return Invalid(field, absl::StrCat(field, " must be a list of strings"));
      so.mutable_choice()->add_choices(c.get<std::string>());
    }
    return absl::OkStatus();
  };
  if (const json* f = Field(body, "response_format"); f != nullptr) {
    const std::string type = f->is_object() ? StringOr(*f, "type", "") : "";
    if (type == "json_object") {
      RETURN_IF_ERROR(claim("response_format"));
      so.set_json_object(true);
    } else if (type == "json_schema") {
      RETURN_IF_ERROR(claim("response_format"));
      const json* spec = Field(*f, "json_schema");
      const json* schema = spec != nullptr && spec->is_object() ? Field(*spec, "schema") : nullptr;
      if (schema == nullptr) {
        return Invalid("response_format",
                       "response_format.json_schema.schema is required for type json_schema");
      }
      if (const json* strict = Field(*spec, "strict"); strict != nullptr && !strict->is_boolean()) {
        return Invalid("response_format", "response_format.json_schema.strict must be a boolean");
      }
      RETURN_IF_ERROR(schema_of("response_format.json_schema.schema", *schema));
    } else if (type != "text") {
      return Invalid("response_format",
                     "response_format.type must be \"text\", \"json_object\" or \"json_schema\"");
    }
  }
  const json* nested = Field(body, "structured_outputs");
  if (nested != nullptr && !nested->is_object()) {
    return Invalid("structured_outputs", "structured_outputs must be an object");
  }
  // (field as the client wrote it, its value): vLLM's structured_outputs and guided_* forms.
  std::vector<std::pair<std::string, const json*>> fields;
  for (const char* key : {"json", "regex", "choice", "json_object", "grammar", "structural_tag",
                          "whitespace_pattern"}) {
    if (nested != nullptr) {
      if (const json* f = Field(*nested, key); f != nullptr && !f->is_null()) {
        fields.emplace_back(absl::StrCat("structured_outputs.", key), f);
      }
    }
  }
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                          "guided_whitespace_pattern"}) {
    if (const json* f = Field(body, key); f != nullptr && !f->is_null())
      fields.emplace_back(key, f);
  }
  for (const auto& [field, value] : fields) {
    const std::string kind = field.substr(field.starts_with("guided_") ? 7 : field.rfind('.') + 1);
    if (kind == "grammar" || kind == "structural_tag" || kind == "whitespace_pattern") {
      return Invalid(field, absl::StrCat(field,
                                         " is not supported by Tandem (JSON Schema, "
                                         "json_object, regex and choice are)"));
    }
    if (kind == "json_object") {
      if (!value->is_boolean()) return Invalid(field, absl::StrCat(field, " must be a boolean"));
      if (!value->get<bool>()) continue;
      RETURN_IF_ERROR(claim(field));
      so.set_json_object(true);
      continue;
    }
    RETURN_IF_ERROR(claim(field));
    if (kind == "json") {
      RETURN_IF_ERROR(schema_of(field, *value));
    } else if (kind == "regex") {
      RETURN_IF_ERROR(regex_of(field, *value));
    } else {
      RETURN_IF_ERROR(choice_of(field, *value));
    }
  }
  if (from.empty()) return absl::OkStatus();
  if (parsed->forced_tools.kind != chat::ForcedToolCalls::Kind::kNone) {
    return Invalid(from, absl::StrCat(from,
                                      " cannot be combined with tool_choice \"required\" "
                                      "or a named function (which constrain the output)"));
  }
  if (absl::Status s = serving::CheckConstraint(so); !s.ok()) {
    return Invalid(from, absl::StrCat(from, ": ", std::string(s.message())));
  }
  *parsed->request.mutable_sampling()->mutable_structured() = std::move(so);
  return absl::OkStatus();
}

// Chat: the messages, tools and template arguments rendered into the prompt.
absl::Status ReadChat(const json& body, const ModelFront& front, CompletionRequest* parsed) {
  if (!front.chat_template.ok()) {
    return Invalid("messages", std::string(front.chat_template.status().message()));
  }
  const json* messages = Field(body, "messages");
  if (messages == nullptr) return Invalid("messages", "messages must be a non-empty list");
  absl::StatusOr<json> normalized = chat::NormalizeMessages(*messages);
  if (!normalized.ok()) {
    return Invalid("messages", std::string(normalized.status().message()));
  }
  chat::ChatInput input;
  input.messages = *std::move(normalized);
  std::string tool_choice = "auto";
  const json* named = nullptr;  // tool_choice {"type": "function", "function": {"name": ...}}
  if (const json* f = Field(body, "tool_choice"); f != nullptr) {
    if (f->is_string() && (*f == "auto" || *f == "none" || *f == "required")) {
      tool_choice = f->get<std::string>();
    } else if (f->is_object()) {
      tool_choice = "named";
      named = f;
    } else {
      return Invalid("tool_choice",
                     "tool_choice must be \"auto\", \"none\", \"required\" or "
                     "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  const json* tools = Field(body, "tools");
  if (tools != nullptr && !IsEmpty(*tools)) {
    if (absl::Status s = chat::ValidateTools(*tools); !s.ok()) {
      return Invalid("tools", std::string(s.message()));
    }
    // tool_choice "none": the template still sees the tools (as vLLM renders them), but the
    // reply is not parsed for calls.
    input.tools = *tools;
    parsed->parse_tool_calls = tool_choice == "auto";
  } else {
    tools = nullptr;
  }
  if (tool_choice == "required" || tool_choice == "named") {
    if (tools == nullptr) {
      return Invalid(
          "tool_choice",
          absl::StrCat("tool_choice \"", tool_choice == "named" ? "a named function" : "required",
                       "\" needs tools"));
    }
    if (absl::Status s = ForceToolCalls(named, *tools, parsed); !s.ok()) return s;
  }
  if (const json* documents = Field(body, "documents"); documents != nullptr) {
    if (!documents->is_array()) return Invalid("documents", "documents must be a list");
    input.documents = *documents;
  }
  for (const auto& [name, out] :
       {std::pair{"add_generation_prompt", &input.add_generation_prompt},
        std::pair{"continue_final_message", &input.continue_final_message}}) {
    if (absl::Status s = ReadBool(body, name, out); !s.ok()) return s;
  }
  if (input.continue_final_message && Field(body, "add_generation_prompt") == nullptr) {
    input.add_generation_prompt = false;
  }
  if (const json* kwargs = Field(body, "chat_template_kwargs"); kwargs != nullptr) {
    if (!kwargs->is_object()) {
      return Invalid("chat_template_kwargs", "chat_template_kwargs must be an object");
    }
    for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"}) {
      if (kwargs->contains(reserved)) {
        return Invalid("chat_template_kwargs",
                       absl::StrCat("chat_template_kwargs may not set \"", reserved,
                                    "\" (it is a request field of its own)"));
      }
    }
    input.kwargs = *kwargs;
  }
  absl::StatusOr<std::string> prompt = front.chat_template->Apply(input);
  if (!prompt.ok()) return WithParam(prompt.status(), "messages");
  parsed->prompt_opens_reasoning =
      chat::ChatOutputParser::PromptOpensReasoning(front.reasoning, *prompt);
  tandem::v1::GenerateRequest& request = parsed->request;
  request.set_prompt(*std::move(prompt));
  // The template wrote the special tokens (BOS among them) itself: vLLM's chat default.
  bool add_special_tokens = false;
  if (absl::Status s = ReadBool(body, "add_special_tokens", &add_special_tokens); !s.ok()) {
    return s;
  }
  request.set_add_special_tokens(add_special_tokens);
  return absl::OkStatus();
}

}  // namespace

absl::Status WithParam(absl::Status status, absl::string_view param) {
  if (!param.empty()) status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

std::string ParamOf(const absl::Status& status) {
  const auto param = status.GetPayload(kParamPayload);  // absl::optional<absl::Cord>
  return param.has_value() ? std::string(*param) : std::string();
}

int JsonDepth(absl::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '{':
      case '[':
        deepest = std::max(deepest, ++depth);
        if (deepest > limit) return deepest;
        break;
      case '}':
      case ']':
        --depth;
        break;
      default:
        break;
    }
  }
  return deepest;
}

absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view text, bool chat,
                                                         const ModelFront& front) {
  const int context = front.context;
  const model::GenerationDefaults& defaults = front.generation;
  absl::StatusOr<json> parsed_body = ParseBody(text);
  if (!parsed_body.ok()) return parsed_body.status();
  const json& body = *parsed_body;
  if (absl::Status s = RefuseUnsupported(body, chat); !s.ok()) return s;
  CompletionRequest parsed;
  tandem::v1::GenerateRequest& request = parsed.request;
  if (const json* model = Field(body, "model"); model != nullptr) {
    if (!model->is_string()) return Invalid("model", "model must be a string");
    parsed.model = model->get<std::string>();
    request.set_model(parsed.model);
  }
  if (chat) {
    if (absl::Status s = ReadChat(body, front, &parsed); !s.ok()) return s;
  } else {
    if (absl::Status s = ReadPrompt(body, &request); !s.ok()) return s;
    if (const json* f = Field(body, "add_special_tokens"); f != nullptr) {
      bool add = true;
      if (absl::Status s = ReadBool(body, "add_special_tokens", &add); !s.ok()) return s;
      request.set_add_special_tokens(add);
    }
  }
  if (absl::Status s = ReadStructured(body, &parsed); !s.ok()) return s;
  if (parsed.forced_tools.kind != chat::ForcedToolCalls::Kind::kNone) {
    if (absl::Status s = serving::CheckConstraint(request.sampling().structured()); !s.ok()) {
      return Invalid("tools",
                     absl::StrCat("the tools' parameter schemas: ", std::string(s.message())));
    }
  }
  tandem::v1::SamplingParams& sampling = *request.mutable_sampling();
  if (absl::Status s = ReadBool(body, "stream", &parsed.stream); !s.ok()) return s;
  if (!chat) {
    if (absl::Status s = ReadBool(body, "echo", &parsed.echo); !s.ok()) return s;
  }
  std::optional<int64_t> n, best_of, max_tokens, max_completion_tokens, seed, top_k, logprobs;
  // max_tokens 0 asks for no text: with echo, the prompt's log-probabilities alone (the
  // loglikelihood requests of lm-evaluation-harness).
  const int64_t min_tokens = parsed.echo ? 0 : 1;
  for (const auto& [name, out, min, max] :
       {std::tuple{"n", &n, int64_t{1}, int64_t{kMaxChoices}},
        std::tuple{"best_of", &best_of, int64_t{1}, int64_t{kMaxChoices}},
        std::tuple{"max_tokens", &max_tokens, min_tokens, int64_t{context} - 1},
        std::tuple{"max_completion_tokens", &max_completion_tokens, int64_t{1},
                   int64_t{context} - 1},
        std::tuple{"seed", &seed, INT64_MIN, INT64_MAX},
        std::tuple{"top_k", &top_k, int64_t{-1}, int64_t{1} << 20}}) {
    if (chat && std::string(name) == "best_of") continue;
    if (absl::Status s = ReadInt(body, name, min, max, out); !s.ok()) return s;
  }
  if (chat) {
    // Chat: `logprobs` is a boolean, `top_logprobs` the alternatives.
    bool want = false;
    if (absl::Status s = ReadBool(body, "logprobs", &want); !s.ok()) return s;
    std::optional<int64_t> top;
    if (absl::Status s = ReadInt(body, "top_logprobs", 0, kMaxLogprobs, &top); !s.ok()) return s;
    if (top && !want) {
      return Invalid("top_logprobs", "top_logprobs needs \"logprobs\": true");
    }
    if (want) logprobs = top.value_or(0);
  } else {
    if (const json* f = Field(body, "logprobs"); f != nullptr && f->is_boolean()) {
      return Invalid("logprobs",
                     "logprobs must be an integer (the alternatives per token, 0 to 20) for "
                     "completions; the boolean form is chat's");
    }
    if (absl::Status s = ReadInt(body, "logprobs", 0, kMaxLogprobs, &logprobs); !s.ok()) return s;
  }
  parsed.n = static_cast<int>(n.value_or(1));
  parsed.best_of = static_cast<int>(best_of.value_or(parsed.n));
  if (parsed.best_of < parsed.n) {
    return Invalid("best_of", absl::StrCat("best_of (", parsed.best_of, ") must be at least n (",
                                           parsed.n, ")"));
  }
  if (parsed.stream && parsed.best_of > parsed.n) {
    return Invalid("best_of", "best_of above n cannot be streamed (the best are known at the end)");
  }
  parsed.logprobs = static_cast<int>(logprobs.value_or(-1));
  if (max_completion_tokens) max_tokens = max_completion_tokens;
  // Unset: 16 tokens for a completion (OpenAI's and vLLM's default); for a chat reply the rest
  // of the context, or generation_config.json's max_new_tokens if that is less (vLLM's).
  int chat_default = context - 1;
  if (defaults.max_new_tokens) chat_default = std::min(chat_default, *defaults.max_new_tokens);
  sampling.set_max_tokens(static_cast<int>(max_tokens.value_or(chat ? chat_default : 16)));
  // Ranking best_of choices needs each token's log-probability.
  if (parsed.logprobs >= 0 || parsed.best_of > parsed.n) {
    sampling.set_logprobs(std::max(parsed.logprobs, 0));
  }
  // Echo shows the prompt's log-probabilities with logprobs; with max_tokens 0 the prompt is
  // only scored (the engine needs them asked for then).
  if (parsed.echo && (parsed.logprobs >= 0 || sampling.max_tokens() == 0)) {
    sampling.set_prompt_logprobs(std::max(parsed.logprobs, 0));
  }
  if (seed) sampling.set_seed(static_cast<uint64_t>(*seed));
  if (!top_k && defaults.top_k) top_k = *defaults.top_k;
  if (top_k && *top_k > 0) sampling.set_top_k(static_cast<int>(*top_k));
  for (const auto& [name, set] :
       {std::pair{"presence_penalty", &tandem::v1::SamplingParams::set_presence_penalty},
        std::pair{"frequency_penalty", &tandem::v1::SamplingParams::set_frequency_penalty},
        std::pair{"repetition_penalty", &tandem::v1::SamplingParams::set_repetition_penalty}}) {
    std::optional<double> value;
    if (absl::Status s = ReadNumber(body, name, &value); !s.ok()) return s;
    const bool repetition = std::string(name) == "repetition_penalty";
    if (value && (repetition ? !(*value > 0 && *value <= 2) : !(*value >= -2 && *value <= 2))) {
      return Invalid(
          name, absl::StrCat(name, " ", *value, " is outside ", repetition ? "(0, 2]" : "[-2, 2]"));
    }
    if (!value && repetition && defaults.repetition_penalty) value = defaults.repetition_penalty;
    if (value) (sampling.*set)(static_cast<float>(*value));
  }
  if (absl::Status s = ReadLogitBias(body, front.vocab_size, &sampling); !s.ok()) return s;
  std::optional<double> temperature, top_p;
  if (absl::Status s = ReadNumber(body, "temperature", &temperature); !s.ok()) return s;
  if (absl::Status s = ReadNumber(body, "top_p", &top_p); !s.ok()) return s;
  if (temperature && !(*temperature >= 0 && *temperature <= 2)) {
    return Invalid("temperature", absl::StrCat("temperature ", *temperature, " is outside [0, 2]"));
  }
  // Silent: generation_config.json's, else OpenAI's default.
  sampling.set_temperature(
      static_cast<float>(temperature.value_or(defaults.temperature.value_or(1.0))));
  if (!top_p && defaults.top_p) top_p = defaults.top_p;
  if (top_p) {
    if (!(*top_p > 0 && *top_p <= 1)) {
      return Invalid("top_p", absl::StrCat("top_p ", *top_p, " is outside (0, 1]"));
    }
    sampling.set_top_p(static_cast<float>(*top_p));
  }
  if (const json* stop = Field(body, "stop"); stop != nullptr) {
    if (stop->is_string()) {
      sampling.add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) return Invalid("stop", "stop entries must be strings");
        sampling.add_stop(s.get<std::string>());
      }
    } else {
      return Invalid("stop", "stop must be a string or a list of strings");
    }
  }
  // generation_config.json's stop strings end a chat reply, but not a constrained one, whose
  // form decides where it ends (tiny-moe's '"' would cut every JSON string).
  if (chat && !sampling.has_structured()) {
    for (const std::string& s : defaults.stop_strings) sampling.add_stop(s);
  }
  if (const json* ids = Field(body, "stop_token_ids"); ids != nullptr) {
    tandem::v1::TokenIds stop_ids;
    if (!(ids->is_array() && ids->empty()) && !TokenIds(*ids, &stop_ids)) {
      return Invalid("stop_token_ids", "stop_token_ids must be a list of token ids");
    }
    sampling.mutable_stop_token_ids()->Assign(stop_ids.ids().begin(), stop_ids.ids().end());
  }
  bool ignore_eos = false;
  if (absl::Status s = ReadBool(body, "ignore_eos", &ignore_eos); !s.ok()) return s;
  sampling.set_ignore_eos(ignore_eos);
  if (const json* options = Field(body, "stream_options"); options != nullptr) {
    if (!parsed.stream) {
      return Invalid("stream_options", "stream_options is only allowed with \"stream\": true");
    }
    if (!options->is_object()) {
      return Invalid("stream_options", "stream_options must be an object");
    }
    if (absl::Status s = ReadBool(*options, "include_usage", &parsed.include_usage); !s.ok()) {
      return Invalid("stream_options.include_usage",
                     "stream_options.include_usage must be a boolean");
    }
  }
  return parsed;
}

namespace {

absl::Status ReadModel(const json& body, std::string* model) {
  if (const json* f = Field(body, "model"); f != nullptr) {
    if (!f->is_string()) return Invalid("model", "model must be a string");
    *model = f->get<std::string>();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizeInput> ParseTokenizeRequest(absl::string_view text,
                                                   const ModelFront& front) {
  absl::StatusOr<json> body = ParseBody(text);
  if (!body.ok()) return body.status();
  TokenizeInput out;
  if (absl::Status s = ReadModel(*body, &out.model); !s.ok()) return s;
  if (absl::Status s = ReadBool(*body, "return_token_strs", &out.return_token_strs); !s.ok()) {
    return s;
  }
  if (Field(*body, "messages") != nullptr) {
    CompletionRequest chat;
    if (absl::Status s = ReadChat(*body, front, &chat); !s.ok()) return s;
    out.text = chat.request.prompt();
    out.add_special_tokens = chat.request.add_special_tokens();
    return out;
  }
  const json* prompt = Field(*body, "prompt");
  if (prompt == nullptr || !prompt->is_string()) {
    return Invalid("prompt", "prompt must be a string (or give messages)");
  }
  out.text = prompt->get<std::string>();
  if (absl::Status s = ReadBool(*body, "add_special_tokens", &out.add_special_tokens); !s.ok()) {
    return s;
  }
  return out;
}

absl::StatusOr<DetokenizeInput> ParseDetokenizeRequest(absl::string_view text, int vocab_size) {
  absl::StatusOr<json> body = ParseBody(text);
  if (!body.ok()) return body.status();
  DetokenizeInput out;
  if (absl::Status s = ReadModel(*body, &out.model); !s.ok()) return s;
  const json* tokens = Field(*body, "tokens");
  tandem::v1::TokenIds ids;
  if (tokens == nullptr || !(tokens->is_array() && (tokens->empty() || TokenIds(*tokens, &ids)))) {
    return Invalid("tokens", "tokens must be a list of token ids");
  }
  for (int32_t id : ids.ids()) {
    if (id < 0 || id >= vocab_size) {
      return Invalid("tokens", absl::StrCat("token id ", id, " is outside the vocabulary [0, ",
                                            vocab_size, ")"));
    }
    out.tokens.push_back(id);
  }
  return out;
}

}  // namespace tandem::gateway
