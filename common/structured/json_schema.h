// JSON Schema (draft 2020-12, the subset structured outputs use) as a grammar of its
// instances' JSON text (docs/structured-outputs.md has the table of keywords).
//
// The text is compact JSON: no whitespace but an optional single space after ':' and ','.
// Object members come in the order of `properties`, required ones always, optional ones
// possibly left out; extra members (additionalProperties true or a schema; absent counts as
// false, as in OpenAI's strict mode) come after them, with keys other than the declared
// ones. `oneOf` is compiled as `anyOf` (exclusivity is not enforced). Keywords outside the
// subset are refused with INVALID_ARGUMENT naming the keyword and where it is.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "common/structured/grammar.h"

namespace tandem::structured {

// Limits on a schema (beyond the grammar's size limit).
inline constexpr size_t kMaxSchemaBytes = 256 * 1024;
inline constexpr int kMaxSchemaDepth = 64;

// `schema_json`: the schema as JSON text.
absl::StatusOr<Grammar> CompileJsonSchema(std::string_view schema_json);

// Any JSON object (response_format json_object).
absl::StatusOr<Grammar> JsonObjectGrammar();

// One of `choices`, exactly (guided_choice). INVALID_ARGUMENT for none or an empty one.
absl::StatusOr<Grammar> ChoiceGrammar(const std::vector<std::string>& choices);

// Exactly the strings `pattern` matches (guided regex; regex.h has the syntax).
absl::StatusOr<Grammar> RegexGrammar(std::string_view pattern);

}  // namespace tandem::structured
