#include "common/structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/structured/regex.h"
#include "common/util/status.h"
#include "nlohmann/json.hpp"

namespace tandem::structured {
namespace {

// Ordered: object members are written in the order the schema lists its properties.
using json = nlohmann::ordered_json;
using Sequence = GrammarBuilder::Sequence;

// Keywords read for meaning; annotations are accepted and ignored; anything else is refused.
const absl::flat_hash_set<std::string_view>& Annotations() {
  static const auto* set = new absl::flat_hash_set<std::string_view>{
      "title",    "description", "default",  "examples",  "$schema", "$id",
      "$comment", "deprecated",  "readOnly", "writeOnly", "$anchor"};
  return *set;
}
const absl::flat_hash_set<std::string_view>& Supported() {
  static const auto* set = new absl::flat_hash_set<std::string_view>{"type",
                                                                     "properties",
                                                                     "required",
                                                                     "additionalProperties",
                                                                     "enum",
                                                                     "const",
                                                                     "items",
                                                                     "prefixItems",
                                                                     "minItems",
                                                                     "maxItems",
                                                                     "anyOf",
                                                                     "oneOf",
                                                                     "allOf",
                                                                     "$ref",
                                                                     "$defs",
                                                                     "definitions",
                                                                     "minLength",
                                                                     "maxLength",
                                                                     "pattern",
                                                                     "format",
                                                                     "minimum",
                                                                     "maximum",
                                                                     "exclusiveMinimum",
                                                                     "exclusiveMaximum"};
  return *set;
}

// Whether `value` is of `type` (a type name or a list of them).
bool TypeAllows(const json& type, const json& value) {
  if (type.is_array()) {
    return std::any_of(type.begin(), type.end(),
                       [&](const json& t) { return TypeAllows(t, value); });
  }
  if (!type.is_string()) return false;
  const std::string t = type.get<std::string>();
  if (t == "integer") {
    return value.is_number_integer() ||
           (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>());
  }
  return (t == "null" && value.is_null()) || (t == "boolean" && value.is_boolean()) ||
         (t == "number" && value.is_number()) || (t == "string" && value.is_string()) ||
         (t == "array" && value.is_array()) || (t == "object" && value.is_object());
}

// Integers in [lo, hi] (either side open when unset) as a regular expression.
std::string DigitsRange(const std::string& lo, const std::string& hi) {
  // lo and hi have the same number of digits, lo <= hi.
  const size_t n = lo.size();
  if (n == 1) return absl::StrCat("[", lo, "-", hi, "]");
  if (lo[0] == hi[0])
    return absl::StrCat(std::string(1, lo[0]), "(?:", DigitsRange(lo.substr(1), hi.substr(1)), ")");
  const std::string zeros(n - 1, '0'), nines(n - 1, '9');
  std::vector<std::string> parts;
  char first = lo[0];
  if (lo.substr(1) != zeros) {
    parts.push_back(
        absl::StrCat(std::string(1, lo[0]), "(?:", DigitsRange(lo.substr(1), nines), ")"));
    ++first;
  }
  char last = hi[0];
  const bool hi_full = hi.substr(1) == nines;
  if (!hi_full) --last;
  if (first <= last) {
    parts.push_back(
        absl::StrCat("[", std::string(1, first), "-", std::string(1, last), "][0-9]{", n - 1, "}"));
  }
  if (!hi_full) {
    parts.push_back(
        absl::StrCat(std::string(1, hi[0]), "(?:", DigitsRange(zeros, hi.substr(1)), ")"));
  }
  return absl::StrJoin(parts, "|");
}

// Non-negative integers in [lo, hi] (hi unset: unbounded), without leading zeros.
std::string NonNegativeRange(uint64_t lo, std::optional<uint64_t> hi) {
  const std::string a = std::to_string(lo);
  const size_t last = hi.has_value() ? std::to_string(*hi).size() : a.size();
  std::vector<std::string> parts;
  for (size_t digits = a.size(); digits <= last; ++digits) {
    const std::string from =
        digits == a.size() ? a : absl::StrCat("1", std::string(digits - 1, '0'));
    const std::string to =
        hi.has_value() && digits == last ? std::to_string(*hi) : std::string(digits, '9');
    parts.push_back(DigitsRange(from, to));
  }
  if (!hi.has_value()) parts.push_back(absl::StrCat("[1-9][0-9]{", a.size(), ",}"));
  return absl::StrCat("(?:", absl::StrJoin(parts, "|"), ")");
}

const char kDate[] =
    "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|"
    "30)|02-(?:0[1-9]|1[0-9]|2[0-8]))";
const char kTime[] =
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-"
    "5]"
    "[0-9])";
const char kUuid[] = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
const char kIpv4Octet[] = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
const char kEmail[] =
    "[A-Za-z0-9_%+-]+(?:\\.[A-Za-z0-9_%+-]+)*@[A-Za-z0-9-]+(?:\\.[A-Za-z0-9-]+)*\\.[A-Za-z]{2,}";

std::optional<std::string> FormatPattern(std::string_view format) {
  if (format == "date") return std::string(kDate);
  if (format == "time") return std::string(kTime);
  if (format == "date-time") return absl::StrCat(kDate, "T", kTime);
  if (format == "uuid") return std::string(kUuid);
  if (format == "ipv4") return absl::StrCat(kIpv4Octet, "(?:\\.", kIpv4Octet, "){3}");
  if (format == "email") return std::string(kEmail);
  return std::nullopt;
}

// The keyword whose value is at `path` ("#/items" -> items, "#/properties/a" -> properties).
std::string KeywordOf(const std::string& path) {
  const size_t last = path.rfind('/');
  if (last == std::string::npos) return "(schema)";
  const size_t before = path.rfind('/', last - 1);
  const std::string parent =
      before == std::string::npos ? "" : path.substr(before + 1, last - before - 1);
  for (const char* map :
       {"properties", "$defs", "definitions", "prefixItems", "anyOf", "oneOf", "allOf"}) {
    if (parent == map) return parent;
  }
  return path.substr(last + 1);
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json* root) : root_(root) {}

  absl::StatusOr<Grammar> Run() {
    absl::StatusOr<uint32_t> rule = Compile(*root_, "#", 0);
    if (!rule.ok()) return rule.status();
    return std::move(b_).Build(*rule);
  }

  // Any JSON object, for json_object mode.
  absl::StatusOr<Grammar> AnyObject() { return std::move(b_).Build(AnyObjectRule()); }

 private:
  absl::Status Error(const std::string& path, std::string_view keyword, std::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("JSON Schema keyword \"", std::string(keyword),
                                                   "\" at ", path, ": ", std::string(what)));
  }

  Sequence Lit(std::string_view s) { return b_.Literal(s); }
  Element Ref(uint32_t r) { return GrammarBuilder::Ref(r); }

  // An optional single space (after ':' and ',').
  Element Space() {
    uint32_t& r = b_.Shared("space");
    if (r == GrammarBuilder::kNoRule) r = b_.Rule({Lit(" "), {}});
    return Ref(r);
  }
  Sequence Comma() { return {b_.Byte(','), Space()}; }
  Sequence Colon() { return {b_.Byte(':'), Space()}; }

  uint32_t Regex(std::string_view pattern) {
    // Only our own patterns come here; they compile.
    absl::StatusOr<uint32_t> r = CompileRegex(pattern, RegexMode::kFullMatch, &b_);
    return *r;
  }

  uint32_t StringRule() {
    uint32_t& r = b_.Shared("string");
    if (r != GrammarBuilder::kNoRule) return r;
    const uint32_t chars = JsonStringCharsRule(&b_);
    r = b_.Rule({{b_.Byte('"'), Ref(chars), b_.Byte('"')}});
    return r;
  }
  uint32_t IntegerRule() {
    uint32_t& r = b_.Shared("integer");
    if (r == GrammarBuilder::kNoRule) r = Regex("-?(?:0|[1-9][0-9]*)");
    return r;
  }
  uint32_t NumberRule() {
    uint32_t& r = b_.Shared("number");
    if (r == GrammarBuilder::kNoRule) {
      r = Regex("-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?");
    }
    return r;
  }
  uint32_t AnyValueRule() {
    uint32_t& r = b_.Shared("value");
    if (r != GrammarBuilder::kNoRule) return r;
    r = b_.NewRule();
    const uint32_t value = r;
    b_.AddAlternative(value, {Ref(AnyObjectRule())});
    const uint32_t more = b_.Repeat(
        [&] {
          Sequence s = Comma();
          s.push_back(Ref(value));
          return s;
        }(),
        0, GrammarBuilder::kUnbounded);
    b_.AddAlternative(value,
                      {b_.Byte('['), Ref(b_.Rule({{Ref(value), Ref(more)}, {}})), b_.Byte(']')});
    b_.AddAlternative(value, {Ref(StringRule())});
    b_.AddAlternative(value, {Ref(NumberRule())});
    for (std::string_view lit : {"true", "false", "null"}) b_.AddAlternative(value, Lit(lit));
    return value;
  }
  uint32_t AnyObjectRule() {
    uint32_t& r = b_.Shared("object");
    if (r != GrammarBuilder::kNoRule) return r;
    r = b_.NewRule();
    const uint32_t object = r;
    Sequence member = {Ref(StringRule())};
    for (Element e : Colon()) member.push_back(e);
    member.push_back(Ref(AnyValueRule()));
    Sequence next = Comma();
    next.insert(next.end(), member.begin(), member.end());
    const uint32_t more = b_.Repeat(next, 0, GrammarBuilder::kUnbounded);
    Sequence members = member;
    members.push_back(Ref(more));
    b_.AddAlternative(object, {b_.Byte('{'), Ref(b_.Rule({members, {}})), b_.Byte('}')});
    return object;
  }

  // A JSON-string key other than any of `declared` (their JSON texts, quotes included).
  uint32_t OtherKeyRule(const std::vector<std::string>& declared) {
    // Declared keys with escapes or non-ASCII characters are not excluded (their encodings
    // could be spelled another way); a duplicate key is then possible.
    std::vector<std::string> keys;
    for (const std::string& k : declared) {
      const std::string inner = k.substr(1, k.size() - 2);
      const bool plain = std::all_of(inner.begin(), inner.end(), [](char c) {
        return c >= 0x20 && c < 0x7F && c != '\\' && c != '"';
      });
      if (plain) keys.push_back(inner);
    }
    if (keys.empty()) return StringRule();
    // A trie of the declared keys: a new key leaves it with a character no declared key has
    // at that point, or ends where none ends.
    const uint32_t chars = JsonStringCharsRule(&b_);
    const uint32_t escape_or_non_ascii = JsonStringEscapeOrNonAsciiRule(&b_);
    const auto node = [&](auto& self, const std::string& prefix) -> uint32_t {
      std::vector<Sequence> alternatives;
      ByteSet next;
      bool ends_here = false;
      for (const std::string& k : keys) {
        if (!k.starts_with(prefix)) continue;
        if (k.size() == prefix.size()) {
          ends_here = true;
        } else {
          next.set(static_cast<uint8_t>(k[prefix.size()]));
        }
      }
      for (size_t c = 0; c < 256; ++c) {
        if (next.test(c)) {
          alternatives.push_back(
              {b_.Byte(static_cast<uint8_t>(c)), Ref(self(self, prefix + static_cast<char>(c)))});
        }
      }
      if (!ends_here && !prefix.empty()) alternatives.push_back(Lit("\""));
      ByteSet other;
      for (size_t c = 0x20; c < 0x7F; ++c) {
        if (c != '"' && c != '\\' && !next.test(c)) other.set(c);
      }
      if (other.any()) alternatives.push_back({b_.Bytes(other), Ref(chars), b_.Byte('"')});
      alternatives.push_back({Ref(escape_or_non_ascii), Ref(chars), b_.Byte('"')});
      return b_.Rule(alternatives);
    };
    return b_.Rule({{b_.Byte('"'), Ref(node(node, ""))}});
  }

  absl::StatusOr<const json*> Resolve(const std::string& ref, const std::string& path) {
    if (!ref.starts_with("#")) {
      return Error(path, "$ref",
                   absl::StrCat("only references inside the schema (\"#...\") are "
                                "supported, not \"",
                                ref, "\""));
    }
    const json* at = root_;
    if (ref.size() > 1) {
      if (ref[1] != '/') return Error(path, "$ref", absl::StrCat("bad reference \"", ref, "\""));
      try {
        at = &root_->at(json::json_pointer(ref.substr(1)));
      } catch (const std::exception&) {
        return Error(path, "$ref", absl::StrCat("\"", ref, "\" names nothing in the schema"));
      }
    }
    return at;
  }

  absl::StatusOr<uint32_t> Compile(const json& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) return Error(path, "(nesting)", "schema nested too deeply");
    if (b_.too_large()) return Error(path, "(size)", "schema too large");
    if (s.is_boolean()) {
      if (s.get<bool>()) return AnyValueRule();
      return Error(path, "false", "a false schema allows no value");
    }
    if (!s.is_object()) {
      return Error(path, KeywordOf(path), "must be a schema (an object or a boolean)");
    }
    for (const auto& [key, value] : s.items()) {
      if (!Supported().contains(key) && !Annotations().contains(key)) {
        return Error(path, key, "not supported");
      }
    }
    const auto has = [&s](std::string_view key) { return s.contains(std::string(key)); };
    if (has("$defs") && !s["$defs"].is_object()) return Error(path, "$defs", "must be an object");
    if (has("definitions") && !s["definitions"].is_object()) {
      return Error(path, "definitions", "must be an object");
    }
    // Applicators take the whole schema: other constraints beside them are refused.
    const auto alone = [&](std::string_view keyword) -> absl::Status {
      for (const auto& [key, value] : s.items()) {
        if (key == keyword || Annotations().contains(key) || key == "$defs" ||
            key == "definitions") {
          continue;
        }
        return Error(path, key,
                     absl::StrCat("beside \"", std::string(keyword), "\" is not supported"));
      }
      return absl::OkStatus();
    };
    if (has("$ref")) {
      RETURN_IF_ERROR(alone("$ref"));
      if (!s["$ref"].is_string()) return Error(path, "$ref", "must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
      absl::StatusOr<const json*> target = Resolve(ref, path);
      if (!target.ok()) return target.status();
      // Declared first, so a recursive reference finds it.
      const uint32_t rule = b_.NewRule();
      refs_[ref] = rule;
      absl::StatusOr<uint32_t> body = Compile(**target, ref, depth + 1);
      if (!body.ok()) return body.status();
      b_.AddAlternative(rule, {Ref(*body)});
      return rule;
    }
    for (std::string_view keyword : {"anyOf", "oneOf", "allOf"}) {
      if (!has(keyword)) continue;
      RETURN_IF_ERROR(alone(keyword));
      const json& list = s[std::string(keyword)];
      if (!list.is_array() || list.empty()) {
        return Error(path, keyword, "must be a non-empty array of schemas");
      }
      if (keyword == "allOf" && list.size() != 1) {
        return Error(path, keyword, "only a single-schema allOf is supported");
      }
      std::vector<Sequence> alternatives;
      for (size_t i = 0; i < list.size(); ++i) {
        absl::StatusOr<uint32_t> r =
            Compile(list[i], absl::StrCat(path, "/", std::string(keyword), "/", i), depth + 1);
        if (!r.ok()) return r.status();
        alternatives.push_back({Ref(*r)});
      }
      return b_.Rule(alternatives);
    }
    // const and enum list the values; a "type" beside them keeps those of its types.
    if (has("const") || has("enum")) {
      const std::string_view keyword = has("const") ? "const" : "enum";
      json values = json::array();
      if (has("const")) {
        values.push_back(s["const"]);
      } else if (!s["enum"].is_array() || s["enum"].empty()) {
        return Error(path, "enum", "must be a non-empty array");
      } else {
        values = s["enum"];
      }
      std::vector<Sequence> alternatives;
      for (const json& v : values) {
        if (!has("type") || TypeAllows(s["type"], v)) alternatives.push_back(Lit(v.dump()));
      }
      if (alternatives.empty()) return Error(path, keyword, "no value is of the schema's type");
      return b_.Rule(alternatives);
    }
    std::vector<std::string> types;
    if (has("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& one : t) {
          if (!one.is_string()) return Error(path, "type", "must be a string or strings");
          types.push_back(one.get<std::string>());
        }
      } else {
        return Error(path, "type", "must be a string or a non-empty array of strings");
      }
    } else {
      // No type: the type its keywords are about, else any value.
      if (has("properties") || has("required") || has("additionalProperties")) {
        types.push_back("object");
      } else if (has("items") || has("prefixItems") || has("minItems") || has("maxItems")) {
        types.push_back("array");
      } else if (has("minLength") || has("maxLength") || has("pattern") || has("format")) {
        types.push_back("string");
      } else if (has("minimum") || has("maximum") || has("exclusiveMinimum") ||
                 has("exclusiveMaximum")) {
        types.push_back("integer");
      } else {
        return AnyValueRule();
      }
    }
    std::vector<Sequence> alternatives;
    for (const std::string& type : types) {
      absl::StatusOr<uint32_t> r = CompileType(s, type, path, depth);
      if (!r.ok()) return r.status();
      alternatives.push_back({Ref(*r)});
    }
    return b_.Rule(alternatives);
  }

  absl::StatusOr<int64_t> Count(const json& s, std::string_view keyword, const std::string& path,
                                int64_t fallback) {
    if (!s.contains(std::string(keyword))) return fallback;
    const json& v = s[std::string(keyword)];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxRepeat) {
      return Error(path, keyword, absl::StrCat("must be an integer in [0, ", kMaxRepeat, "]"));
    }
    return v.get<int64_t>();
  }

  absl::StatusOr<uint32_t> CompileType(const json& s, const std::string& type,
                                       const std::string& path, int depth) {
    if (type == "null") return b_.Rule({Lit("null")});
    if (type == "boolean") return b_.Rule({Lit("true"), Lit("false")});
    const bool bounded = s.contains("minimum") || s.contains("maximum") ||
                         s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum");
    if (type == "number") {
      for (std::string_view k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
        if (s.contains(std::string(k))) {
          return Error(path, k, "bounds are supported on integers only, not on numbers");
        }
      }
      return NumberRule();
    }
    if (type == "integer") return bounded ? IntegerRange(s, path) : IntegerRule();
    if (type == "string") return StringType(s, path);
    if (type == "array") return ArrayType(s, path, depth);
    if (type == "object") return ObjectType(s, path, depth);
    return Error(path, "type", absl::StrCat("unknown type \"", type, "\""));
  }

  absl::StatusOr<uint32_t> IntegerRange(const json& s, const std::string& path) {
    constexpr double kLimit = 9e15;  // integers a double holds exactly
    std::optional<int64_t> lo, hi;
    for (std::string_view k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(std::string(k))) continue;
      const json& v = s[std::string(k)];
      if (!v.is_number() || std::fabs(v.get<double>()) > kLimit) {
        return Error(path, k, "must be a number of magnitude at most 9e15");
      }
      const double d = v.get<double>();
      if (k == "minimum") lo = std::max(lo.value_or(INT64_MIN), static_cast<int64_t>(std::ceil(d)));
      if (k == "exclusiveMinimum") {
        lo = std::max(lo.value_or(INT64_MIN), static_cast<int64_t>(std::floor(d)) + 1);
      }
      if (k == "maximum")
        hi = std::min(hi.value_or(INT64_MAX), static_cast<int64_t>(std::floor(d)));
      if (k == "exclusiveMaximum") {
        hi = std::min(hi.value_or(INT64_MAX), static_cast<int64_t>(std::ceil(d)) - 1);
      }
    }
    if (lo.has_value() && hi.has_value() && *lo > *hi) {
      return Error(path, "minimum", "no integer lies within the bounds");
    }
    std::vector<std::string> parts;
    if (!lo.has_value() || *lo < 0) {
      // Negative part: magnitudes in [max(1, -hi), -lo].
      const uint64_t from = hi.has_value() && *hi < 0 ? static_cast<uint64_t>(-*hi) : 1;
      std::optional<uint64_t> to;
      if (lo.has_value()) to = static_cast<uint64_t>(-*lo);
      parts.push_back(absl::StrCat("-", NonNegativeRange(from, to)));
    }
    if (!hi.has_value() || *hi >= 0) {
      const uint64_t from = lo.has_value() && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
      std::optional<uint64_t> to;
      if (hi.has_value()) to = static_cast<uint64_t>(*hi);
      parts.push_back(NonNegativeRange(from, to));
    }
    return Regex(absl::StrJoin(parts, "|"));
  }

  absl::StatusOr<uint32_t> StringType(const json& s, const std::string& path) {
    absl::StatusOr<int64_t> min = Count(s, "minLength", path, 0);
    if (!min.ok()) return min.status();
    absl::StatusOr<int64_t> max = Count(s, "maxLength", path, GrammarBuilder::kUnbounded);
    if (!max.ok()) return max.status();
    if (*max != GrammarBuilder::kUnbounded && *max < *min) {
      return Error(path, "minLength", "is above maxLength");
    }
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("pattern") || s.contains("format")) {
      const std::string_view keyword = s.contains("pattern") ? "pattern" : "format";
      if (s.contains("pattern") && s.contains("format")) {
        return Error(path, "format", "together with \"pattern\" is not supported");
      }
      if (lengths) {
        return Error(path, keyword, "together with minLength / maxLength is not supported");
      }
      const json& v = s[std::string(keyword)];
      if (!v.is_string()) return Error(path, keyword, "must be a string");
      uint32_t body;
      if (keyword == "pattern") {
        absl::StatusOr<uint32_t> r =
            CompileRegex(v.get<std::string>(), RegexMode::kJsonStringSearch, &b_);
        if (!r.ok()) return Error(path, "pattern", std::string(r.status().message()));
        body = *r;
      } else {
        const std::optional<std::string> pattern = FormatPattern(v.get<std::string>());
        if (!pattern.has_value()) {
          return Error(path, "format",
                       absl::StrCat("format \"", v.get<std::string>(),
                                    "\" is not supported (date, time, date-time, uuid, ipv4, "
                                    "email are)"));
        }
        body = Regex(*pattern);
      }
      return b_.Rule({{b_.Byte('"'), Ref(body), b_.Byte('"')}});
    }
    if (!lengths) return StringRule();
    const uint32_t chars = b_.Repeat({Ref(JsonStringCharRule(&b_))}, *min, *max);
    return b_.Rule({{b_.Byte('"'), Ref(chars), b_.Byte('"')}});
  }

  absl::StatusOr<uint32_t> ArrayType(const json& s, const std::string& path, int depth) {
    absl::StatusOr<int64_t> min = Count(s, "minItems", path, 0);
    if (!min.ok()) return min.status();
    absl::StatusOr<int64_t> max = Count(s, "maxItems", path, GrammarBuilder::kUnbounded);
    if (!max.ok()) return max.status();
    if (*max != GrammarBuilder::kUnbounded && *max < *min) {
      return Error(path, "minItems", "is above maxItems");
    }
    std::vector<uint32_t> prefix;
    if (s.contains("prefixItems")) {
      const json& list = s["prefixItems"];
      if (!list.is_array()) return Error(path, "prefixItems", "must be an array of schemas");
      for (size_t i = 0; i < list.size(); ++i) {
        absl::StatusOr<uint32_t> r =
            Compile(list[i], absl::StrCat(path, "/prefixItems/", i), depth + 1);
        if (!r.ok()) return r.status();
        prefix.push_back(*r);
      }
    }
    std::optional<uint32_t> items;  // unset: no items after the prefix
    if (!s.contains("items")) {
      items = AnyValueRule();
    } else if (!(s["items"].is_boolean() && !s["items"].get<bool>())) {
      absl::StatusOr<uint32_t> r = Compile(s["items"], path + "/items", depth + 1);
      if (!r.ok()) return r.status();
      items = *r;
    }
    const int64_t n_prefix = static_cast<int64_t>(prefix.size());
    int64_t max_count = *max;
    if (!items.has_value()) {
      if (*min > n_prefix) {
        return Error(path, "minItems", "asks for more items than prefixItems allows");
      }
      max_count =
          max_count == GrammarBuilder::kUnbounded ? n_prefix : std::min(max_count, n_prefix);
    }
    const auto element = [&](int64_t i) { return i < n_prefix ? prefix[i] : *items; };
    // tail(k): the elements from index k on (k >= 1), each after a comma.
    const auto tail = [&](auto& self, int64_t k) -> uint32_t {
      if (max_count != GrammarBuilder::kUnbounded && k >= max_count) return b_.Rule({{}});
      if (k >= n_prefix) {
        if (!items.has_value()) return b_.Rule({{}});
        Sequence next = Comma();
        next.push_back(Ref(*items));
        return b_.Repeat(
            next, std::max<int64_t>(0, *min - k),
            max_count == GrammarBuilder::kUnbounded ? GrammarBuilder::kUnbounded : max_count - k);
      }
      Sequence take = Comma();
      take.push_back(Ref(element(k)));
      take.push_back(Ref(self(self, k + 1)));
      std::vector<Sequence> alternatives = {take};
      if (k >= *min) alternatives.push_back({});
      return b_.Rule(alternatives);
    };
    std::vector<Sequence> alternatives;
    if (max_count != 0) {
      alternatives.push_back({b_.Byte('['), Ref(element(0)), Ref(tail(tail, 1)), b_.Byte(']')});
    }
    if (*min == 0) alternatives.push_back(Lit("[]"));
    if (alternatives.empty()) return Error(path, "maxItems", "allows no array");
    return b_.Rule(alternatives);
  }

  absl::StatusOr<uint32_t> ObjectType(const json& s, const std::string& path, int depth) {
    struct Member {
      std::string key_json;  // the key as JSON text
      uint32_t value;
      bool required;
    };
    std::vector<Member> members;
    absl::flat_hash_set<std::string> required;
    if (s.contains("required")) {
      const json& list = s["required"];
      if (!list.is_array()) return Error(path, "required", "must be an array of strings");
      for (const json& name : list) {
        if (!name.is_string()) return Error(path, "required", "must be an array of strings");
        required.insert(name.get<std::string>());
      }
    }
    absl::flat_hash_set<std::string> declared;
    if (s.contains("properties")) {
      const json& props = s["properties"];
      if (!props.is_object()) return Error(path, "properties", "must be an object of schemas");
      for (const auto& [name, schema] : props.items()) {
        absl::StatusOr<uint32_t> r =
            Compile(schema, absl::StrCat(path, "/properties/", name), depth + 1);
        if (!r.ok()) return r.status();
        members.push_back({json(name).dump(), *r, required.contains(name)});
        declared.insert(name);
      }
    }
    std::optional<uint32_t> extra;  // the value of additional members, when allowed
    if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      if (!(a.is_boolean() && !a.get<bool>())) {
        absl::StatusOr<uint32_t> r = Compile(a, path + "/additionalProperties", depth + 1);
        if (!r.ok()) return r.status();
        extra = *r;
      }
    }
    for (const std::string& name : required) {
      if (declared.contains(name)) continue;
      if (!extra.has_value()) {
        return Error(path, "required",
                     absl::StrCat("\"", name, "\" is required but not among the properties"));
      }
    }
    // Required names that are not declared: members with the additional schema, in order.
    std::vector<std::string> undeclared_required;
    for (const json& name : s.value("required", json::array())) {
      if (!declared.contains(name.get<std::string>()))
        undeclared_required.push_back(name.get<std::string>());
    }
    for (const std::string& name : undeclared_required) {
      members.push_back({json(name).dump(), *extra, true});
    }
    std::vector<std::string> keys;
    for (const Member& m : members) keys.push_back(m.key_json);
    // rest[first](i): the members from i on; `first`: none has been written yet.
    const size_t n = members.size();
    uint32_t rest_first = 0, rest_more = 0;
    if (extra.has_value()) {
      Sequence member = {Ref(OtherKeyRule(keys))};
      for (Element e : Colon()) member.push_back(e);
      member.push_back(Ref(*extra));
      Sequence next = Comma();
      next.insert(next.end(), member.begin(), member.end());
      rest_more = b_.Repeat(next, 0, GrammarBuilder::kUnbounded);
      Sequence first = member;
      first.push_back(Ref(rest_more));
      rest_first = b_.Rule({first, {}});
    } else {
      rest_first = rest_more = b_.Rule({{}});
    }
    for (size_t i = n; i-- > 0;) {
      const Member& m = members[i];
      Sequence pair = Lit(m.key_json);
      for (Element e : Colon()) pair.push_back(e);
      pair.push_back(Ref(m.value));
      Sequence as_first = pair;
      as_first.push_back(Ref(rest_more));
      Sequence as_more = Comma();
      as_more.insert(as_more.end(), pair.begin(), pair.end());
      as_more.push_back(Ref(rest_more));
      std::vector<Sequence> first_alts = {as_first}, more_alts = {as_more};
      if (!m.required) {
        first_alts.push_back({Ref(rest_first)});
        more_alts.push_back({Ref(rest_more)});
      }
      const uint32_t new_more = b_.Rule(more_alts);
      rest_first = b_.Rule(first_alts);
      rest_more = new_more;
    }
    return b_.Rule({{b_.Byte('{'), Ref(rest_first), b_.Byte('}')}});
  }

  const json* root_;
  GrammarBuilder b_;
  absl::flat_hash_map<std::string, uint32_t> refs_;
};

}  // namespace

absl::StatusOr<Grammar> CompileJsonSchema(std::string_view schema_json) {
  if (schema_json.size() > kMaxSchemaBytes) {
    return absl::InvalidArgumentError(absl::StrCat("JSON Schema of ", schema_json.size(),
                                                   " bytes; the limit is ", kMaxSchemaBytes));
  }
  json schema = json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::InvalidArgumentError("JSON Schema is not valid JSON");
  return SchemaCompiler(&schema).Run();
}

absl::StatusOr<Grammar> JsonObjectGrammar() {
  const json empty = json::object();
  return SchemaCompiler(&empty).AnyObject();
}

absl::StatusOr<Grammar> ChoiceGrammar(const std::vector<std::string>& choices) {
  if (choices.empty()) return absl::InvalidArgumentError("choice: at least one string is needed");
  GrammarBuilder b;
  std::vector<GrammarBuilder::Sequence> alternatives;
  for (const std::string& c : choices) {
    if (c.empty()) return absl::InvalidArgumentError("choice: the strings must not be empty");
    alternatives.push_back(b.Literal(c));
  }
  return std::move(b).Build(b.Rule(alternatives));
}

absl::StatusOr<Grammar> RegexGrammar(std::string_view pattern) {
  GrammarBuilder b;
  absl::StatusOr<uint32_t> rule = CompileRegex(pattern, RegexMode::kFullMatch, &b);
  if (!rule.ok()) return rule.status();
  return std::move(b).Build(*rule);
}

}  // namespace tandem::structured
