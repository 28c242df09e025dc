#include "common/structured/constraint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/structured/json_schema.h"

namespace tandem::structured {

std::string OutputConstraint::Key() const {
  std::string key = absl::StrCat(static_cast<int>(kind), ":", text.size(), ":", text);
  for (const std::string& c : choices) absl::StrAppend(&key, ":", c.size(), ":", c);
  return key;
}

absl::StatusOr<Grammar> CompileConstraint(const OutputConstraint& c) {
  switch (c.kind) {
    case OutputConstraint::Kind::kJsonObject:
      return JsonObjectGrammar();
    case OutputConstraint::Kind::kJsonSchema:
      return CompileJsonSchema(c.text);
    case OutputConstraint::Kind::kRegex:
      if (c.text.size() > kMaxPatternBytes) {
        return absl::InvalidArgumentError(absl::StrCat("regular expression of ", c.text.size(),
                                                       " bytes; the limit is ", kMaxPatternBytes));
      }
      return RegexGrammar(c.text);
    case OutputConstraint::Kind::kChoice:
      if (c.choices.size() > kMaxChoices) {
        return absl::InvalidArgumentError(
            absl::StrCat("choice: ", c.choices.size(), " strings; the limit is ", kMaxChoices));
      }
      for (const std::string& s : c.choices) {
        if (s.size() > kMaxChoiceBytes) {
          return absl::InvalidArgumentError(absl::StrCat("choice: a string of ", s.size(),
                                                         " bytes; the limit is ", kMaxChoiceBytes));
        }
      }
      return ChoiceGrammar(c.choices);
  }
  return absl::InvalidArgumentError("unknown constraint kind");
}

absl::StatusOr<std::shared_ptr<CompiledGrammar>> GrammarCache::Get(
    const OutputConstraint& constraint) {
  if (tokenizer_ == nullptr) {
    return absl::InvalidArgumentError(
        "structured outputs need the model's tokenizer; this engine has none");
  }
  const std::string key = constraint.Key();
  std::shared_ptr<const TokenTable> tokens;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      if (it->first == key) {
        lru_.splice(lru_.begin(), lru_, it);
        return lru_.front().second;
      }
    }
    if (tokens_ == nullptr) tokens_ = TokenTable::Build(*tokenizer_);
    tokens = tokens_;
  }
  // Compiled outside the lock: a large schema does not hold up other requests.
  absl::StatusOr<Grammar> grammar = CompileConstraint(constraint);
  if (!grammar.ok()) return grammar.status();
  auto compiled = std::make_shared<CompiledGrammar>(*std::move(grammar), std::move(tokens));
  absl::MutexLock lock(&mu_);
  lru_.emplace_front(key, compiled);
  if (lru_.size() > kCapacity) lru_.pop_back();
  return compiled;
}

}  // namespace tandem::structured
