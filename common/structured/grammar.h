// The grammar every structured-output constraint compiles to (docs/structured-outputs.md): a
// context-free grammar over bytes, in the shape llama.cpp's GBNF engine runs. A rule is a list
// of alternatives; an alternative is a sequence of elements, each a set of bytes (one byte of
// output) or a reference to a rule. JSON Schemas, regular expressions and choices are all
// built with GrammarBuilder and checked by Build: size limits, references, and that the root
// can end at all (a grammar that can never be completed is refused).
#pragma once

#include <bitset>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::structured {

using ByteSet = std::bitset<256>;

struct Element {
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = Kind::kEnd;
  uint32_t value = 0;  // kBytes: index into Grammar::byte_sets; kRule: a rule id
};

// What a built grammar holds. Immutable, so shared freely across threads.
struct Grammar {
  static constexpr uint32_t kInfinite = UINT32_MAX;

  // elements: the alternatives' sequences, each ending with a kEnd element.
  std::vector<Element> elements;
  // rules[r]: the positions in `elements` where rule r's alternatives start.
  std::vector<std::vector<uint32_t>> rules;
  std::vector<ByteSet> byte_sets;
  uint32_t root = 0;
  // The fewest bytes rule r derives (kInfinite: none; never for a rule Build accepts), and the
  // fewest bytes from element position p to the end of its sequence.
  std::vector<uint32_t> rule_min_bytes;
  std::vector<uint32_t> min_rest;
};

// Limits on what a request may compile into (refused with INVALID_ARGUMENT, never truncated).
inline constexpr size_t kMaxGrammarElements = 1 << 20;

// Builds a Grammar. Rules may be declared before their alternatives are added (recursion).
class GrammarBuilder {
 public:
  using Sequence = std::vector<Element>;

  // A rule with no alternatives yet.
  uint32_t NewRule();
  void AddAlternative(uint32_t rule, const Sequence& sequence);
  // A new rule with these alternatives.
  uint32_t Rule(const std::vector<Sequence>& alternatives);

  Element Bytes(const ByteSet& set);
  Element Byte(uint8_t byte);
  static Element Ref(uint32_t rule) { return {Element::Kind::kRule, rule}; }
  // The bytes of `text`, one element each.
  Sequence Literal(std::string_view text);
  // A rule deriving `sequence` repeated min..max times (max kUnbounded: no upper bound).
  static constexpr int64_t kUnbounded = -1;
  uint32_t Repeat(const Sequence& sequence, int64_t min, int64_t max);

  // A rule shared by name within one grammar (e.g. "a JSON string character"): the slot holds
  // kNoRule until the caller stores the rule it built.
  static constexpr uint32_t kNoRule = UINT32_MAX;
  uint32_t& Shared(std::string_view name) {
    return shared_.try_emplace(std::string(name), kNoRule).first->second;
  }

  // Whether the grammar has grown past kMaxGrammarElements (compilers stop early on it).
  bool too_large() const { return elements_.size() > kMaxGrammarElements; }

  // INVALID_ARGUMENT when the grammar is too large, a rule has no alternatives, or the root
  // can derive no finite string.
  absl::StatusOr<Grammar> Build(uint32_t root) &&;

 private:
  std::vector<Element> elements_;
  std::vector<std::vector<uint32_t>> rules_;
  std::vector<ByteSet> byte_sets_;
  std::map<std::string, uint32_t> shared_;
};

}  // namespace tandem::structured
