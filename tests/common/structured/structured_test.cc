// The grammar compilers (JSON Schema, regex, choice) and the matcher, over a vocabulary of
// every single byte plus some multi-byte tokens, checked string by string.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/structured/constraint.h"
#include "common/structured/json_schema.h"
#include "common/structured/matcher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::structured {
namespace {

using ::testing::HasSubstr;

// Tokens 0..255: single bytes; 256: EOS (no bytes); then a few longer ones.
std::vector<std::string> Vocabulary() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  v.push_back("");  // 256: EOS
  for (const char* t :
       {"{\"", "\":", "true", "null", "\"}", "ab", "abc", "12", "\xC3\xA9", "\xC3"}) {
    v.push_back(t);
  }
  return v;
}
constexpr int32_t kEos = 256;

std::shared_ptr<CompiledGrammar> Compile(const OutputConstraint& c) {
  absl::StatusOr<Grammar> g = CompileConstraint(c);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  return std::make_shared<CompiledGrammar>(*std::move(g), TokenTable::FromBytes(Vocabulary()));
}

// Whether `text` is a complete output of the grammar, fed byte by byte.
bool Matches(const std::shared_ptr<CompiledGrammar>& g, const std::string& text) {
  absl::StatusOr<CompiledGrammar::State> s = g->Initial();
  if (!s.ok()) return false;
  s = g->Advance(*s, text);
  return s.ok() && *s != CompiledGrammar::kDead && g->Accepting(*s);
}

OutputConstraint Schema(const std::string& schema) {
  return {OutputConstraint::Kind::kJsonSchema, schema, {}};
}
OutputConstraint Regex(const std::string& pattern) {
  return {OutputConstraint::Kind::kRegex, pattern, {}};
}

TEST(JsonSchemaTest, ObjectsFollowPropertiesRequiredAndAdditional) {
  auto g = Compile(Schema(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array",
      "items": {"type": "string"}, "maxItems": 2}}, "required": ["name"]})"));
  EXPECT_TRUE(Matches(g, R"({"name":"x"})"));
  EXPECT_TRUE(Matches(g, R"({"name": "x", "age": -12, "tags": ["a", "b"]})"));
  EXPECT_TRUE(Matches(g, R"({"name":"a\"b\u00e9\n","tags":[]})"));
  EXPECT_FALSE(Matches(g, R"({"age":1})"));                          // name is required
  EXPECT_FALSE(Matches(g, R"({"name":"x","tags":["a","b","c"]})"));  // maxItems
  EXPECT_FALSE(Matches(g, R"({"name":"x","other":1})"));             // no additional properties
  EXPECT_FALSE(Matches(g, R"({"name":"x","age":01})"));
  EXPECT_FALSE(Matches(g, R"({ "name":"x"})"));     // compact: no free spaces
  EXPECT_FALSE(Matches(g, "{\"name\":\"\x01\"}"));  // raw control character

  auto extra = Compile(Schema(R"({"type": "object", "properties": {"id": {"type": "integer"}},
      "required": ["id"], "additionalProperties": {"type": "boolean"}})"));
  EXPECT_TRUE(Matches(extra, R"({"id":1,"idx":true,"i":false,"x":true})"));
  EXPECT_FALSE(Matches(extra, R"({"id":1,"id":true})"));  // not a declared key again
  EXPECT_FALSE(Matches(extra, R"({"id":1,"x":2})"));
}

TEST(JsonSchemaTest, ScalarsEnumsConstAndCombinators) {
  auto g = Compile(Schema(R"({"anyOf": [{"type": "number"}, {"type": "null"},
      {"enum": ["a", 1, [true], {"k": null}]}, {"const": "c"}]})"));
  for (const char* ok :
       {"0", "-1.5e+3", "3.25", "null", R"("a")", "1", "[true]", R"({"k":null})", R"("c")"}) {
    EXPECT_TRUE(Matches(g, ok)) << ok;
  }
  for (const char* bad : {"01", "1.", ".5", "\"b\"", "[false]", "nul"}) {
    EXPECT_FALSE(Matches(g, bad)) << bad;
  }
  auto typed = Compile(Schema(R"({"type": "string", "enum": ["x", 1]})"));
  EXPECT_TRUE(Matches(typed, R"("x")"));
  EXPECT_FALSE(Matches(typed, "1"));
}

TEST(JsonSchemaTest, IntegerBounds) {
  auto g = Compile(Schema(R"({"type": "integer", "minimum": -15, "exclusiveMaximum": 120})"));
  for (int v = -40; v <= 200; ++v) {
    EXPECT_EQ(Matches(g, std::to_string(v)), v >= -15 && v < 120) << v;
  }
  auto low = Compile(Schema(R"({"type": "integer", "minimum": 7})"));
  for (int v = -3; v <= 1200; ++v) EXPECT_EQ(Matches(low, std::to_string(v)), v >= 7) << v;
  EXPECT_TRUE(Matches(low, "123456789012"));
}

TEST(JsonSchemaTest, StringsLengthsPatternsAndFormats) {
  auto len = Compile(Schema(R"({"type": "string", "minLength": 2, "maxLength": 3})"));
  EXPECT_FALSE(Matches(len, R"("a")"));
  EXPECT_TRUE(Matches(len, R"("ab")"));
  EXPECT_TRUE(Matches(len, "\"a\xC3\xA9\""));  // é is one character
  EXPECT_TRUE(Matches(len, R"("\n\"")"));
  EXPECT_FALSE(Matches(len, R"("abcd")"));
  auto pat = Compile(Schema(R"({"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"})"));
  EXPECT_TRUE(Matches(pat, R"("ABC-12")"));
  EXPECT_FALSE(Matches(pat, R"("ABC-123")"));
  auto search = Compile(Schema(R"({"type": "string", "pattern": "a\"b"})"));  // unanchored
  EXPECT_TRUE(Matches(search, R"("xxa\"byy")"));
  EXPECT_FALSE(Matches(search, R"("ab")"));
  auto date = Compile(Schema(R"({"type": "string", "format": "date-time"})"));
  EXPECT_TRUE(Matches(date, R"("2024-02-28T23:59:01.5+05:30")"));
  EXPECT_FALSE(Matches(date, R"("2024-02-30T23:59:01Z")"));
  auto uuid = Compile(Schema(R"({"format": "uuid"})"));
  EXPECT_TRUE(Matches(uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
  auto ip = Compile(Schema(R"({"type": "string", "format": "ipv4"})"));
  EXPECT_TRUE(Matches(ip, R"("255.0.10.1")"));
  EXPECT_FALSE(Matches(ip, R"("256.0.10.1")"));
}

TEST(JsonSchemaTest, ArraysWithPrefixItemsAndBounds) {
  auto g = Compile(Schema(R"({"type": "array", "prefixItems": [{"type": "integer"},
      {"type": "string"}], "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4})"));
  EXPECT_FALSE(Matches(g, "[]"));
  EXPECT_TRUE(Matches(g, "[1]"));
  EXPECT_TRUE(Matches(g, R"([1,"a",true, false])"));
  EXPECT_FALSE(Matches(g, R"([1,"a",true,false,true])"));
  EXPECT_FALSE(Matches(g, R"(["a"])"));
  auto closed = Compile(Schema(R"({"prefixItems": [{"type": "null"}], "items": false})"));
  EXPECT_TRUE(Matches(closed, "[null]"));
  EXPECT_TRUE(Matches(closed, "[]"));
  EXPECT_FALSE(Matches(closed, "[null,null]"));
}

TEST(JsonSchemaTest, RecursiveReferences) {
  auto g = Compile(Schema(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}}, "$ref": "#/$defs/node"})"));
  EXPECT_TRUE(Matches(g, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(Matches(g, R"({"v":1,"kids":[{}]})"));
  auto root = Compile(Schema(R"({"type": "array", "items": {"anyOf": [{"type": "integer"},
      {"$ref": "#"}]}})"));
  EXPECT_TRUE(Matches(root, "[1,[2,[]],[[3]]]"));
}

TEST(JsonSchemaTest, RefusesWhatItDoesNotSupportNamingTheKeyword) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "strin"})", "\"type\""},
      {R"({"type": "object", "properties": 3})", "\"properties\""},
      {R"({"$ref": "#/$defs/missing"})", "\"$ref\""},
      {R"({"$ref": "http://example.com/s.json"})", "\"$ref\""},
      {R"({"type": "array", "minItems": -1})", "\"minItems\""},
      {R"({"type": "array", "minItems": 5, "maxItems": 2})", "\"minItems\""},
      {R"({"type": "string", "pattern": "(a"})", "\"pattern\""},
      {R"({"type": "string", "pattern": "(a)\\1"})", "\"pattern\""},
      {R"({"not": {"type": "string"}})", "\"not\""},
      {R"({"type": "number", "minimum": 0})", "\"minimum\""},
      {R"({"allOf": [{"type": "string"}, {"minLength": 1}]})", "\"allOf\""},
      {R"({"type": "array", "uniqueItems": true})", "\"uniqueItems\""},
      {R"({"type": "string", "format": "hostname"})", "\"format\""},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"]})",
       "never be completed"},
      {R"({"type": "object", "required": ["a"]})", "\"required\""},
      {"[1", "not valid JSON"},
  };
  for (const auto& [schema, named] : cases) {
    absl::StatusOr<Grammar> g = CompileJsonSchema(schema);
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << schema;
    EXPECT_THAT(g.status().message(), HasSubstr(named)) << schema;
  }
  // Size: nested repetitions share their parts, so they stay small; many large bounded ones
  // are refused, never expanded without end.
  EXPECT_TRUE(
      CompileJsonSchema(R"({"type": "string", "pattern": "^((a{1000}){1000}){1000}$"})").ok());
  std::string many = "^";
  for (int i = 0; i < 120; ++i) many += "a{1,10000}";
  EXPECT_THAT(CompileJsonSchema(absl::StrCat(R"({"type": "string", "pattern": ")", many, "$\"}"))
                  .status()
                  .message(),
              HasSubstr("too large"));
  EXPECT_FALSE(CompileJsonSchema(std::string(kMaxSchemaBytes + 1, ' ')).ok());
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += R"({"type": "array", "items": )";
  deep += "true";
  for (int i = 0; i < 200; ++i) deep += "}";
  EXPECT_THAT(CompileJsonSchema(deep).status().message(), HasSubstr("nested too deeply"));
}

TEST(RegexTest, FullMatchSyntax) {
  auto g = Compile(Regex(R"((?:\+1[ -])?\(?\d{3}\)?[ -]?\d{3}-\d{4})"));
  EXPECT_TRUE(Matches(g, "+1 (555) 123-4567"));
  EXPECT_TRUE(Matches(g, "555123-4567"));
  EXPECT_FALSE(Matches(g, "555-123-456"));
  auto cls = Compile(Regex(R"([^a-c\d]+x?|é{2}|\u00e8.)"));
  EXPECT_TRUE(Matches(cls, "zz\xC3\xA9"));
  EXPECT_FALSE(Matches(cls, "zb"));
  EXPECT_TRUE(Matches(cls, "\xC3\xA9\xC3\xA9"));
  EXPECT_TRUE(Matches(cls, "\xC3\xA8q"));
  auto dot = Compile(Regex("x.y"));
  EXPECT_TRUE(Matches(dot, "x\xC3\xA8y"));
  EXPECT_FALSE(Matches(dot, "x\ny"));
  // Catastrophic for a backtracking engine; a set of states here.
  auto evil = Compile(Regex("(a*)*b|(a|aa)+c"));
  EXPECT_TRUE(Matches(evil, std::string(40, 'a') + "c"));
  EXPECT_FALSE(Matches(evil, std::string(40, 'a')));
  for (const char* bad :
       {"a{3,1}", "(?=a)", "a++", "[b-a]", "\\b", "(?i)a", "a{100000}", "*", "[a"}) {
    absl::StatusOr<Grammar> r = CompileConstraint(Regex(bad));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ChoiceTest, PrefixesOfEachOther) {
  auto g = Compile({OutputConstraint::Kind::kChoice, "", {"yes", "yes, definitely", "no"}});
  EXPECT_TRUE(Matches(g, "yes"));
  EXPECT_TRUE(Matches(g, "yes, definitely"));
  EXPECT_FALSE(Matches(g, "yes,"));
  EXPECT_FALSE(CompileConstraint({OutputConstraint::Kind::kChoice, "", {}}).ok());
  EXPECT_FALSE(CompileConstraint({OutputConstraint::Kind::kChoice, "", {""}}).ok());
}

TEST(MatcherTest, MasksMultiByteTokensAndAllowsEndOnlyWhenComplete) {
  auto g = Compile(Schema(R"({"type": "object", "properties": {"a": {"type": "boolean"}},
      "required": ["a"]})"));
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(g, {kEos});
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<std::string> vocab = Vocabulary();
  const auto allowed = [&](int tokens_left) {
    std::vector<float> logits(vocab.size() + 3, 0.0f);  // a padded model vocabulary
    EXPECT_TRUE(m->Constrain(absl::MakeSpan(logits), tokens_left).ok());
    std::vector<std::string> out;
    for (size_t t = 0; t < logits.size(); ++t) {
      if (std::isfinite(logits[t])) out.push_back(t == kEos ? "<eos>" : vocab[t]);
    }
    return out;
  };
  EXPECT_THAT(allowed(100), ::testing::UnorderedElementsAre("{", "{\""));
  ASSERT_TRUE(m->Accept(257).ok());  // {"
  EXPECT_THAT(allowed(100), ::testing::UnorderedElementsAre("a"));
  EXPECT_FALSE(m->Accept('b').ok());
  ASSERT_TRUE(m->Accept('a').ok());
  ASSERT_TRUE(m->Accept(258).ok());  // ":
  EXPECT_THAT(allowed(100), ::testing::UnorderedElementsAre(" ", "t", "f", "true"));
  ASSERT_TRUE(m->Accept(259).ok());  // true
  EXPECT_FALSE(m->finished());
  EXPECT_THAT(allowed(100), ::testing::UnorderedElementsAre("}"));
  ASSERT_TRUE(m->Accept('}').ok());
  EXPECT_TRUE(m->finished());
}

TEST(MatcherTest, BudgetClosesTheValueInTime) {
  // Unbounded strings and arrays: with few tokens left the mask steers to the shortest end.
  auto g = Compile(Schema(R"({"type": "object", "properties": {"s": {"type": "array",
      "items": {"type": "string"}}}, "required": ["s"]})"));
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(g, {kEos});
  ASSERT_TRUE(m.ok());
  const std::vector<std::string> vocab = Vocabulary();
  // A greedy "model" that always prefers 'x', then '"', then anything else: unconstrained by
  // a budget it would write x forever inside a string.
  std::string out;
  const int max_tokens = 40;
  for (int i = 0; i < max_tokens && !m->finished(); ++i) {
    std::vector<float> logits(vocab.size(), 0.0f);
    logits['x'] = 3;
    logits['"'] = 2;
    logits['['] = 1;
    ASSERT_TRUE(m->Constrain(absl::MakeSpan(logits), max_tokens - i - 1).ok());
    int32_t best = 0;
    for (size_t t = 1; t < logits.size(); ++t) {
      if (logits[t] > logits[best]) best = static_cast<int32_t>(t);
    }
    if (best == kEos) break;
    ASSERT_TRUE(m->Accept(best).ok());
    out += vocab[best];
  }
  EXPECT_TRUE(m->finished()) << out;
  EXPECT_LE(out.size(), 40u);
  EXPECT_TRUE(Matches(g, out)) << out;
}

TEST(MatcherTest, NoKeyTwiceInAnObject) {
  auto g = Compile({OutputConstraint::Kind::kJsonObject, "", {}});
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(g, {kEos}, /*unique_keys=*/true);
  ASSERT_TRUE(m.ok());
  for (const char* piece : {"{\"", "a", "\":", "1", ",", "\"", "b", "\":", "{\"", "a", "\":", "2",
                            "}", ",", "\"", "a"}) {
    ASSERT_TRUE(
        m->Accept(piece[1] == 0 ? piece[0] : (piece == std::string("{\"") ? 257 : 258)).ok())
        << piece;
  }
  // "a" again at the top: the closing quote (alone or in \": or \"}) is masked; "ab" is fine.
  std::vector<float> logits(Vocabulary().size(), 0.0f);
  ASSERT_TRUE(m->Constrain(absl::MakeSpan(logits), 100).ok());
  EXPECT_FALSE(std::isfinite(logits['"']));
  EXPECT_FALSE(std::isfinite(logits[258]));
  EXPECT_TRUE(std::isfinite(logits['b']));
  EXPECT_EQ(m->Accept('"').code(), absl::StatusCode::kInvalidArgument);
  JsonKeyTracker keys;
  ASSERT_TRUE(keys.Feed(R"({"x":{"y":1},"z":[{"x":1,"y":2}],"q\"":1)"));
  EXPECT_TRUE(keys.WouldRepeat(R"(,"x")"));
  EXPECT_FALSE(keys.WouldRepeat(R"(,"y")"));
  EXPECT_TRUE(keys.WouldRepeat(R"(,"w":{"k":1,"k")"));
  EXPECT_FALSE(keys.Feed(R"(,"q\"")"));
}

TEST(MatcherTest, AmbiguityIsBoundedWithAClearError) {
  // 40 x 40 ways to read a run of bytes: past the limit of readings, RESOURCE_EXHAUSTED.
  auto g = Compile(Regex("([^x]{1,40}){2,40}"));
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(g, {kEos});
  ASSERT_TRUE(m.ok());
  absl::Status status;
  for (int i = 0; i < 200 && status.ok(); ++i) {
    std::vector<float> logits(Vocabulary().size(), 0.0f);
    status = m->Constrain(absl::MakeSpan(logits), 1000);
    if (status.ok()) status = m->Accept('a');
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("ambiguous"));
}

TEST(MatcherTest, NoTokenContinuesIsAnError) {
  // A vocabulary without the byte '7'.
  std::vector<std::string> vocab = {"1", "2", ""};
  auto g = std::make_shared<CompiledGrammar>(*CompileConstraint(Regex("7")),
                                             TokenTable::FromBytes(vocab));
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(g, {2});
  ASSERT_TRUE(m.ok());
  std::vector<float> logits(3, 0.0f);
  EXPECT_EQ(m->Constrain(absl::MakeSpan(logits), 10).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem::structured
