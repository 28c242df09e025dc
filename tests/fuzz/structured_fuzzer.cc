// Structured-output constraints as a client states them: the first byte picks the compiler
// (JSON Schema, regular expression, or choices separated by NUL bytes), the rest is its text.
// A constraint that compiles is then walked by the matcher over a byte-level vocabulary, each
// step taking one token the mask allows, which must be accepted (a JSON Schema's with its
// objects' keys tracked, so a masked-in token never repeats a key).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/structured/constraint.h"
#include "common/structured/matcher.h"
#include "tests/fuzz/fuzz_util.h"

namespace tandem::structured {
namespace {

bool Expected(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument ||
         s.code() == absl::StatusCode::kResourceExhausted ||
         s.code() == absl::StatusCode::kFailedPrecondition;
}

std::shared_ptr<const TokenTable> Vocabulary() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  v.push_back("");  // 256: EOS
  for (const char* t :
       {"{\"", "\":", "\",\"", "true", "false", "null", "}", "]", "\xC3\xA9", "\\u00"}) {
    v.push_back(t);
  }
  return TokenTable::FromBytes(v);
}

void Run(std::string_view data) {
  if (data.empty()) return;
  OutputConstraint c;
  const std::string_view text = data.substr(1);
  switch (static_cast<uint8_t>(data[0]) % 3) {
    case 0:
      c.kind = OutputConstraint::Kind::kJsonSchema;
      c.text = std::string(text);
      break;
    case 1:
      c.kind = OutputConstraint::Kind::kRegex;
      c.text = std::string(text);
      break;
    default:
      c.kind = OutputConstraint::Kind::kChoice;
      for (size_t start = 0;;) {
        const size_t end = text.find('\0', start);
        c.choices.emplace_back(
            text.substr(start, end == std::string_view::npos ? end : end - start));
        if (end == std::string_view::npos) break;
        start = end + 1;
      }
  }
  absl::StatusOr<Grammar> grammar = CompileConstraint(c);
  if (!grammar.ok()) {
    FUZZ_CHECK(grammar.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  static const auto* tokens = new std::shared_ptr<const TokenTable>(Vocabulary());
  auto compiled = std::make_shared<CompiledGrammar>(*std::move(grammar), *tokens);
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(
      compiled, {256}, /*unique_keys=*/c.kind == OutputConstraint::Kind::kJsonSchema);
  if (!m.ok()) {
    FUZZ_CHECK(Expected(m.status()));
    return;
  }
  const int kSteps = 24;
  std::vector<float> logits((*tokens)->vocab_size());
  for (int step = 0; step < kSteps && !m->finished(); ++step) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    const absl::Status s = m->Constrain(absl::MakeSpan(logits), kSteps - step - 1);
    if (!s.ok()) {
      FUZZ_CHECK(Expected(s));
      return;
    }
    std::vector<int32_t> allowed;
    for (size_t t = 0; t < logits.size(); ++t) {
      if (std::isfinite(logits[t])) allowed.push_back(static_cast<int32_t>(t));
    }
    FUZZ_CHECK(!allowed.empty());
    const int32_t token =
        allowed[(static_cast<size_t>(step) * 7919 + data.size()) % allowed.size()];
    const absl::Status accepted = m->Accept(token);
    if (!accepted.ok()) {
      FUZZ_CHECK(accepted.code() == absl::StatusCode::kResourceExhausted);
      return;
    }
    if (token == 256) break;
  }
}

}  // namespace
}  // namespace tandem::structured

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::structured::Run(tandem::fuzz::AsText(data, size));
  return 0;
}
