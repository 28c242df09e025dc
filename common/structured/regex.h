// Regular expressions as grammar rules (guided regex, and JSON Schema's string `pattern`).
//
// The syntax is the common subset of Python's `re`, JavaScript's and ECMA-262's: literals,
// escapes (\d \w \s \D \W \S, \n \t \r \f \v, \xHH, \uHHHH, escaped punctuation), classes
// ([a-z_], [^...]), `.` (any character but a newline), groups ((...), (?:...), named groups),
// alternation, quantifiers (* + ? {n} {n,} {n,m}, each optionally lazy: the language is the
// same), and ^ / $ at the very start / end. Back-references, look-around, word boundaries,
// inline flags and possessive quantifiers are refused with INVALID_ARGUMENT naming them.
// Characters are Unicode code points, emitted as UTF-8.
//
// Catastrophic patterns are harmless here: a pattern becomes a grammar of its own size (a
// bounded repetition {n,m} costs m copies, limited by kMaxRepeat and the grammar's size
// limit), and the matcher keeps a set of distinct states, never backtracking.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/structured/grammar.h"

namespace tandem::structured {

inline constexpr int64_t kMaxRepeat = 10000;

enum class RegexMode {
  kFullMatch,  // the output is exactly a string the pattern matches (guided regex)
  // JSON Schema `pattern`: the characters of a JSON string's value (without its quotes), in
  // which the pattern need only match somewhere (unanchored, as JSON Schema specifies), with
  // '"', '\' and control characters emitted as JSON escapes.
  kJsonStringSearch,
};

// Adds rules for `pattern` to `builder` and returns the one that derives its strings.
// INVALID_ARGUMENT naming the construct and its offset for what is malformed or unsupported.
absl::StatusOr<uint32_t> CompileRegex(std::string_view pattern, RegexMode mode,
                                      GrammarBuilder* builder);

// The rule for one JSON-string character (unescaped or as an escape), the unit JSON string
// lengths count; shared by the regex and JSON Schema compilers.
uint32_t JsonStringCharRule(GrammarBuilder* builder);
// Any number of those characters: a JSON string's contents, shared within one grammar.
uint32_t JsonStringCharsRule(GrammarBuilder* builder);
// The same less the raw ASCII characters: an escape or a non-ASCII character.
uint32_t JsonStringEscapeOrNonAsciiRule(GrammarBuilder* builder);

}  // namespace tandem::structured
