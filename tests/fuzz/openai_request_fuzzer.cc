// The OpenAI front's request reader (services/router-gateway/openai_request.h) on arbitrary
// bodies, completions and chat (through the shipped tiny model's chat template, tools and
// template arguments included): it never
// throws or crashes, errors are INVALID_ARGUMENT, and what it accepts is within range.
// Input: one byte (odd: chat), then the body.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/model/model_dir.h"
#include "services/router-gateway/openai_request.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr int kContext = 512;
constexpr int kVocab = 8192;

// The shipped tiny model's chat template and generation_config.json, with both reply parsers
// on (so tools and tool_choice are read).
const tandem::gateway::ModelFront& Front() {
  static const auto* front = [] {
    const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/models/tiny-moe";
    auto* f = new tandem::gateway::ModelFront;
    const std::unique_ptr<tandem::model::ModelDir> model =
        tandem::model::ModelDir::Open(dir).value();
    f->chat_template = tandem::chat::ChatTemplate::Load(*model);
    f->reasoning = tandem::chat::ReasoningFormat::kThink;
    f->tool_calls = tandem::chat::ToolCallFormat::kHermes;
    f->generation = model->generation();
    f->context = kContext;
    f->vocab_size = kVocab;
    return f;
  }();
  return *front;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = data[0] % 2 == 1;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  absl::StatusOr<tandem::gateway::CompletionRequest> parsed;
  try {
    parsed = tandem::gateway::ParseCompletionRequest(body, chat, Front());
  } catch (...) {
    std::abort();  // the reader must not throw, whatever the body
  }
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const tandem::v1::SamplingParams& s = parsed->request.sampling();
  // 0 only scores an echoed prompt.
  FUZZ_CHECK(s.max_tokens() >= (parsed->echo ? 0 : 1) && s.max_tokens() < kContext);
  FUZZ_CHECK(s.max_tokens() > 0 || s.has_prompt_logprobs());
  FUZZ_CHECK(parsed->n >= 1 && parsed->n <= parsed->best_of &&
             parsed->best_of <= tandem::gateway::kMaxChoices);
  FUZZ_CHECK(!parsed->stream || parsed->best_of == parsed->n);
  FUZZ_CHECK(parsed->logprobs >= -1 && parsed->logprobs <= tandem::gateway::kMaxLogprobs);
  FUZZ_CHECK(!s.has_logprobs() || (s.logprobs() >= 0 && s.logprobs() <= 20));
  FUZZ_CHECK(s.presence_penalty() >= -2 && s.presence_penalty() <= 2);
  FUZZ_CHECK(s.frequency_penalty() >= -2 && s.frequency_penalty() <= 2);
  FUZZ_CHECK(s.repetition_penalty() >= 0 && s.repetition_penalty() <= 2);
  for (const auto& [id, bias] : s.logit_bias()) {
    FUZZ_CHECK(id >= 0 && id < kVocab && bias >= -100 && bias <= 100);
  }
  FUZZ_CHECK(s.temperature() >= 0 && s.temperature() <= 2);
  FUZZ_CHECK(s.top_p() >= 0 && s.top_p() <= 1);
  FUZZ_CHECK(s.top_k() >= 0);
  FUZZ_CHECK(!parsed->include_usage || parsed->stream);
  FUZZ_CHECK(parsed->request.input_case() != tandem::v1::GenerateRequest::INPUT_NOT_SET);
  return 0;
}
