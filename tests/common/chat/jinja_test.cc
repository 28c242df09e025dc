// Unit tests of the Jinja engine (common/chat/jinja.h): each construct chat templates use,
// with expected output written by hand (jinja_reference_test.cc compares with Python's jinja2).
#include "common/chat/jinja.h"

#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/util/clock.h"
#include "nlohmann/json.hpp"

namespace tandem::chat {
namespace {

using Json = nlohmann::ordered_json;
using ::testing::HasSubstr;

absl::StatusOr<std::string> Render(const std::string& source, const std::string& context = "{}",
                                   const RenderLimits& limits = {}) {
  absl::StatusOr<JinjaTemplate> t = JinjaTemplate::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(Json::parse(context), limits);
}

std::string R(const std::string& source, const std::string& context = "{}") {
  absl::StatusOr<std::string> out = Render(source, context);
  if (!out.ok()) return "ERROR: " + std::string(out.status().message());
  return *out;
}

TEST(Jinja, TextAndExpressions) {
  EXPECT_EQ(R("Hello {{ name }}!", R"({"name": "World"})"), "Hello World!");
  EXPECT_EQ(R("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }}"), "7 9 64");
  EXPECT_EQ(R("{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 4 / 2 }}"), "3.5 3 2 2.0");
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ none }} {{ 'x' + 'y' }} {{ 'ab' * 2 }}"), "a1None xy abab");
  EXPECT_EQ(R("{{ 1 if x else 2 }}|{{ 1 if x }}|", R"({"x": false})"), "2||");
  EXPECT_EQ(R("{{ not a and b or c }}", R"({"a": false, "b": 0, "c": "c"})"), "c");
  EXPECT_EQ(R("{{ 1 < 2 < 3 }} {{ 2 in [1, 2] }} {{ 'b' not in 'abc' }}"), "True True False");
  EXPECT_EQ(R("{# comment #}x"), "x");
}

TEST(Jinja, PrintsPythonValues) {
  EXPECT_EQ(R("{{ true }} {{ false }} {{ none }} {{ 1.0 }} {{ 0.1 }} {{ 1e20 }} {{ 1e-5 }}"),
            "True False None 1.0 0.1 1e+20 1e-05");
  EXPECT_EQ(R("{{ [1, 'a', none, true, 2.5] }}"), "[1, 'a', None, True, 2.5]");
  EXPECT_EQ(R("{{ {'a': 1, 'b': (1,)} }} {{ (1, 2) }}"), "{'a': 1, 'b': (1,)} (1, 2)");
  EXPECT_EQ(R("{{ [\"it's\", 'q\"', 'n\\n'] }}"), R"(["it's", 'q"', 'n\n'])");
  EXPECT_EQ(R("{{ x }}", R"({"x": {"k": [1.5, null]}})"), "{'k': [1.5, None]}");
}

TEST(Jinja, TrimBlocksAndLstripBlocks) {
  EXPECT_EQ(R("a\n  {% if true %}\n    b\n  {% endif %}\nc"), "a\n    b\nc");
  EXPECT_EQ(R("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(R("x\n  {%+ if true %}y{% endif %}"), "x\n  y");
  EXPECT_EQ(R("{% for i in [1, 2] %}\n{{ i }}\n{% endfor %}\n"), "1\n2\n");
  EXPECT_EQ(R("  {{ 'v' }}  \n"), "  v  ");  // lstrip_blocks leaves {{ }} alone
  EXPECT_EQ(R("a\n  {# c #}\nb"), "a\nb");
  EXPECT_EQ(R("a {{- ' b ' -}} c"), "a b c");
  EXPECT_EQ(R("l1\r\nl2\r\n"), "l1\nl2");  // newlines normalized, one trailing dropped
  EXPECT_EQ(R("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(Jinja, ScopingMatchesJinja2) {
  // A set inside a loop stays in the iteration; inside an if it does not open a scope.
  EXPECT_EQ(R("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}"),
            "231");
  EXPECT_EQ(R("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}"), "2");
  EXPECT_EQ(R("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}"
              "{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(R("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(R("{% set x %}in {{ 1 }}{% endset %}[{{ x }}]"), "[in 1]");
  EXPECT_EQ(R("{% macro m(a, b='d') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}"),
            "1d12");
  EXPECT_THAT(R("{% set n = 1 %}{% set n.x = 2 %}"), HasSubstr("non-namespace"));
}

TEST(Jinja, LoopVariables) {
  EXPECT_EQ(R("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
              "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }} {% endfor %}"),
            "1032TrueFalse3 2121FalseFalse3 3210FalseTrue3 ");
  EXPECT_EQ(R("{% for x in [1, 2, 3] %}{{ loop.previtem }}{{ loop.nextitem }}"
              "{{ loop.cycle('a', 'b') }},{% endfor %}"),
            "2a,13b,2a,");
  EXPECT_EQ(R("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}"),
            "2/2 4/2 ");
  EXPECT_EQ(R("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for i in range(9) %}{% if i == 4 %}{% break %}{% endif %}"
              "{% if i is odd %}{% continue %}{% endif %}{{ i }}{% endfor %}"),
            "02");
  EXPECT_EQ(
      R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", R"({"d": {"b": 1, "a": 2}})"),
      "b=1;a=2;");
}

TEST(Jinja, Filters) {
  const std::string ctx =
      R"({"xs": [3, 1, 2], "s": "  Hi You  ", "ps": [{"n": "b", "a": 2}, {"n": "a", "a": 1}]})";
  EXPECT_EQ(
      R("{{ xs | length }} {{ xs | first }} {{ xs | last }} {{ xs | sort }} {{ xs | sum }}", ctx),
      "3 3 2 [1, 2, 3] 6");
  EXPECT_EQ(R("{{ s | trim }}|{{ s | upper }}|{{ s | lower | trim | capitalize }}", ctx),
            "Hi You|  HI YOU  |Hi you");
  EXPECT_EQ(R("{{ xs | join(', ') }} {{ ps | map(attribute='n') | join }} "
              "{{ ps | sort(attribute='a') | map(attribute='n') | list }}",
              ctx),
            "3, 1, 2 ba ['a', 'b']");
  EXPECT_EQ(R("{{ ps | selectattr('a', 'gt', 1) | map(attribute='n') | list }} "
              "{{ xs | select('odd') | list }} {{ xs | reject('odd') | list }}",
              ctx),
            "['b'] [3, 1] [2]");
  EXPECT_EQ(R("{{ u | default('d') }} {{ '' | default('d', true) }} {{ 'a' | d('x') }}", ctx),
            "d d a");
  EXPECT_EQ(R("{{ '3' | int + 1 }} {{ 'x' | int }} {{ '2.5' | float }} {{ 2.5 | round }} "
              "{{ -3 | abs }} {{ 42 | string }}"),
            "4 0 2.5 2.0 3 42");
  EXPECT_EQ(
      R("{{ 'a b' | replace(' ', '_') }} {{ 'abc' | reverse }} {{ [1, 1, 2] | unique | list }}"),
      "a_b cba [1, 2]");
  EXPECT_EQ(R("{{ 'a\nb' | indent(2) }}|{{ 'x' | center(5) }}|{{ 'a b c' | wordcount }}"),
            "a\n  b|  x  |3");
  EXPECT_EQ(R("{{ '<&>' | e }} {{ '<b>' | safe }} {{ 'hello world' | title }}"),
            "&lt;&amp;&gt; <b> Hello World");
  EXPECT_EQ(R("{{ {'b': 1, 'a': 2} | dictsort }} {{ {'a': 1} | items | list }}"),
            "[('a', 2), ('b', 1)] [('a', 1)]");
  EXPECT_EQ(R("{{ '%s=%d' | format('x', 3) }} {{ xs | min }} {{ xs | max }}", ctx), "x=3 1 3");
  EXPECT_EQ(R("{% filter upper %}abc{% endfilter %}"), "ABC");
}

TEST(Jinja, TojsonIsPythonJsonDumps) {
  EXPECT_EQ(R("{{ x | tojson }}", R"({"x": {"a": [1, 2.0, "é\"\n", null, true]}})"),
            R"({"a": [1, 2.0, "é\"\n", null, true]})");
  EXPECT_EQ(R("{{ '日本🎉' | tojson }} {{ '日本🎉' | tojson(ensure_ascii=true) }}"),
            R"("日本🎉" "\u65e5\u672c\ud83c\udf89")");
  EXPECT_EQ(R("{{ {'b': 1, 'a': [1]} | tojson(indent=2, sort_keys=true) }}"),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": 1\n}");
  EXPECT_EQ(R("{{ {'a': 1, 'b': 2} | tojson(separators=(',', ':')) }}"), R"({"a":1,"b":2})");
  EXPECT_EQ(R("{{ '\\u0001\\t<' | tojson }}"), R"("\u0001\t<")");
}

TEST(Jinja, SlicingAndSubscripts) {
  const std::string ctx = R"({"xs": [1, 2, 3, 4], "s": "héllo", "d": {"k": {"j": 5}}})";
  EXPECT_EQ(R("{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[-1] }}", ctx),
            "[2, 3, 4] [1, 2, 3] [4, 3, 2, 1] [1, 3] 4");
  EXPECT_EQ(R("{{ s[1:3] }} {{ s[::-1] }} {{ s[1] }} {{ s | length }}", ctx), "él olléh é 5");
  EXPECT_EQ(R("{{ d.k.j }} {{ d['k']['j'] }} {{ d.k['j'] }} {{ xs.0 }} {{ d.missing }}|", ctx),
            "5 5 5 1 |");
}

TEST(Jinja, StringAndDictMethods) {
  EXPECT_EQ(R("{{ ' a '.strip() }}|{{ 'xax'.strip('x') }}|{{ '\n\na'.lstrip('\n') }}|"
              "{{ 'a '.rstrip() }}|"),
            "a|a|a|a|");
  EXPECT_EQ(R("{{ 'a,b,c'.split(',') }} {{ 'a b'.split() }} {{ 'a,b,c'.rsplit(',', 1) }}"),
            "['a', 'b', 'c'] ['a', 'b'] ['a,b', 'c']");
  EXPECT_EQ(R("{{ 'abc'.startswith('a') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'abc'.find('c') }}"),
            "True True 2");
  EXPECT_EQ(R("{{ d.get('a') }} {{ d.get('z', 0) }} {{ d.keys() | list }} {{ d.values() | list }}",
              R"({"d": {"a": 1}})"),
            "1 0 ['a'] [1]");
  EXPECT_EQ(R("{{ 'Hi {}'.format('x') }} {{ '-'.join(['a', 'b']) }} {{ 'ab'.upper() }}"),
            "Hi x a-b AB");
}

TEST(Jinja, Tests) {
  EXPECT_EQ(R("{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 'a' is string }} "
              "{{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ {} is mapping }}",
              R"({"x": 1})"),
            "True True True True True True True True");
  EXPECT_EQ(R("{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 1 is eq 1 }} "
              "{{ true is true }} {{ false is false }} {{ [] is iterable }} {{ 'a' is lower }}"),
            "True True True True True True True True");
}

// Behaviours of jinja2 that follow from how it is written, kept on purpose.
TEST(Jinja, Jinja2Quirks) {
  // select/map/... are generators: always true, even when empty, and have no length.
  EXPECT_EQ(R("{% if [] | select %}T{% else %}F{% endif %}"), "T");
  EXPECT_THAT(R("{{ [1] | select | length }}"), HasSubstr("no len()"));
  // A for loop's else runs unless an iteration reached the end of its body.
  EXPECT_EQ(R("{% for i in [1, 2] %}{% continue %}{% else %}E{% endfor %}"), "E");
  EXPECT_EQ(R("{% for i in [1, 2] %}{% if i == 2 %}{% break %}{% endif %}{% else %}E{% endfor %}"),
            "");
  // Tags end only where brackets balance; range() prints as Python's range.
  EXPECT_EQ(R("{{ {'a': {'b': 1}} }} {{ range(3) }}"), "{'a': {'b': 1}} range(0, 3)");
  // Slicing bypasses jinja2's lenient item lookup.
  EXPECT_THAT(R("{{ n[1:] }}", R"({"n": 5})"), HasSubstr("not subscriptable"));
}

TEST(Jinja, UndefinedBehavesLikeJinja2) {
  EXPECT_EQ(R("[{{ u }}] {{ u is defined }} {{ u | length }} {{ not u }}"
              "{% for x in u %}x{% endfor %}"),
            "[] False 0 True");
  EXPECT_EQ(R("{{ d.missing }}|{{ d['missing'] }}|", R"({"d": {}})"), "||");
  absl::StatusOr<std::string> out = Render("{{ d.missing.deeper }}", R"({"d": {}})");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("'dict object' has no attribute 'missing'"));
  out = Render("{{ nothing() }}");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("'nothing' is undefined"));
  out = Render("{{ u + 1 }}");
  EXPECT_THAT(out.status().message(), HasSubstr("'u' is undefined"));
}

TEST(Jinja, ImmutableSandboxRefusesMutation) {
  absl::StatusOr<std::string> out = Render("{{ xs.append(1) }}", R"({"xs": []})");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("unsafe"));
  out = Render("{% set _ = d.update({'a': 1}) %}", R"({"d": {}})");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  absl::StatusOr<JinjaTemplate> t = JinjaTemplate::Parse("a\nb\n{% endfor %}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), "line 3: unexpected 'endfor'");
  t = JinjaTemplate::Parse("{% if x %}\nunclosed");
  EXPECT_THAT(t.status().message(), HasSubstr("expected 'endif'"));
  t = JinjaTemplate::Parse("\n{{ 1 + }}");
  EXPECT_THAT(t.status().message(), HasSubstr("line 2:"));
  t = JinjaTemplate::Parse("{{ x | nosuchfilter }}");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("nosuchfilter"));
  // Inside an if, jinja2 only fails when the filter runs.
  EXPECT_EQ(R("{% if false %}{{ x | nosuchfilter }}{% endif %}ok"), "ok");
  EXPECT_THAT(R("{% if true %}{{ x | nosuchfilter }}{% endif %}"), HasSubstr("nosuchfilter"));
  EXPECT_FALSE(JinjaTemplate::Parse("{{ " + std::string(1000, '(')).ok());
  EXPECT_FALSE(
      JinjaTemplate::Parse("{{ " + std::string(1000, '[') + std::string(1000, ']') + " }}").ok());
}

TEST(Jinja, RaiseExceptionMessage) {
  absl::StatusOr<std::string> out =
      Render("{% if x %}{{ raise_exception('Roles must alternate') }}{% endif %}", R"({"x": 1})");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "Roles must alternate");
}

TEST(Jinja, StrftimeNowUsesTheGivenClock) {
  RenderLimits limits;
  limits.now = [] { return absl::FromUnixSeconds(1767225600); };  // 2026-01-01 00:00:00 UTC
  absl::StatusOr<std::string> out = Render("{{ strftime_now('%d %B %Y %H:%M') }}", "{}", limits);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "01 January 2026 00:00");
}

TEST(Jinja, OutputLimit) {
  RenderLimits limits;
  limits.max_output_bytes = 1000;
  absl::StatusOr<std::string> out =
      Render("{% for i in range(1000) %}xx{% endfor %}", "{}", limits);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(out.status().message(), HasSubstr("max_output_bytes"));
  // Strings built in expressions count too.
  out = Render("{% set s = 'x' * 100000 %}", "{}", limits);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(Jinja, StepLimit) {
  // As in jinja2's sandbox, range() refuses more than 100000 items.
  absl::StatusOr<std::string> out = Render("{% for i in range(100000000) %}{% endfor %}");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("Range too big"));
  RenderLimits limits;
  limits.max_steps = 100000;
  out = Render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
               "{}", limits);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(out.status().message(), HasSubstr("max_steps"));
  // The default limit stops the nested loop (10^10 iterations) too.
  out = Render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(Jinja, Deadline) {
  RenderLimits limits;
  limits.deadline = util::Instant::Now() - absl::Seconds(1);
  absl::StatusOr<std::string> out =
      Render("{% for i in range(100000) %}{% for j in range(100) %}{% endfor %}{% endfor %}", "{}",
             limits);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(Jinja, RecursionDepth) {
  absl::StatusOr<std::string> out =
      Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(out.status().message(), HasSubstr("max_depth"));
  EXPECT_EQ(R("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
              "{{ f(3) }}"),
            "321");
}

constexpr char kQwenLike[] = R"({%- for message in messages %}
    {%- if message.role == "assistant" and '</think>' in message.content %}
        {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
    {%- else %}
        {%- set content = message.content %}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %})";

Json TenMessages() {
  Json messages = Json::array();
  messages.push_back({{"role", "system"}, {"content", "You are helpful."}});
  for (int i = 0; i < 9; ++i) {
    messages.push_back({{"role", i % 2 == 0 ? "user" : "assistant"},
                        {"content", i % 2 == 0 ? "Question " + std::to_string(i)
                                               : "<think>\nhm\n</think>\n\nAnswer"}});
  }
  return {{"messages", messages}, {"add_generation_prompt", true}};
}

TEST(Jinja, RendersFromManyThreads) {
  absl::StatusOr<JinjaTemplate> t = JinjaTemplate::Parse(kQwenLike);
  ASSERT_TRUE(t.ok()) << t.status();
  const Json context = TenMessages();
  const std::string expected = *t->Render(context);
  EXPECT_THAT(expected, HasSubstr("<|im_start|>assistant\nAnswer<|im_end|>\n"));
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 50; ++i) ok[k] += *t->Render(context) == expected;
    });
  }
  for (std::thread& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(ok[k], 50);
}

TEST(Jinja, RenderIsFast) {
  absl::StatusOr<JinjaTemplate> t = JinjaTemplate::Parse(kQwenLike);
  ASSERT_TRUE(t.ok());
  const Json context = TenMessages();
  constexpr int kRounds = 200;
  const util::Instant start = util::Instant::Now();
  for (int i = 0; i < kRounds; ++i) ASSERT_TRUE(t->Render(context).ok());
  const absl::Duration each = util::Since(start) / kRounds;
  std::printf("render of a 10-message conversation: %s\n", absl::FormatDuration(each).c_str());
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#if defined(__has_feature)
#if !__has_feature(address_sanitizer) && !__has_feature(thread_sanitizer)
  EXPECT_LT(each, absl::Milliseconds(1));  // optimized, uninstrumented builds only
#endif
#else
  EXPECT_LT(each, absl::Milliseconds(1));
#endif
#endif
}

}  // namespace
}  // namespace tandem::chat
