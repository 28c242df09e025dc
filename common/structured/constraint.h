// What a request asks its output to be (docs/structured-outputs.md), and the per-engine cache
// that turns it into a CompiledGrammar bound to the engine's vocabulary.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/model/tokenizer.h"
#include "common/structured/grammar.h"
#include "common/structured/matcher.h"

namespace tandem::structured {

struct OutputConstraint {
  enum class Kind { kJsonObject, kJsonSchema, kRegex, kChoice };
  Kind kind = Kind::kJsonObject;
  std::string text;                  // kJsonSchema: the schema as JSON; kRegex: the pattern
  std::vector<std::string> choices;  // kChoice

  // A key that identifies the constraint (equal constraints share a compiled grammar).
  std::string Key() const;
  bool operator==(const OutputConstraint&) const = default;
};

// Limits on a constraint as a request states it.
inline constexpr size_t kMaxPatternBytes = 16 * 1024;
inline constexpr size_t kMaxChoices = 1024;
inline constexpr size_t kMaxChoiceBytes = 4096;

// The constraint's grammar. INVALID_ARGUMENT naming what is malformed or unsupported.
absl::StatusOr<Grammar> CompileConstraint(const OutputConstraint& constraint);

// Compiled grammars of one engine's vocabulary, the most recently used kept. Thread-safe.
class GrammarCache {
 public:
  static constexpr size_t kCapacity = 16;

  // `tokenizer` must outlive the cache; its token table is built on first use.
  explicit GrammarCache(const model::Tokenizer* tokenizer) : tokenizer_(tokenizer) {}

  // The constraint compiled for this vocabulary (the same object for equal constraints while
  // cached). INVALID_ARGUMENT as CompileConstraint.
  absl::StatusOr<std::shared_ptr<CompiledGrammar>> Get(const OutputConstraint& constraint);

 private:
  const model::Tokenizer* const tokenizer_;
  absl::Mutex mu_;
  std::shared_ptr<const TokenTable> tokens_ ABSL_GUARDED_BY(mu_);
  // Most recently used first.
  std::list<std::pair<std::string, std::shared_ptr<CompiledGrammar>>> lru_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::structured
