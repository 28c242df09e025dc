// A Jinja2 template engine for Hugging Face chat templates.
//
// Output is meant to be byte-identical to Python's jinja2 3.1 configured as transformers does
// for chat templates: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
// extensions=[loopcontrols]), default Undefined, plus the globals raise_exception and
// strftime_now and transformers' tojson filter (json.dumps, ensure_ascii=False by default).
// tests/common/chat/jinja_reference_test.cc compares the two on real and synthetic templates.
//
// What callers may assume:
//  - Parse never crashes on any input; syntax errors are INVALID_ARGUMENT "line N: ...".
//  - Render is const and thread-safe (no global state); one parsed template may be rendered
//    from many threads at once.
//  - Render always terminates: every error (raise_exception, undefined values used where
//    jinja2 raises, type errors, sandbox violations) is INVALID_ARGUMENT; exceeding a limit of
//    RenderLimits is RESOURCE_EXHAUSTED naming the limit, or DEADLINE_EXCEEDED.
//  - Values come from `context` (a JSON object): objects are ordered dicts, arrays lists,
//    integers stay integers and floats floats (printed as Python's repr), null is None.
//
// Known differences from jinja2 (none of them seen in published chat templates):
//  - Integers are 64-bit: arithmetic that overflows is an error (Python has big integers).
//  - Unicode case mapping (upper, lower, title, ...) covers ASCII, Latin-1, Greek and Cyrillic
//    (plus 'ß' -> 'SS'); isalpha/isdigit are approximations of Python's.
//  - Generators (select, map, ...) print as "<generator object>" (jinja2 adds an address) and
//    can be iterated more than once; dict.items()/keys()/values() are lists, not views.
//  - safe/escape return plain strings: jinja2's Markup (which escapes what is added to it and
//    prints as Markup('...') inside lists) is not modelled; autoescape is off, as in
//    transformers.
//  - str.format supports only {}, {0} and {name} fields, without format specs.
//  - Not supported: recursive for loops, include/import/extends/block, the filters not listed
//    missing from IsKnownFilter in jinja.cc (groupby, slice, pprint, urlize, xmlattr, ...).
//  - A namespace may not hold a namespace (jinja2 allows it); values nest at most 100 deep and
//    expressions 200 deep (jinja2 would hit Python's recursion limit much later).
//  - Constant folding: jinja2 evaluates constant subexpressions while compiling, with lenient
//    rules (e.g. `(1)[1:]` is undefined there but an error at run time); this engine always
//    applies the run-time rules.
//  - Rendering recurses: about 3 KB of stack per macro call level (max_depth 256 -> ~1 MB).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/util/clock.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {

// Hugging Face's environment: trim_blocks and lstrip_blocks on.
struct JinjaOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

struct RenderLimits {
  size_t max_output_bytes = 1 << 20;  // output (and any one string built) -> RESOURCE_EXHAUSTED
  int64_t max_steps = 10'000'000;     // loop iterations + calls + expression nodes evaluated
  int max_depth = 256;                // nesting of calls/macros/recursion
  util::Instant deadline = util::Instant::Never();  // checked periodically -> DEADLINE_EXCEEDED
  // What strftime_now() formats (in UTC); default absl::Now(). Tests set it for determinism.
  std::function<absl::Time()> now;
};

namespace internal {
struct Program;
}

class JinjaTemplate {
 public:
  // INVALID_ARGUMENT naming the problem and the line (e.g. "line 3: unexpected 'endfor'").
  static absl::StatusOr<JinjaTemplate> Parse(std::string_view source,
                                             const JinjaOptions& options = {});

  // Renders with `context` (an object, or null for none) as the template's globals.
  // raise_exception("msg") -> INVALID_ARGUMENT whose message is msg; other template errors ->
  // INVALID_ARGUMENT naming the problem; limits as in RenderLimits.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                                     const RenderLimits& limits = {}) const;

 private:
  explicit JinjaTemplate(std::shared_ptr<const internal::Program> program)
      : program_(std::move(program)) {}
  std::shared_ptr<const internal::Program> program_;
};

}  // namespace tandem::chat
