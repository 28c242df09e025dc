// The evaluator of the Jinja engine: statements, expressions, jinja2's sandboxed attribute
// lookup, and the filters, tests, globals and Python methods chat templates use.
#include "common/chat/jinja.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_value.h"
#include "common/util/clock.h"
#include "common/util/status.h"

namespace tandem::chat {
namespace internal {

namespace {

absl::Status Error(std::string_view message) { return absl::InvalidArgumentError(Sv(message)); }

struct CallValues {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;

  // The argument at `index` (positional) or named `name`; null when absent.
  const Value* Get(size_t index, std::string_view name) const {
    if (index < pos.size()) return &pos[index];
    for (const auto& [k, v] : kw) {
      if (k == name) return &v;
    }
    return nullptr;
  }
};

class Renderer;
using NativeFn = std::function<absl::StatusOr<Value>(Renderer&, CallValues&)>;

struct FunctionObject : Object {
  std::string name;
  NativeFn fn;
};

struct LoopObject : Object {
  std::vector<Value> items;
  size_t index0 = 0;
  bool has_last_changed = false;
  std::vector<Value> last_changed;
};

Value MakeFunction(std::string name, NativeFn fn) {
  auto f = std::make_shared<FunctionObject>();
  f->name = std::move(name);
  f->fn = std::move(fn);
  Value v;
  v.kind = Kind::kFunction;
  v.obj = std::move(f);
  return v;
}

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* Find(std::string_view name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
      for (auto it = s->vars.rbegin(); it != s->vars.rend(); ++it) {
        if (it->first == name) return &it->second;
      }
    }
    return nullptr;
  }
  void Set(std::string_view name, Value value) {
    for (auto& [k, v] : vars) {
      if (k == name) {
        v = std::move(value);
        return;
      }
    }
    vars.emplace_back(std::string(name), std::move(value));
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr Child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

// ---------------------------------------------------------------------------------------------
// String helpers (Python semantics on code points).

bool IsWordChar(char32_t c) { return c == '_' || IsPyDigit(c) || IsPyAlpha(c); }

std::string Lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (IsAscii(s)) {
    for (char c : s) out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return out;
  }
  for (char32_t c : Decode(s)) AppendCodePoint(PyLower(c), &out);
  return out;
}

std::string Upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (IsAscii(s)) {
    for (char c : s) out.push_back(c >= 'a' && c <= 'z' ? c - 32 : c);
    return out;
  }
  for (char32_t c : Decode(s)) {
    if (c == 0xdf) {
      out += "SS";  // Python: 'ß'.upper() == 'SS'
    } else {
      AppendCodePoint(PyUpper(c), &out);
    }
  }
  return out;
}

bool IsCased(char32_t c) { return PyLower(c) != c || PyUpper(c) != c; }

std::string Capitalize(std::string_view s) {
  std::vector<char32_t> cps = Decode(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? PyUpper(cps[i]) : PyLower(cps[i]);
  return Encode(cps);
}

// Python's str.title: words are runs of cased letters.
std::string PyTitle(std::string_view s) {
  std::vector<char32_t> cps = Decode(s);
  bool prev_cased = false;
  for (char32_t& c : cps) {
    const bool cased = IsCased(c) || IsPyAlpha(c);
    c = prev_cased ? PyLower(c) : PyUpper(c);
    prev_cased = cased;
  }
  return Encode(cps);
}

// jinja2's title filter: capitalize after whitespace, '-', and opening brackets.
std::string JinjaTitle(std::string_view s) {
  std::vector<char32_t> cps = Decode(s);
  bool start = true;
  for (char32_t& c : cps) {
    const bool sep = IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      start = true;
      continue;
    }
    c = start ? PyUpper(c) : PyLower(c);
    start = false;
  }
  return Encode(cps);
}

// strip/lstrip/rstrip with Python's default (whitespace) or a set of characters.
std::string Strip(std::string_view s, const Value* chars, bool left, bool right) {
  std::vector<char32_t> set;
  const bool default_set = chars == nullptr || chars->is_none();
  if (!default_set) set = Decode(chars->s());
  auto strip_it = [&](char32_t c) {
    if (default_set) return IsPySpace(c);
    return std::find(set.begin(), set.end(), c) != set.end();
  };
  std::vector<char32_t> cps = Decode(s);
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) AppendCodePoint(cps[i], &out);
  return out;
}

std::vector<std::string> SplitWhitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  std::vector<char32_t> cps = Decode(s);
  std::vector<std::string> parts;
  if (!from_right) {
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPySpace(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > i && IsPySpace(cps[e - 1])) --e;
        parts.push_back(Encode(std::vector<char32_t>(cps.begin() + i, cps.begin() + e)));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !IsPySpace(cps[j])) ++j;
      parts.push_back(Encode(std::vector<char32_t>(cps.begin() + i, cps.begin() + j)));
      i = j;
    }
    return parts;
  }
  size_t i = cps.size();
  while (i > 0) {
    while (i > 0 && IsPySpace(cps[i - 1])) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      size_t b = 0;
      while (b < i && IsPySpace(cps[b])) ++b;
      parts.push_back(Encode(std::vector<char32_t>(cps.begin() + b, cps.begin() + i)));
      break;
    }
    size_t j = i;
    while (j > 0 && !IsPySpace(cps[j - 1])) --j;
    parts.push_back(Encode(std::vector<char32_t>(cps.begin() + j, cps.begin() + i)));
    i = j;
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> SplitSep(std::string_view s, std::string_view sep, int64_t maxsplit,
                                  bool from_right) {
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t at = s.find(sep, start);
      if (at == std::string_view::npos) break;
      parts.emplace_back(s.substr(start, at - start));
      start = at + sep.size();
    }
    parts.emplace_back(s.substr(start));
    return parts;
  }
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    if (end < sep.size()) break;
    const size_t at = s.rfind(sep, end - sep.size());
    if (at == std::string_view::npos) break;
    parts.emplace_back(s.substr(at + sep.size(), end - at - sep.size()));
    end = at;
  }
  parts.emplace_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> SplitLines(std::string_view s, bool keepends) {
  std::vector<char32_t> cps = Decode(s);
  std::vector<std::string> lines;
  std::string cur;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
                     c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      AppendCodePoint(c, &cur);
      continue;
    }
    if (keepends) AppendCodePoint(c, &cur);
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') {
      if (keepends) cur.push_back('\n');
      ++i;
    }
    lines.push_back(std::move(cur));
    cur.clear();
  }
  if (!cur.empty()) lines.push_back(std::move(cur));
  return lines;
}

// The size str.replace would produce.
size_t ReplacedSize(std::string_view s, std::string_view old, std::string_view repl,
                    int64_t count) {
  size_t n = 0;
  if (old.empty()) {
    n = CodePointCount(s) + 1;
  } else {
    for (size_t at = s.find(old);
         at != std::string_view::npos && (count < 0 || static_cast<int64_t>(n) < count);
         at = s.find(old, at + old.size())) {
      ++n;
    }
  }
  if (count >= 0) n = std::min<size_t>(n, count);
  return s.size() - n * old.size() + n * repl.size();
}

std::string Replace(std::string_view s, std::string_view old, std::string_view repl,
                    int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `repl` between code points (and at both ends).
    std::vector<char32_t> cps = Decode(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (i < cps.size()) AppendCodePoint(cps[i], &out);
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    out.append(repl);
    start = at + old.size();
    ++n;
  }
  out.append(s.substr(start));
  return out;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Python's slice.indices: the positions a[start:stop:step] selects from a sequence of `len`.
absl::StatusOr<std::vector<int64_t>> SliceIndices(int64_t len, const Value& start,
                                                  const Value& stop, const Value& step) {
  for (const Value* v : {&start, &stop, &step}) {
    if (!v->is_none() && !v->is_int_like()) {
      return Error("slice indices must be integers or None or have an __index__ method");
    }
  }
  int64_t st = step.is_int_like() ? step.as_int() : 1;
  if (st == 0) return Error("slice step cannot be zero");
  auto adjust = [&](const Value& v, int64_t def_pos, int64_t def_neg) {
    if (!v.is_int_like()) return st > 0 ? def_pos : def_neg;
    int64_t x = v.as_int();
    if (x < 0) {
      x += len;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= len) {
      x = st < 0 ? len - 1 : len;
    }
    return x;
  };
  const int64_t b = adjust(start, 0, len - 1);
  const int64_t e = adjust(stop, len, -1);
  std::vector<int64_t> out;
  if (st > 0) {
    for (int64_t i = b; i < e; i += st) out.push_back(i);
  } else {
    for (int64_t i = b; i > e; i += st) out.push_back(i);
  }
  return out;
}

// Python's int(str): optional sign, digits with single underscores, surrounding whitespace.
bool ParsePyInt(std::string_view text, int base, int64_t* out) {
  std::string s = Strip(text, nullptr, true, true);
  if (s.empty()) return false;
  size_t i = 0;
  bool neg = false;
  if (s[0] == '+' || s[0] == '-') {
    neg = s[0] == '-';
    ++i;
  }
  if ((base == 16 || base == 8 || base == 2) && i + 1 < s.size() && s[i] == '0') {
    const char p = static_cast<char>(s[i + 1] | 0x20);
    if ((base == 16 && p == 'x') || (base == 8 && p == 'o') || (base == 2 && p == 'b')) i += 2;
  }
  if (i >= s.size()) return false;
  Int128 v = 0;
  bool last_underscore = true;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      if (last_underscore) return false;
      last_underscore = true;
      continue;
    }
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') {
      d = (c | 0x20) - 'a' + 10;
    } else {
      return false;
    }
    if (d >= base) return false;
    v = v * base + d;
    if (v > static_cast<Int128>(INT64_MAX) + 1) return false;
    last_underscore = false;
  }
  if (last_underscore) return false;
  if (neg) v = -v;
  if (v > INT64_MAX || v < INT64_MIN) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

bool ParsePyFloat(std::string_view text, double* out) {
  std::string s = Strip(text, nullptr, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 >= s.size() || !IsPyDigit(s[i - 1]) || !IsPyDigit(s[i + 1])) {
        return false;
      }
      continue;
    }
    clean.push_back(s[i]);
  }
  if (clean.empty()) return false;
  const std::string lower = Lower(clean);
  std::string_view body = lower;
  double sign = 1;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    sign = body[0] == '-' ? -1 : 1;
    body.remove_prefix(1);
  }
  if (body == "inf" || body == "infinity") {
    *out = sign * INFINITY;
    return true;
  }
  if (body == "nan") {
    *out = NAN;
    return true;
  }
  for (char c : body) {
    if (!(IsPyDigit(c) || c == '.' || c == 'e' || c == '+' || c == '-')) return false;
  }
  char* end = nullptr;
  const double v = std::strtod(clean.c_str(), &end);
  if (end == nullptr || *end != 0) return false;
  *out = v;
  return true;
}

// Python's round(x, ndigits) for floats: exact decimal rounding, ties to even.
double PyRound(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits == 0) return std::nearbyint(x);
  if (ndigits > 300) return x;
  if (ndigits < -300) return 0.0 * x;
  if (ndigits < 0) {
    const double p = std::pow(10.0, static_cast<double>(-ndigits));
    return std::nearbyint(x / p) * p;
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
  return std::strtod(buf, nullptr);
}

// ---------------------------------------------------------------------------------------------

class Renderer {
 public:
  Renderer(const RenderLimits& limits, Value globals, absl::Time now)
      : limits_(limits), globals_(std::move(globals)), now_(now) {
    InstallGlobals();
  }
  // Macros hold the scope they were defined in, which may hold them: clearing the scopes
  // they captured breaks those cycles.
  ~Renderer() {
    for (const ScopePtr& scope : captured_) scope->vars.clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  absl::StatusOr<std::string> Run(const Program& program) {
    std::string out;
    out_ = &out;
    auto root = std::make_shared<Scope>();
    RETURN_IF_ERROR(ExecBody(program.body, root));
    return out;
  }

  // ---- limits
  absl::Status Step(int64_t n = 1) {
    steps_ += n;
    if (steps_ > limits_.max_steps) {
      return absl::ResourceExhaustedError(
          absl::StrCat("template exceeded max_steps (", limits_.max_steps, ")"));
    }
    if (steps_ >= next_deadline_check_) {
      next_deadline_check_ = steps_ + 1024;
      if (limits_.deadline != util::Instant::Never() && util::Instant::Now() > limits_.deadline) {
        return absl::DeadlineExceededError("template rendering passed its deadline");
      }
    }
    return absl::OkStatus();
  }
  absl::Status CheckSize(size_t bytes) const {
    if (bytes > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("template output exceeds max_output_bytes (",
                                                       limits_.max_output_bytes, ")"));
    }
    return absl::OkStatus();
  }
  static absl::StatusOr<Value> CheckDepth(Value v) {
    if (DepthOf(v) > kMaxValueDepth) return Error("value nested too deeply");
    return v;
  }
  absl::Status Write(std::string_view s) {
    RETURN_IF_ERROR(CheckSize(out_->size() + s.size()));
    out_->append(s);
    return absl::OkStatus();
  }
  absl::Status Enter() {
    if (++depth_ > limits_.max_depth) {
      return absl::ResourceExhaustedError(
          absl::StrCat("template exceeded max_depth (", limits_.max_depth, ")"));
    }
    return absl::OkStatus();
  }
  void Leave() { --depth_; }

  // ---- statements
  enum class Flow { kNormal, kBreak, kContinue };

  absl::Status ExecBody(const Body& body, const ScopePtr& scope) {
    for (const auto& stmt : body) {
      RETURN_IF_ERROR(Exec(*stmt, scope));
      if (flow_ != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Capture(const Body& body, const ScopePtr& scope) {
    std::string captured;
    std::string* saved = out_;
    out_ = &captured;
    absl::Status s = ExecBody(body, scope);
    out_ = saved;
    if (!s.ok()) return s;
    return captured;
  }

  absl::Status Assign(const Target& target, Value value, const ScopePtr& scope) {
    if (!target.ns_attr.empty()) {
      const Value* ns = scope->Find(target.names[0]);
      if (ns == nullptr) ns = LookupGlobal(target.names[0]);
      if (ns == nullptr || ns->kind != Kind::kNamespace) {
        return Error("cannot assign attribute on non-namespace object");
      }
      // Unlike jinja2, a namespace may not hold a namespace: no cycles, and depths stay known.
      if (HoldsNamespace(value)) return Error("a namespace cannot hold a namespace");
      if (DepthOf(value) >= kMaxValueDepth) return Error("value nested too deeply");
      AsDict(*ns)->Set(Value::String(target.ns_attr), std::move(value));
      return absl::OkStatus();
    }
    if (!target.tuple) {
      scope->Set(target.names[0], std::move(value));
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
    if (items.size() != target.names.size()) {
      if (items.size() > target.names.size()) {
        return Error(
            absl::StrCat("too many values to unpack (expected ", target.names.size(), ")"));
      }
      return Error(absl::StrCat("not enough values to unpack (expected ", target.names.size(),
                                ", got ", items.size(), ")"));
    }
    for (size_t i = 0; i < items.size(); ++i) scope->Set(target.names[i], std::move(items[i]));
    return absl::OkStatus();
  }

  absl::StatusOr<Value> ApplyFilterChain(const std::vector<ExprPtr>& filters, Value v,
                                         const ScopePtr& scope) {
    for (const ExprPtr& f : filters) {
      ASSIGN_OR_RETURN(CallValues args, EvalArgs(f->args, scope));
      ASSIGN_OR_RETURN(v, Filter(*f, std::move(v), args));
    }
    return v;
  }

  absl::Status Exec(const Stmt& s, const ScopePtr& scope) {
    switch (s.type) {
      case StmtType::kData:
        return Write(s.text);
      case StmtType::kPrint: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.exprs[0], scope));
        if (v.is_string()) return Write(v.s());
        return Write(Str(v));
      }
      case StmtType::kIf: {
        for (size_t i = 0; i < s.exprs.size(); ++i) {
          ASSIGN_OR_RETURN(Value c, Eval(*s.exprs[i], scope));
          if (Truthy(c)) return ExecBody(s.bodies[i], scope);
        }
        if (s.has_else) return ExecBody(s.bodies.back(), scope);
        return absl::OkStatus();
      }
      case StmtType::kFor:
        return ExecFor(s, scope);
      case StmtType::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.exprs[0], scope));
        return Assign(s.targets[0], std::move(v), scope);
      }
      case StmtType::kSetBlock: {
        ASSIGN_OR_RETURN(std::string text, Capture(s.bodies[0], Child(scope)));
        ASSIGN_OR_RETURN(Value v,
                         ApplyFilterChain(s.filters, Value::String(std::move(text)), scope));
        return Assign(s.targets[0], std::move(v), scope);
      }
      case StmtType::kMacro:
        scope->Set(s.text, MakeMacro(s, scope));
        return absl::OkStatus();
      case StmtType::kCallBlock: {
        const Expr& call = *s.exprs[0];
        ASSIGN_OR_RETURN(Value callee, Eval(*call.children[0], scope));
        ASSIGN_OR_RETURN(CallValues args, EvalArgs(call.args, scope));
        args.kw.emplace_back("caller", MakeMacro(s, scope, /*is_caller=*/true));
        return CallAndWrite(callee, args);
      }
      case StmtType::kFilterBlock: {
        ASSIGN_OR_RETURN(std::string text, Capture(s.bodies[0], Child(scope)));
        ASSIGN_OR_RETURN(Value v,
                         ApplyFilterChain(s.filters, Value::String(std::move(text)), scope));
        return Write(Str(v));
      }
      case StmtType::kWith: {
        ScopePtr inner = Child(scope);
        for (size_t i = 0; i < s.targets.size(); ++i) {
          ASSIGN_OR_RETURN(Value v, Eval(*s.exprs[i], scope));
          RETURN_IF_ERROR(Assign(s.targets[i], std::move(v), inner));
        }
        return ExecBody(s.bodies[0], inner);
      }
      case StmtType::kScope:
        return ExecBody(s.bodies[0], Child(scope));
      case StmtType::kBreak:
        flow_ = Flow::kBreak;
        return absl::OkStatus();
      case StmtType::kContinue:
        flow_ = Flow::kContinue;
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  absl::Status CallAndWrite(const Value& callee, CallValues& args) {
    ASSIGN_OR_RETURN(Value v, Call(callee, args));
    return Write(Str(v));
  }

  absl::Status ExecFor(const Stmt& s, const ScopePtr& scope) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*s.exprs[0], scope));
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(iterable));
    if (s.exprs[1] != nullptr) {
      std::vector<Value> kept;
      for (Value& item : items) {
        RETURN_IF_ERROR(Step());
        ScopePtr test_scope = Child(scope);
        RETURN_IF_ERROR(Assign(s.targets[0], item, test_scope));
        ASSIGN_OR_RETURN(Value keep, Eval(*s.exprs[1], test_scope));
        if (Truthy(keep)) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    // As jinja2 compiles it, the else block runs unless an iteration ran its body to the end
    // (so also when every iteration ends in continue, or the first in break).
    auto run_else = [&]() -> absl::Status {
      if (!s.has_else) return absl::OkStatus();
      return ExecBody(s.bodies[1], Child(scope));
    };
    if (items.empty()) return run_else();
    auto loop = std::make_shared<LoopObject>();
    loop->items = std::move(items);
    Value loop_value;
    loop_value.kind = Kind::kLoop;
    loop_value.obj = loop;
    bool completed = false;
    for (size_t i = 0; i < loop->items.size(); ++i) {
      RETURN_IF_ERROR(Step());
      loop->index0 = i;
      ScopePtr iter_scope = Child(scope);
      iter_scope->vars.reserve(4);
      RETURN_IF_ERROR(Assign(s.targets[0], loop->items[i], iter_scope));
      iter_scope->Set("loop", loop_value);
      RETURN_IF_ERROR(ExecBody(s.bodies[0], iter_scope));
      if (flow_ == Flow::kNormal) completed = true;
      if (flow_ == Flow::kBreak) {
        flow_ = Flow::kNormal;
        break;
      }
      flow_ = Flow::kNormal;
    }
    if (!completed) return run_else();
    return absl::OkStatus();
  }

  Value MakeMacro(const Stmt& s, const ScopePtr& scope, bool is_caller = false) {
    const Stmt* stmt = &s;
    captured_.push_back(scope);
    // The caller of a call block takes the call block's parameters; defaults follow the call.
    const size_t defaults_offset = is_caller ? 1 : 0;
    Value macro = MakeFunction(
        is_caller ? "caller" : s.text,
        [stmt, scope, defaults_offset](Renderer& r, CallValues& args) -> absl::StatusOr<Value> {
          RETURN_IF_ERROR(r.Enter());
          absl::StatusOr<Value> result = r.InvokeMacro(*stmt, scope, defaults_offset, args);
          r.Leave();
          return result;
        });
    // What jinja2 prints for it.
    macro.str = std::make_shared<const std::string>(
        absl::StrCat("<Macro '", is_caller ? "caller" : s.text, "'>"));
    return macro;
  }

  absl::StatusOr<Value> InvokeMacro(const Stmt& s, const ScopePtr& defining, size_t defaults_offset,
                                    CallValues& args) {
    ScopePtr scope = Child(defining);
    const size_t n = s.params.size();
    std::vector<bool> set(n, false);
    std::vector<Value> varargs;
    std::vector<std::pair<Value, Value>> kwargs;
    for (size_t i = 0; i < args.pos.size(); ++i) {
      if (i < n) {
        scope->Set(s.params[i], args.pos[i]);
        set[i] = true;
      } else if (s.uses_varargs) {
        varargs.push_back(args.pos[i]);
      } else {
        return Error(absl::StrCat("macro '", s.text, "' takes not more than ", n, " argument(s)"));
      }
    }
    for (auto& [k, v] : args.kw) {
      auto it = std::find(s.params.begin(), s.params.end(), k);
      if (it != s.params.end()) {
        const size_t idx = it - s.params.begin();
        if (set[idx]) {
          return Error(
              absl::StrCat("macro '", s.text, "' got multiple values for argument '", k, "'"));
        }
        scope->Set(k, v);
        set[idx] = true;
      } else if (k == "caller" && s.uses_caller) {
        scope->Set("caller", v);
      } else if (s.uses_kwargs) {
        kwargs.emplace_back(Value::String(k), v);
      } else {
        return Error(absl::StrCat("macro '", s.text, "' takes no keyword argument '", k, "'"));
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (set[i]) continue;
      const ExprPtr& def = s.exprs[i + defaults_offset];
      if (def != nullptr) {
        ASSIGN_OR_RETURN(Value v, Eval(*def, scope));
        scope->Set(s.params[i], std::move(v));
      } else {
        scope->Set(s.params[i], Value::Undefined(absl::StrCat("parameter '", s.params[i],
                                                              "' was not provided")));
      }
    }
    if (s.uses_varargs) scope->Set("varargs", Value::List(std::move(varargs), true));
    if (s.uses_kwargs) scope->Set("kwargs", Value::Dict(std::move(kwargs)));
    if (s.uses_caller && scope->Find("caller") == nullptr) {
      scope->Set("caller", Value::Undefined("No caller defined"));
    }
    const Flow saved = flow_;
    flow_ = Flow::kNormal;
    ASSIGN_OR_RETURN(std::string text, Capture(s.bodies[0], scope));
    flow_ = saved;
    return Value::String(std::move(text));
  }

  // ---- expressions
  const Value* LookupGlobal(std::string_view name) const {
    if (globals_.is_dict()) {
      if (const Value* v = AsDict(globals_)->FindString(name)) return v;
    }
    for (const auto& [k, v] : builtins_) {
      if (k == name) return &v;
    }
    return nullptr;
  }

  absl::StatusOr<CallValues> EvalArgs(const CallArgs& a, const ScopePtr& scope) {
    CallValues out;
    out.pos.reserve(a.positional.size());
    for (const ExprPtr& e : a.positional) {
      ASSIGN_OR_RETURN(Value v, Eval(*e, scope));
      out.pos.push_back(std::move(v));
    }
    for (const auto& [k, e] : a.keyword) {
      ASSIGN_OR_RETURN(Value v, Eval(*e, scope));
      out.kw.emplace_back(k, std::move(v));
    }
    if (a.star_args != nullptr) {
      ASSIGN_OR_RETURN(Value v, Eval(*a.star_args, scope));
      ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
      for (Value& item : items) out.pos.push_back(std::move(item));
    }
    if (a.star_kwargs != nullptr) {
      ASSIGN_OR_RETURN(Value v, Eval(*a.star_kwargs, scope));
      if (!v.is_dict()) return Error("argument after ** must be a mapping");
      for (const auto& [k, val] : v.entries()) {
        if (!k.is_string()) return Error("keywords must be strings");
        out.kw.emplace_back(k.s(), val);
      }
    }
    return out;
  }

  absl::StatusOr<Value> Eval(const Expr& e, const ScopePtr& scope) {
    RETURN_IF_ERROR(Step());
    switch (e.type) {
      case ExprType::kConst:
        return e.value;
      case ExprType::kName: {
        if (const Value* v = scope->Find(e.name)) return *v;
        if (const Value* v = LookupGlobal(e.name)) return *v;
        return Value::Undefined(absl::StrCat("'", e.name, "' is undefined"));
      }
      case ExprType::kList:
      case ExprType::kTuple: {
        std::vector<Value> items;
        items.reserve(e.children.size());
        for (const ExprPtr& c : e.children) {
          ASSIGN_OR_RETURN(Value v, Eval(*c, scope));
          items.push_back(std::move(v));
        }
        return CheckDepth(Value::List(std::move(items), e.type == ExprType::kTuple));
      }
      case ExprType::kDict: {
        auto dict = std::make_shared<DictObject>();
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*e.children[i], scope));
          ASSIGN_OR_RETURN(Value v, Eval(*e.children[i + 1], scope));
          if (k.is_list() && !k.tuple) return Error("unhashable type: 'list'");
          if (k.is_dict()) return Error("unhashable type: 'dict'");
          dict->Set(k, std::move(v));
        }
        Value v;
        v.kind = Kind::kDict;
        v.obj = std::move(dict);
        return CheckDepth(std::move(v));
      }
      case ExprType::kGetAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
        return GetAttr(obj, e.name);
      }
      case ExprType::kGetItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
        ASSIGN_OR_RETURN(Value key, Eval(*e.children[1], scope));
        return GetItem(obj, key);
      }
      case ExprType::kSlice: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
        Value parts[3] = {Value::None(), Value::None(), Value::None()};
        for (int i = 0; i < 3; ++i) {
          if (e.slice_parts[i] != nullptr) {
            ASSIGN_OR_RETURN(parts[i], Eval(*e.slice_parts[i], scope));
          }
        }
        return Slice(obj, parts[0], parts[1], parts[2]);
      }
      case ExprType::kCall: {
        ASSIGN_OR_RETURN(Value callee, Eval(*e.children[0], scope));
        ASSIGN_OR_RETURN(CallValues args, EvalArgs(e.args, scope));
        return Call(callee, args);
      }
      case ExprType::kFilter: {
        ASSIGN_OR_RETURN(Value input, Eval(*e.children[0], scope));
        ASSIGN_OR_RETURN(CallValues args, EvalArgs(e.args, scope));
        return Filter(e, std::move(input), args);
      }
      case ExprType::kTest: {
        ASSIGN_OR_RETURN(Value input, Eval(*e.children[0], scope));
        ASSIGN_OR_RETURN(CallValues args, EvalArgs(e.args, scope));
        if (!e.known) return Error(absl::StrCat("no test named '", e.name, "'"));
        ASSIGN_OR_RETURN(bool r, Test(e.name, input, args));
        return Value::Bool(r != e.negated);
      }
      case ExprType::kNeg:
      case ExprType::kPos: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.children[0], scope));
        if (v.is_undefined()) return Error(v.undefined_message());
        if (!v.is_number()) {
          return Error(absl::StrCat("bad operand type for unary ",
                                    e.type == ExprType::kNeg ? "-" : "+", ": '", TypeName(v), "'"));
        }
        if (e.type == ExprType::kPos) return v.kind == Kind::kBool ? Value::Int(v.as_int()) : v;
        if (v.kind == Kind::kFloat) return Value::Float(-v.f);
        if (v.as_int() == INT64_MIN) return Error("integer overflow");
        return Value::Int(-v.as_int());
      }
      case ExprType::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.children[0], scope));
        return Value::Bool(!Truthy(v));
      }
      case ExprType::kAnd: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.children[0], scope));
        if (!Truthy(a)) return a;
        return Eval(*e.children[1], scope);
      }
      case ExprType::kOr: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.children[0], scope));
        if (Truthy(a)) return a;
        return Eval(*e.children[1], scope);
      }
      case ExprType::kBinary: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.children[0], scope));
        ASSIGN_OR_RETURN(Value b, Eval(*e.children[1], scope));
        return Binary(e.name, a, b);
      }
      case ExprType::kCompare: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.children[0], scope));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          ASSIGN_OR_RETURN(Value right, Eval(*e.children[i + 1], scope));
          ASSIGN_OR_RETURN(bool r, Compare(e.ops[i], left, right));
          if (!r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case ExprType::kCondExpr: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.children[0], scope));
        if (Truthy(c)) return Eval(*e.children[1], scope);
        if (e.children[2] == nullptr) {
          return Value::Undefined(
              "the inline if-expression evaluated to false and no else "
              "section was defined.");
        }
        return Eval(*e.children[2], scope);
      }
    }
    return Error("unknown expression");
  }

  absl::StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "<") return Less(a, b);
    if (op == ">") return Less(b, a);
    if (op == "<=") {
      if (Equal(a, b) && (a.is_number() || a.is_string() || a.is_list())) return true;
      return Less(a, b);
    }
    if (op == ">=") {
      if (Equal(a, b) && (a.is_number() || a.is_string() || a.is_list())) return true;
      return Less(b, a);
    }
    if (op == "in") return Contains(b, a);
    ASSIGN_OR_RETURN(bool in, Contains(b, a));
    return !in;
  }

  absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
    switch (container.kind) {
      case Kind::kUndefined:
        return false;
      case Kind::kString:
        if (!item.is_string()) {
          if (item.is_undefined()) return Error(item.undefined_message());
          return Error(
              absl::StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
        }
        return container.s().find(item.s()) != std::string::npos;
      case Kind::kList: {
        ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(container));
        for (const Value& v : items) {
          if (Equal(v, item)) return true;
        }
        return false;
      }
      case Kind::kDict:
        if ((item.is_list() && !item.tuple) || item.is_dict() || item.kind == Kind::kNamespace) {
          return Error(absl::StrCat("unhashable type: '", TypeName(item), "'"));
        }
        return AsDict(container)->Find(item) != nullptr;
      default:
        return Error(absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
    }
  }

  static absl::Status BinaryTypeError(const std::string& op, const Value& a, const Value& b) {
    if (a.is_undefined()) return Error(a.undefined_message());
    if (b.is_undefined()) return Error(b.undefined_message());
    if (op == "+" && a.is_string()) {
      return Error(absl::StrCat("can only concatenate str (not \"", TypeName(b), "\") to str"));
    }
    return Error(absl::StrCat("unsupported operand type(s) for ", op, ": '", TypeName(a), "' and '",
                              TypeName(b), "'"));
  }

  // A list or tuple (not a generator or range, which Python does not add or repeat).
  static bool IsSequence(const Value& v) {
    return v.is_list() && !v.generator && static_cast<const ListObject*>(v.obj.get())->repr.empty();
  }

  absl::StatusOr<Value> Repeat(const Value& seq, int64_t n) {
    if (n < 0) n = 0;
    if (seq.is_string()) {
      if (n > 0 && seq.s().size() > 0)
        RETURN_IF_ERROR(
            CheckSize(seq.s().size() * std::min<int64_t>(n, limits_.max_output_bytes + 1)));
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += seq.s();
      return Value::String(std::move(out));
    }
    const size_t len = seq.items().size();
    if (len > 0 && n > 0) {
      RETURN_IF_ERROR(
          Step(static_cast<int64_t>(len) * std::min<int64_t>(n, limits_.max_steps + 1)));
    }
    std::vector<Value> out;
    for (int64_t i = 0; i < n && len > 0; ++i) {
      out.insert(out.end(), seq.items().begin(), seq.items().end());
    }
    return Value::List(std::move(out), seq.tuple);
  }

  absl::StatusOr<Value> Binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") {
      std::string s = Str(a);
      AppendStr(b, &s);
      RETURN_IF_ERROR(CheckSize(s.size()));
      return Value::String(std::move(s));
    }
    const bool ints = a.is_int_like() && b.is_int_like();
    const bool nums = a.is_number() && b.is_number();
    if (op == "+") {
      if (ints) {
        int64_t r;
        if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return Error("integer overflow");
        return Value::Int(r);
      }
      if (nums) return Value::Float(a.as_double() + b.as_double());
      if (a.is_string() && b.is_string()) {
        RETURN_IF_ERROR(CheckSize(a.s().size() + b.s().size()));
        return Value::String(a.s() + b.s());
      }
      if (IsSequence(a) && IsSequence(b) && a.tuple == b.tuple) {
        RETURN_IF_ERROR(Step(static_cast<int64_t>(a.items().size() + b.items().size())));
        std::vector<Value> items = a.items();
        items.insert(items.end(), b.items().begin(), b.items().end());
        return Value::List(std::move(items), a.tuple);
      }
      return BinaryTypeError(op, a, b);
    }
    if (op == "-") {
      if (ints) {
        int64_t r;
        if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return Error("integer overflow");
        return Value::Int(r);
      }
      if (nums) return Value::Float(a.as_double() - b.as_double());
      return BinaryTypeError(op, a, b);
    }
    if (op == "*") {
      if (ints) {
        int64_t r;
        if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) return Error("integer overflow");
        return Value::Int(r);
      }
      if (nums) return Value::Float(a.as_double() * b.as_double());
      if ((a.is_string() || IsSequence(a)) && b.is_int_like()) return Repeat(a, b.as_int());
      if ((b.is_string() || IsSequence(b)) && a.is_int_like()) return Repeat(b, a.as_int());
      return BinaryTypeError(op, a, b);
    }
    if (op == "/") {
      if (!nums) return BinaryTypeError(op, a, b);
      if (b.as_double() == 0) return Error("division by zero");
      return Value::Float(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (op == "%" && a.is_string()) return PercentFormat(a.s(), b);
      if (!nums) return BinaryTypeError(op, a, b);
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) return Error("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) return Error("integer overflow");
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return Value::Int(op == "//" ? q : r);
      }
      const double x = a.as_double(), y = b.as_double();
      if (y == 0) return Error("float division by zero");
      double mod = std::fmod(x, y);
      if (mod != 0 && ((mod < 0) != (y < 0))) mod += y;
      if (op == "%") {
        if (mod == 0) mod = std::copysign(0.0, y);
        return Value::Float(mod);
      }
      double div = (x - mod) / y;
      double floordiv = div == 0 ? std::copysign(0.0, x / y) : std::floor(div);
      if (div != 0 && div - floordiv > 0.5) floordiv += 1.0;
      return Value::Float(floordiv);
    }
    if (op == "**") {
      if (!nums) return BinaryTypeError(op, a, b);
      if (ints && b.as_int() >= 0) {
        int64_t result = 1, base = a.as_int(), exp = b.as_int();
        while (exp > 0) {
          if (exp & 1) {
            if (__builtin_mul_overflow(result, base, &result)) return Error("integer overflow");
          }
          exp >>= 1;
          if (exp > 0 && __builtin_mul_overflow(base, base, &base))
            return Error("integer overflow");
        }
        return Value::Int(result);
      }
      if (a.as_double() == 0 && b.as_double() < 0) {
        return Error("0.0 cannot be raised to a negative power");
      }
      const double r = std::pow(a.as_double(), b.as_double());
      if (std::isnan(r) && !std::isnan(a.as_double()) && !std::isnan(b.as_double())) {
        return Error("complex results are not supported");
      }
      return Value::Float(r);
    }
    return Error(absl::StrCat("unknown operator ", op));
  }

  // Python's printf-style formatting: str % args.
  absl::StatusOr<Value> PercentFormat(const std::string& fmt, const Value& args) {
    std::vector<Value> list;
    const Value* mapping = nullptr;
    if (args.is_list() && args.tuple) {
      list = args.items();
    } else if (args.is_dict()) {
      mapping = &args;
    } else {
      list.push_back(args);
    }
    // Python treats any non-tuple with __getitem__ (a list too) as a mapping: no "not all
    // arguments converted" error for it.
    const bool mapping_like = mapping != nullptr || (args.is_list() && !args.tuple);
    size_t next = 0;
    std::string out;
    for (size_t i = 0; i < fmt.size(); ++i) {
      if (fmt[i] != '%') {
        out.push_back(fmt[i]);
        continue;
      }
      if (++i >= fmt.size()) return Error("incomplete format");
      const Value* arg = nullptr;
      if (fmt[i] == '(') {
        const size_t close = fmt.find(')', i);
        if (close == std::string::npos || mapping == nullptr)
          return Error("format requires a mapping");
        arg = AsDict(*mapping)->FindString(fmt.substr(i + 1, close - i - 1));
        if (arg == nullptr)
          return Error(absl::StrCat("KeyError: '", fmt.substr(i + 1, close - i - 1), "'"));
        i = close + 1;
      }
      std::string flags;
      while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) {
        flags.push_back(fmt[i++]);
      }
      std::string width, precision;
      while (i < fmt.size() && IsPyDigit(fmt[i])) width.push_back(fmt[i++]);
      if (i < fmt.size() && fmt[i] == '.') {
        precision = ".";
        ++i;
        while (i < fmt.size() && IsPyDigit(fmt[i])) precision.push_back(fmt[i++]);
      }
      if (i >= fmt.size()) return Error("incomplete format");
      const char conv = fmt[i];
      if (conv == '%') {
        out.push_back('%');
        continue;
      }
      if (arg == nullptr) {
        if (next >= list.size()) return Error("not enough arguments for format string");
        arg = &list[next++];
      }
      if (width.size() > 4 || precision.size() > 4) return Error("format width too large");
      const std::string spec = "%" + flags + width + precision;
      char buf[512];
      switch (conv) {
        case 's':
        case 'r':
        case 'a': {
          std::string s = conv == 's' ? Str(*arg) : Repr(*arg);
          if (precision.size() > 1) s = s.substr(0, std::stoul(precision.substr(1)));
          const size_t w = width.empty() ? 0 : std::stoul(width);
          const size_t len = CodePointCount(s);
          if (len < w) {
            if (flags.find('-') != std::string::npos) {
              s += std::string(w - len, ' ');
            } else {
              s = std::string(w - len, ' ') + s;
            }
          }
          out += s;
          break;
        }
        case 'd':
        case 'i':
        case 'x':
        case 'X':
        case 'o': {
          if (!arg->is_number())
            return Error(absl::StrCat("%", std::string(1, conv),
                                      " format: a real number is required, not ", TypeName(*arg)));
          const long long v =
              arg->kind == Kind::kFloat ? static_cast<long long>(arg->f) : arg->as_int();
          std::snprintf(buf, sizeof(buf), (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), v);
          out += buf;
          break;
        }
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G': {
          if (!arg->is_number())
            return Error(absl::StrCat("must be real number, not ", TypeName(*arg)));
          std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), arg->as_double());
          out += buf;
          break;
        }
        case 'c': {
          if (arg->is_string() && CodePointCount(arg->s()) == 1) {
            out += arg->s();
          } else if (arg->is_int_like() && arg->as_int() >= 0 && arg->as_int() < 0x110000) {
            AppendCodePoint(static_cast<char32_t>(arg->as_int()), &out);
          } else {
            return Error("%c requires int or char");
          }
          break;
        }
        default:
          return Error(absl::StrCat("unsupported format character '", std::string(1, conv), "'"));
      }
      RETURN_IF_ERROR(CheckSize(out.size()));
    }
    if (!mapping_like && next < list.size()) {
      return Error("not all arguments converted during string formatting");
    }
    return Value::String(std::move(out));
  }

  // ---- containers
  absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
    switch (v.kind) {
      case Kind::kUndefined:
        return std::vector<Value>{};
      case Kind::kList:
        if (v.generator) {
          const absl::Status& error = static_cast<const ListObject*>(v.obj.get())->error;
          if (!error.ok()) return error;
        }
        return v.items();
      case Kind::kDict: {
        std::vector<Value> keys;
        keys.reserve(v.entries().size());
        for (const auto& [k, val] : v.entries()) keys.push_back(k);
        return keys;
      }
      case Kind::kString: {
        std::vector<Value> chars;
        std::string one;
        for (char32_t c : Decode(v.s())) {
          one.clear();
          AppendCodePoint(c, &one);
          chars.push_back(Value::String(one));
        }
        return chars;
      }
      default:
        return Error(absl::StrCat("'", TypeName(v), "' object is not iterable"));
    }
  }

  absl::StatusOr<Value> Slice(const Value& obj, const Value& a, const Value& b, const Value& c) {
    if (obj.is_undefined()) return Error(obj.undefined_message());
    if (obj.is_string()) {
      const bool ascii = IsAscii(obj.s());
      std::vector<char32_t> cps;
      if (!ascii) cps = Decode(obj.s());
      const int64_t len = ascii ? obj.s().size() : cps.size();
      ASSIGN_OR_RETURN(std::vector<int64_t> idx, SliceIndices(len, a, b, c));
      std::string out;
      for (int64_t i : idx) {
        if (ascii) {
          out.push_back(obj.s()[i]);
        } else {
          AppendCodePoint(cps[i], &out);
        }
      }
      return Value::String(std::move(out));
    }
    if (obj.is_list() && !obj.generator) {
      ASSIGN_OR_RETURN(std::vector<int64_t> idx, SliceIndices(obj.items().size(), a, b, c));
      std::vector<Value> out;
      out.reserve(idx.size());
      for (int64_t i : idx) out.push_back(obj.items()[i]);
      return Value::List(std::move(out), obj.tuple);
    }
    if (obj.is_dict()) return Error("unhashable type: 'slice'");
    return Error(absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }

  static Value NoAttribute(const Value& obj, std::string_view name) {
    return Value::Undefined(
        absl::StrCat("'", TypeRepr(obj), "' has no attribute '", Sv(name), "'"));
  }

  Value BoundMethod(const Value& self, std::string name) {
    return MakeFunction(name, [self, name](Renderer& r, CallValues& args) {
      return r.CallMethod(self, name, args);
    });
  }

  static bool IsStrMethod(std::string_view n) {
    static constexpr std::string_view kNames[] = {
        "strip",       "lstrip",       "rstrip",       "split",      "rsplit",     "startswith",
        "endswith",    "upper",        "lower",        "replace",    "title",      "capitalize",
        "find",        "rfind",        "index",        "rindex",     "count",      "join",
        "splitlines",  "isdigit",      "isalpha",      "isalnum",    "isspace",    "islower",
        "isupper",     "isnumeric",    "isdecimal",    "istitle",    "format",     "zfill",
        "center",      "ljust",        "rjust",        "partition",  "rpartition", "swapcase",
        "casefold",    "removeprefix", "removesuffix", "expandtabs", "encode",     "isidentifier",
        "isprintable", "isascii",      "translate",    "maketrans",  "format_map"};
    return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
  }

  Value Unsafe(const Value& obj, std::string_view name) {
    return Value::Undefined(absl::StrCat("access to attribute '", Sv(name), "' of '", TypeName(obj),
                                         "' object is unsafe."));
  }

  absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name) {
    if (obj.is_undefined()) return Error(obj.undefined_message());
    if (!name.empty() && name[0] == '_') return Unsafe(obj, name);
    switch (obj.kind) {
      case Kind::kDict:
        if (name == "items" || name == "keys" || name == "values" || name == "get" ||
            name == "copy") {
          return BoundMethod(obj, std::string(name));
        }
        if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" ||
            name == "update" || name == "fromkeys") {
          return name == "fromkeys" ? BoundMethod(obj, std::string(name)) : Unsafe(obj, name);
        }
        if (const Value* v = AsDict(obj)->FindString(name)) return *v;
        return NoAttribute(obj, name);
      case Kind::kNamespace:
        if (const Value* v = AsDict(obj)->FindString(name)) return *v;
        return NoAttribute(obj, name);
      case Kind::kString:
        if (IsStrMethod(name)) return BoundMethod(obj, std::string(name));
        return NoAttribute(obj, name);
      case Kind::kList:
        if (name == "count" || name == "index" || (!obj.tuple && name == "copy")) {
          return BoundMethod(obj, std::string(name));
        }
        if (!obj.tuple &&
            (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
             name == "remove" || name == "reverse" || name == "sort" || name == "clear")) {
          return Unsafe(obj, name);
        }
        return NoAttribute(obj, name);
      case Kind::kLoop:
        return LoopAttr(obj, name);
      case Kind::kInt:
      case Kind::kBool:
        if (name == "real" || name == "numerator") return Value::Int(obj.as_int());
        if (name == "imag") return Value::Int(0);
        if (name == "denominator") return Value::Int(1);
        return NoAttribute(obj, name);
      case Kind::kFloat:
        if (name == "real") return obj;
        if (name == "imag") return Value::Float(0);
        if (name == "is_integer") return BoundMethod(obj, std::string(name));
        return NoAttribute(obj, name);
      default:
        return NoAttribute(obj, name);
    }
  }

  Value LoopAttr(const Value& obj, std::string_view name) {
    auto* loop = static_cast<LoopObject*>(obj.obj.get());
    const int64_t i = loop->index0;
    const int64_t n = loop->items.size();
    if (name == "index") return Value::Int(i + 1);
    if (name == "index0") return Value::Int(i);
    if (name == "revindex") return Value::Int(n - i);
    if (name == "revindex0") return Value::Int(n - i - 1);
    if (name == "first") return Value::Bool(i == 0);
    if (name == "last") return Value::Bool(i == n - 1);
    if (name == "length") return Value::Int(n);
    if (name == "depth") return Value::Int(1);
    if (name == "depth0") return Value::Int(0);
    if (name == "previtem") {
      if (i == 0) return Value::Undefined("there is no previous item");
      return loop->items[i - 1];
    }
    if (name == "nextitem") {
      if (i + 1 >= n) return Value::Undefined("there is no next item");
      return loop->items[i + 1];
    }
    if (name == "cycle") {
      return MakeFunction("cycle", [obj](Renderer&, CallValues& args) -> absl::StatusOr<Value> {
        if (args.pos.empty()) return Error("no items for cycling given");
        auto* l = static_cast<LoopObject*>(obj.obj.get());
        return args.pos[l->index0 % args.pos.size()];
      });
    }
    if (name == "changed") {
      return MakeFunction("changed", [obj](Renderer&, CallValues& args) -> absl::StatusOr<Value> {
        auto* l = static_cast<LoopObject*>(obj.obj.get());
        bool same = l->has_last_changed && l->last_changed.size() == args.pos.size();
        for (size_t k = 0; same && k < args.pos.size(); ++k) {
          same = Equal(l->last_changed[k], args.pos[k]);
        }
        if (same) return Value::Bool(false);
        l->has_last_changed = true;
        l->last_changed = args.pos;
        return Value::Bool(true);
      });
    }
    return NoAttribute(obj, name);
  }

  absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
    if (obj.is_undefined()) return Error(obj.undefined_message());
    if (obj.generator) return Error("'generator' object is not subscriptable");
    switch (obj.kind) {
      case Kind::kDict:
        if (const Value* v = AsDict(obj)->Find(key)) return *v;
        break;
      case Kind::kList:
        if (key.is_int_like()) {
          int64_t i = key.as_int();
          const int64_t n = obj.items().size();
          if (i < 0) i += n;
          if (i >= 0 && i < n) return obj.items()[i];
          return Value::Undefined(
              absl::StrCat("'", TypeRepr(obj), "' has no element ", key.as_int()));
        }
        break;
      case Kind::kString:
        if (key.is_int_like()) {
          std::vector<char32_t> cps = Decode(obj.s());
          int64_t i = key.as_int();
          const int64_t n = cps.size();
          if (i < 0) i += n;
          if (i >= 0 && i < n) {
            std::string s;
            AppendCodePoint(cps[i], &s);
            return Value::String(std::move(s));
          }
          return Value::Undefined(
              absl::StrCat("'", TypeRepr(obj), "' has no element ", key.as_int()));
        }
        break;
      default:
        break;
    }
    if (key.is_string()) {
      ASSIGN_OR_RETURN(Value v, GetAttr(obj, key.s()));
      return v;
    }
    return Value::Undefined(absl::StrCat("'", TypeRepr(obj), "' has no element ", Repr(key)));
  }

  absl::StatusOr<Value> Call(const Value& callee, CallValues& args) {
    RETURN_IF_ERROR(Step());
    if (callee.kind == Kind::kFunction) {
      auto* f = static_cast<FunctionObject*>(callee.obj.get());
      ASSIGN_OR_RETURN(Value v, f->fn(*this, args));
      return CheckDepth(std::move(v));
    }
    if (callee.is_undefined()) return Error(callee.undefined_message());
    return Error(absl::StrCat("'", TypeName(callee), "' object is not callable"));
  }

  // An attribute path ("a.b.0") as jinja2's make_attrgetter reads it.
  absl::StatusOr<Value> GetPath(const Value& item, const Value& attribute) {
    if (attribute.is_int_like()) return GetItem(item, attribute);
    if (!attribute.is_string()) return GetItem(item, attribute);
    Value cur = item;
    size_t start = 0;
    const std::string& path = attribute.s();
    for (;;) {
      const size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
      int64_t index;
      bool numeric = !part.empty() &&
                     std::all_of(part.begin(), part.end(), [](char c) { return IsPyDigit(c); });
      if (numeric && ParsePyInt(part, 10, &index)) {
        ASSIGN_OR_RETURN(cur, GetItem(cur, Value::Int(index)));
      } else {
        ASSIGN_OR_RETURN(cur, GetItem(cur, Value::String(part)));
      }
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return cur;
  }

  // ---- filters, tests, methods (jinja_builtins below)
  absl::StatusOr<Value> Filter(const Expr& e, Value input, CallValues& args);
  absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& input, CallValues& args);
  absl::StatusOr<Value> ApplyFilterNow(std::string_view name, const Value& input, CallValues& args);
  absl::StatusOr<bool> Test(std::string_view name, const Value& input, CallValues& args);
  absl::StatusOr<Value> CallMethod(const Value& self, const std::string& name, CallValues& args);
  absl::StatusOr<Value> StrMethod(const std::string& s, const std::string& name, CallValues& args);
  absl::StatusOr<Value> SortedList(std::vector<Value> items, const CallValues& args,
                                   size_t first_arg, bool dictsort);
  void InstallGlobals();

  const RenderLimits& limits_;
  Value globals_;
  absl::Time now_;
  std::vector<std::pair<std::string, Value>> builtins_;
  std::vector<ScopePtr> captured_;
  std::string* out_ = nullptr;
  Flow flow_ = Flow::kNormal;
  int64_t steps_ = 0;
  int64_t next_deadline_check_ = 0;
  int depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Globals.

void Renderer::InstallGlobals() {
  builtins_.emplace_back(
      "raise_exception",
      MakeFunction("raise_exception", [](Renderer&, CallValues& args) -> absl::StatusOr<Value> {
        const Value* msg = args.Get(0, "message");
        return Error(msg == nullptr ? "" : Str(*msg));
      }));
  builtins_.emplace_back(
      "strftime_now",
      MakeFunction("strftime_now", [](Renderer& r, CallValues& args) -> absl::StatusOr<Value> {
        const Value* fmt = args.Get(0, "format");
        if (fmt == nullptr || !fmt->is_string()) return Error("strftime_now() needs a format");
        return Value::String(absl::FormatTime(fmt->s(), r.now_, absl::UTCTimeZone()));
      }));
  builtins_.emplace_back(
      "range", MakeFunction("range", [](Renderer& r, CallValues& args) -> absl::StatusOr<Value> {
        int64_t start = 0, stop = 0, step = 1;
        for (const Value& v : args.pos) {
          if (!v.is_int_like()) {
            return Error(
                absl::StrCat("'", TypeName(v), "' object cannot be interpreted as an integer"));
          }
        }
        if (args.pos.size() == 1) {
          stop = args.pos[0].as_int();
        } else if (args.pos.size() == 2 || args.pos.size() == 3) {
          start = args.pos[0].as_int();
          stop = args.pos[1].as_int();
          if (args.pos.size() == 3) step = args.pos[2].as_int();
        } else {
          return Error("range expected 1 to 3 arguments");
        }
        if (step == 0) return Error("range() arg 3 must not be zero");
        const Int128 span = step > 0 ? (Int128)stop - start : (Int128)start - stop;
        const Int128 astep = step > 0 ? step : -(Int128)step;
        const Int128 count = span <= 0 ? 0 : (span + astep - 1) / astep;
        if (count > 100000) {
          return Error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        }
        RETURN_IF_ERROR(r.Step(static_cast<int64_t>(count)));
        std::vector<Value> items;
        items.reserve(static_cast<size_t>(count));
        for (int64_t k = 0; k < static_cast<int64_t>(count); ++k) {
          items.push_back(Value::Int(start + k * step));
        }
        Value range = Value::List(std::move(items));
        static_cast<ListObject*>(range.obj.get())->repr =
            step == 1 ? absl::StrCat("range(", start, ", ", stop, ")")
                      : absl::StrCat("range(", start, ", ", stop, ", ", step, ")");
        return range;
      }));
  builtins_.emplace_back(
      "dict", MakeFunction("dict", [](Renderer&, CallValues& args) -> absl::StatusOr<Value> {
        std::vector<std::pair<Value, Value>> entries;
        if (!args.pos.empty()) {
          if (args.pos.size() > 1) return Error("dict expected at most 1 argument");
          if (args.pos[0].is_dict()) {
            entries = args.pos[0].entries();
          } else {
            return Error("dict() argument must be a mapping");
          }
        }
        auto dict = std::make_shared<DictObject>();
        dict->entries = std::move(entries);
        dict->Recompute();
        for (auto& [k, v] : args.kw) dict->Set(Value::String(k), v);
        Value v;
        v.kind = Kind::kDict;
        v.obj = std::move(dict);
        return v;
      }));
  builtins_.emplace_back(
      "namespace",
      MakeFunction("namespace", [](Renderer&, CallValues& args) -> absl::StatusOr<Value> {
        auto dict = std::make_shared<DictObject>();
        for (const Value& p : args.pos) {
          if (!p.is_dict()) return Error("namespace() argument must be a mapping");
          for (const auto& [k, v] : p.entries()) dict->Set(k, v);
        }
        for (auto& [k, v] : args.kw) dict->Set(Value::String(k), v);
        if (dict->holds_ns) return Error("a namespace cannot hold a namespace");
        dict->holds_ns = true;
        Value v;
        v.kind = Kind::kNamespace;
        v.obj = std::move(dict);
        return v;
      }));
  builtins_.emplace_back(
      "joiner", MakeFunction("joiner", [](Renderer&, CallValues& args) -> absl::StatusOr<Value> {
        const Value* sep = args.Get(0, "sep");
        const std::string s = sep == nullptr ? ", " : Str(*sep);
        auto used = std::make_shared<bool>(false);
        return MakeFunction("joiner", [s, used](Renderer&, CallValues&) -> absl::StatusOr<Value> {
          if (!*used) {
            *used = true;
            return Value::String("");
          }
          return Value::String(s);
        });
      }));
}

// ---------------------------------------------------------------------------------------------
// Tests.

absl::StatusOr<bool> Renderer::Test(std::string_view name, const Value& v, CallValues& args) {
  static constexpr std::string_view kNoArgs[] = {
      "defined", "undefined", "none", "string", "number",   "integer",  "float",
      "mapping", "boolean",   "true", "false",  "iterable", "sequence", "callable",
      "escaped", "odd",       "even", "lower",  "upper",    "filter",   "test"};
  if (std::find(std::begin(kNoArgs), std::end(kNoArgs), name) != std::end(kNoArgs) &&
      !(args.pos.empty() && args.kw.empty())) {
    return Error(absl::StrCat("test '", Sv(name), "' takes no arguments"));
  }
  if (std::find(std::begin(kNoArgs), std::end(kNoArgs), name) == std::end(kNoArgs) &&
      args.pos.size() + args.kw.size() > 1) {
    return Error(absl::StrCat("test '", Sv(name), "' takes one argument"));
  }
  const Value* arg = args.Get(0, "value");
  auto need_arg = [&]() -> absl::Status {
    if (arg == nullptr) return Error(absl::StrCat("test '", Sv(name), "' needs an argument"));
    return absl::OkStatus();
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Kind::kInt;
  if (name == "float") return v.kind == Kind::kFloat;
  if (name == "mapping") return v.is_dict();
  if (name == "boolean") return v.kind == Kind::kBool;
  if (name == "true") return v.kind == Kind::kBool && v.flag;
  if (name == "false") return v.kind == Kind::kBool && !v.flag;
  if (name == "iterable") {
    return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  }
  if (name == "sequence") {
    return v.is_undefined() || v.is_string() || (v.is_list() && !v.generator) || v.is_dict();
  }
  if (name == "callable") return v.kind == Kind::kFunction || v.is_undefined();  // __call__
  if (name == "escaped") return false;
  if (name == "odd" || name == "even") {
    ASSIGN_OR_RETURN(Value m, Binary("%", v, Value::Int(2)));
    return Equal(m, Value::Int(name == "odd" ? 1 : 0));
  }
  if (name == "divisibleby") {
    if (arg == nullptr) arg = args.Get(0, "num");
    RETURN_IF_ERROR(need_arg());
    ASSIGN_OR_RETURN(Value m, Binary("%", v, *arg));
    return Equal(m, Value::Int(0));
  }
  if (name == "lower" || name == "upper") {
    const std::string s = Str(v);
    bool cased = false;
    for (char32_t c : Decode(s)) {
      if (!IsCased(c)) continue;
      cased = true;
      if (name == "lower" ? PyLower(c) != c : PyUpper(c) != c) return false;
    }
    return cased;
  }
  if (name == "filter") return v.is_string() && IsKnownFilter(v.s());
  if (name == "test") return v.is_string() && IsKnownTest(v.s());
  if (arg == nullptr) arg = args.Get(0, "other");
  RETURN_IF_ERROR(need_arg());
  if (name == "equalto" || name == "eq" || name == "==") return Equal(v, *arg);
  if (name == "ne" || name == "!=") return !Equal(v, *arg);
  if (name == "lt" || name == "lessthan" || name == "<") return Compare("<", v, *arg);
  if (name == "le" || name == "<=") return Compare("<=", v, *arg);
  if (name == "gt" || name == "greaterthan" || name == ">") return Compare(">", v, *arg);
  if (name == "ge" || name == ">=") return Compare(">=", v, *arg);
  if (name == "in") return Contains(*arg, v);
  if (name == "sameas") {
    if (v.kind != arg->kind) return false;
    if (v.obj != nullptr) return v.obj == arg->obj;
    return Equal(v, *arg);
  }
  return Error(absl::StrCat("no test named '", Sv(name), "'"));
}

// ---------------------------------------------------------------------------------------------
// Filters.

absl::StatusOr<Value> Renderer::Filter(const Expr& e, Value input, CallValues& args) {
  if (!e.known) return Error(absl::StrCat("no filter named '", e.name, "'"));
  ASSIGN_OR_RETURN(Value v, ApplyFilter(e.name, input, args));
  return CheckDepth(std::move(v));
}

absl::StatusOr<Value> Renderer::SortedList(std::vector<Value> items, const CallValues& args,
                                           size_t first_arg, bool dictsort) {
  const Value* reverse = args.Get(first_arg, "reverse");
  const Value* case_sensitive = args.Get(first_arg + 1, "case_sensitive");
  const Value* attribute = dictsort ? nullptr : args.Get(first_arg + 2, "attribute");
  const Value* by = dictsort ? args.Get(first_arg + 2, "by") : nullptr;
  if (dictsort) {
    // dictsort(value, case_sensitive=False, by='key', reverse=False)
    case_sensitive = args.Get(first_arg, "case_sensitive");
    by = args.Get(first_arg + 1, "by");
    reverse = args.Get(first_arg + 2, "reverse");
  }
  const bool cs = case_sensitive != nullptr && Truthy(*case_sensitive);
  const bool rev = reverse != nullptr && Truthy(*reverse);
  std::vector<std::pair<Value, Value>> keyed;  // key, item
  keyed.reserve(items.size());
  for (Value& item : items) {
    Value key = item;
    if (dictsort) {
      int pos = 0;
      if (by != nullptr && by->is_string()) {
        if (by->s() == "value") {
          pos = 1;
        } else if (by->s() != "key") {
          return Error("You can only sort by either \"key\" or \"value\"");
        }
      }
      key = item.items()[pos];
    } else if (attribute != nullptr && !attribute->is_none()) {
      ASSIGN_OR_RETURN(key, GetPath(item, *attribute));
    }
    if (!cs && key.is_string()) key = Value::String(Lower(key.s()));
    keyed.emplace_back(std::move(key), std::move(item));
  }
  RETURN_IF_ERROR(Step(static_cast<int64_t>(keyed.size())));
  absl::Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    if (!error.ok()) return false;
    // jinja2 sorts by lists of keys, which compare equal elements with == first.
    if (Equal(a.first, b.first)) return false;
    absl::StatusOr<bool> r = rev ? Less(b.first, a.first) : Less(a.first, b.first);
    if (!r.ok()) {
      error = r.status();
      return false;
    }
    return *r;
  });
  RETURN_IF_ERROR(error);
  std::vector<Value> out;
  out.reserve(keyed.size());
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::List(std::move(out));
}

// The parameters of a filter after its input, as jinja2 (and transformers' tojson) declare
// them; null for filters taking *args/**kwargs.
const std::vector<std::string_view>* FilterParams(std::string_view name) {
  using P = std::vector<std::string_view>;
  static const auto* table = new std::vector<std::pair<std::string_view, P>>{
      {"tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}},
      {"length", {}},
      {"count", {}},
      {"string", {}},
      {"safe", {}},
      {"escape", {}},
      {"e", {}},
      {"forceescape", {}},
      {"upper", {}},
      {"lower", {}},
      {"capitalize", {}},
      {"title", {}},
      {"list", {}},
      {"items", {}},
      {"reverse", {}},
      {"abs", {}},
      {"wordcount", {}},
      {"first", {}},
      {"last", {}},
      {"default", {"default_value", "boolean"}},
      {"d", {"default_value", "boolean"}},
      {"trim", {"chars"}},
      {"replace", {"old", "new", "count"}},
      {"join", {"d", "attribute"}},
      {"sort", {"reverse", "case_sensitive", "attribute"}},
      {"dictsort", {"case_sensitive", "by", "reverse"}},
      {"unique", {"case_sensitive", "attribute"}},
      {"round", {"precision", "method"}},
      {"int", {"default", "base"}},
      {"float", {"default"}},
      {"indent", {"width", "first", "blank"}},
      {"center", {"width"}},
      {"sum", {"attribute", "start"}},
      {"min", {"case_sensitive", "attribute"}},
      {"max", {"case_sensitive", "attribute"}},
      {"attr", {"name"}},
      {"batch", {"linecount", "fill_with"}},
      {"truncate", {"length", "killwords", "end", "leeway"}}};
  for (const auto& [n, params] : *table) {
    if (n == name) return &params;
  }
  return nullptr;
}

absl::StatusOr<Value> Renderer::ApplyFilter(std::string_view name, const Value& v,
                                            CallValues& args) {
  RETURN_IF_ERROR(Step());
  // These are generators in jinja2: always true, and their errors only surface when consumed.
  static constexpr std::string_view kGenerators[] = {"map",        "select", "reject", "selectattr",
                                                     "rejectattr", "unique", "items",  "batch"};
  if (std::find(std::begin(kGenerators), std::end(kGenerators), name) != std::end(kGenerators)) {
    absl::StatusOr<Value> r = ApplyFilterNow(name, v, args);
    if (!r.ok()) {
      if (r.status().code() != absl::StatusCode::kInvalidArgument) return r.status();
      return Value::FailedGenerator(r.status());
    }
    r->generator = true;
    return r;
  }
  return ApplyFilterNow(name, v, args);
}

absl::StatusOr<Value> Renderer::ApplyFilterNow(std::string_view name, const Value& v,
                                               CallValues& args) {
  if (const std::vector<std::string_view>* params = FilterParams(name)) {
    if (args.pos.size() > params->size()) {
      return Error(absl::StrCat("filter '", Sv(name), "' takes at most ", params->size(),
                                " argument(s), got ", args.pos.size()));
    }
    for (size_t i = 0; i < args.kw.size(); ++i) {
      const auto it = std::find(params->begin(), params->end(), args.kw[i].first);
      if (it == params->end()) {
        return Error(absl::StrCat("filter '", Sv(name), "' got an unexpected keyword argument '",
                                  args.kw[i].first, "'"));
      }
      if (static_cast<size_t>(it - params->begin()) < args.pos.size()) {
        return Error(absl::StrCat("filter '", Sv(name), "' got multiple values for argument '",
                                  args.kw[i].first, "'"));
      }
    }
  }
  auto str_arg = [&](size_t i, std::string_view n, std::string def) {
    const Value* a = args.Get(i, n);
    return a == nullptr ? def : Str(*a);
  };
  if (name == "tojson") {
    JsonOptions o;
    if (const Value* a = args.Get(0, "ensure_ascii")) o.ensure_ascii = Truthy(*a);
    if (const Value* a = args.Get(1, "indent"); a != nullptr && !a->is_none()) {
      o.has_indent = true;
      if (a->is_int_like()) {
        o.indent = std::string(std::clamp<int64_t>(a->as_int(), 0, 64), ' ');
      } else if (a->is_string() && a->s().size() <= 1024) {
        o.indent = a->s();
      } else {
        return Error("tojson: indent must be an int or a string");
      }
      o.item_separator = ",";
    }
    if (const Value* a = args.Get(2, "separators"); a != nullptr && !a->is_none()) {
      if (!a->is_list() || a->items().size() != 2 || !a->items()[0].is_string() ||
          !a->items()[1].is_string()) {
        return Error("tojson: separators must be a pair of strings");
      }
      o.item_separator = a->items()[0].s();
      o.key_separator = a->items()[1].s();
    }
    if (const Value* a = args.Get(3, "sort_keys")) o.sort_keys = Truthy(*a);
    std::string out;
    o.max_bytes = limits_.max_output_bytes;
    RETURN_IF_ERROR(JsonDumps(v, o, &out));
    RETURN_IF_ERROR(CheckSize(out.size()));
    return Value::String(std::move(out));
  }
  if (name == "length" || name == "count") {
    switch (v.kind) {
      case Kind::kUndefined:
        return Value::Int(0);
      case Kind::kString:
        return Value::Int(CodePointCount(v.s()));
      case Kind::kList:
        if (v.generator) return Error("object of type 'generator' has no len()");
        return Value::Int(v.items().size());
      case Kind::kDict:
        return Value::Int(v.entries().size());
      default:
        return Error(absl::StrCat("object of type '", TypeName(v), "' has no len()"));
    }
  }
  if (name == "default" || name == "d") {
    const Value* def = args.Get(0, "default_value");
    const Value* boolean = args.Get(1, "boolean");
    if (v.is_undefined() || (boolean != nullptr && Truthy(*boolean) && !Truthy(v))) {
      return def == nullptr ? Value::String("") : *def;
    }
    return v;
  }
  if (name == "string") return Value::String(Str(v));
  if (name == "safe") return Value::String(Str(v));
  if (name == "escape" || name == "e" || name == "forceescape") {
    return Value::String(HtmlEscape(Str(v)));
  }
  if (name == "upper") return Value::String(Upper(Str(v)));
  if (name == "lower") return Value::String(Lower(Str(v)));
  if (name == "capitalize") return Value::String(Capitalize(Str(v)));
  if (name == "title") return Value::String(JinjaTitle(Str(v)));
  if (name == "trim") {
    const Value* chars = args.Get(0, "chars");
    return Value::String(Strip(Str(v), chars, true, true));
  }
  if (name == "replace") {
    const Value* old = args.Get(0, "old");
    const Value* repl = args.Get(1, "new");
    const Value* count = args.Get(2, "count");
    if (old == nullptr || repl == nullptr) return Error("replace() needs old and new");
    int64_t n = -1;
    if (count != nullptr && !count->is_none()) {
      if (!count->is_int_like()) return Error("replace(): count must be an integer");
      n = count->as_int();
    }
    const std::string subject = Str(v), from = Str(*old), to = Str(*repl);
    RETURN_IF_ERROR(CheckSize(ReplacedSize(subject, from, to, n)));
    std::string out = Replace(subject, from, to, n);
    return Value::String(std::move(out));
  }
  if (name == "first") {
    if (v.is_list() && !v.generator) {
      if (v.items().empty()) return Value::Undefined("No first item, sequence was empty.");
      return v.items()[0];
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
    return items[0];
  }
  if (name == "last") {
    if (v.is_undefined()) return Value::Undefined("No last item, sequence was empty.");
    if (v.generator) return Error("'generator' object is not reversible");
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
    return items.back();
  }
  if (name == "join") {
    const std::string sep = str_arg(0, "d", "");
    const Value* attribute = args.Get(1, "attribute");
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += sep;
      if (attribute != nullptr && !attribute->is_none()) {
        ASSIGN_OR_RETURN(Value a, GetPath(items[i], *attribute));
        AppendStr(a, &out);
      } else {
        AppendStr(items[i], &out);
      }
      RETURN_IF_ERROR(CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  if (name == "list") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    return Value::List(std::move(items));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::List({});
    if (!v.is_dict()) return Error("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, val] : v.entries()) out.push_back(Value::List({k, val}, true));
    return Value::List(std::move(out));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<char32_t> cps = Decode(v.s());
      std::reverse(cps.begin(), cps.end());
      return Value::String(Encode(cps));
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    std::reverse(items.begin(), items.end());
    // reversed() of a list, dict or undefined is an iterator; of anything else, a list.
    if (v.is_undefined() || v.is_dict() || (v.is_list() && !v.generator)) {
      return Value::Generator(std::move(items));
    }
    return Value::List(std::move(items));
  }
  if (name == "sort") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    return SortedList(std::move(items), args, 0, false);
  }
  if (name == "dictsort") {
    if (!v.is_dict()) return Error("dictsort: value is not a mapping");
    std::vector<Value> pairs;
    for (const auto& [k, val] : v.entries()) pairs.push_back(Value::List({k, val}, true));
    return SortedList(std::move(pairs), args, 0, true);
  }
  if (name == "unique") {
    const Value* cs = args.Get(0, "case_sensitive");
    const Value* attribute = args.Get(1, "attribute");
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    std::vector<Value> seen, out;
    for (Value& item : items) {
      RETURN_IF_ERROR(Step());
      Value key = item;
      if (attribute != nullptr && !attribute->is_none()) {
        ASSIGN_OR_RETURN(key, GetPath(item, *attribute));
      }
      if ((cs == nullptr || !Truthy(*cs)) && key.is_string()) key = Value::String(Lower(key.s()));
      bool dup = false;
      for (const Value& s : seen) dup |= Equal(s, key);
      if (dup) continue;
      seen.push_back(std::move(key));
      out.push_back(std::move(item));
    }
    return Value::List(std::move(out));
  }
  if (name == "map") {
    if (!Truthy(v)) return Value::List({});  // jinja2: `if value: for item in value: ...`
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    std::vector<Value> out;
    const Value* attribute = nullptr;
    const Value* def = nullptr;
    for (const auto& [k, val] : args.kw) {
      if (k == "attribute") attribute = &val;
      if (k == "default") def = &val;
    }
    if (attribute != nullptr) {
      for (const Value& item : items) {
        ASSIGN_OR_RETURN(Value a, GetPath(item, *attribute));
        if (a.is_undefined() && def != nullptr) a = *def;
        out.push_back(std::move(a));
      }
      return Value::List(std::move(out));
    }
    if (args.pos.empty() || !args.pos[0].is_string())
      return Error("map requires a filter argument");
    const std::string filter = args.pos[0].s();
    if (!IsKnownFilter(filter)) return Error(absl::StrCat("no filter named '", filter, "'"));
    CallValues rest;
    rest.pos.assign(args.pos.begin() + 1, args.pos.end());
    rest.kw = args.kw;
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value r, ApplyFilter(filter, item, rest));
      out.push_back(std::move(r));
    }
    return Value::List(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "select" || name == "selectattr";
    if (!Truthy(v)) return Value::List({});  // jinja2: `if value: for item in value: ...`
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    size_t next = 0;
    const Value* attribute = nullptr;
    if (attr) {
      if (args.pos.empty()) return Error(absl::StrCat(Sv(name), " needs an attribute"));
      attribute = &args.pos[next++];
    }
    std::string test;
    if (next < args.pos.size()) {
      if (!args.pos[next].is_string()) return Error("test name must be a string");
      test = args.pos[next++].s();
      if (!IsKnownTest(test)) return Error(absl::StrCat("no test named '", test, "'"));
    }
    CallValues rest;
    rest.pos.assign(args.pos.begin() + next, args.pos.end());
    std::vector<Value> out;
    for (Value& item : items) {
      RETURN_IF_ERROR(Step());
      Value subject = item;
      if (attr) {
        ASSIGN_OR_RETURN(subject, GetPath(item, *attribute));
      }
      bool r;
      if (test.empty()) {
        r = Truthy(subject);
      } else {
        ASSIGN_OR_RETURN(r, Test(test, subject, rest));
      }
      if (r == keep_if) out.push_back(std::move(item));
    }
    return Value::List(std::move(out));
  }
  if (name == "abs") {
    if (v.kind == Kind::kFloat) return Value::Float(std::fabs(v.f));
    if (v.is_int_like()) {
      if (v.as_int() == INT64_MIN) return Error("integer overflow");
      return Value::Int(v.as_int() < 0 ? -v.as_int() : v.as_int());
    }
    return Error(absl::StrCat("bad operand type for abs(): '", TypeName(v), "'"));
  }
  if (name == "round") {
    const Value* precision = args.Get(0, "precision");
    const std::string method = str_arg(1, "method", "common");
    const int64_t p = precision != nullptr && precision->is_int_like() ? precision->as_int() : 0;
    if (!v.is_number())
      return Error(absl::StrCat("type ", TypeName(v), " doesn't define __round__ method"));
    if (method == "common") {
      if (v.is_int_like()) return Value::Int(v.as_int());  // round(int, n) is the int
      return Value::Float(PyRound(v.f, p));
    }
    if (method != "ceil" && method != "floor") {
      return Error("method must be common, ceil or floor");
    }
    const double scale = std::pow(10.0, static_cast<double>(p));
    const double x = v.as_double() * scale;
    return Value::Float((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  }
  if (name == "int") {
    const Value* def = args.Get(0, "default");
    const Value* base = args.Get(1, "base");
    const Value fallback = def == nullptr ? Value::Int(0) : *def;
    if (v.is_undefined()) return Error(v.undefined_message());
    if (v.is_int_like()) return Value::Int(v.as_int());
    if (v.kind == Kind::kFloat) {
      if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return fallback;
      return Value::Int(static_cast<int64_t>(v.f));
    }
    if (v.is_string()) {
      int64_t i;
      const int b = base != nullptr && base->is_int_like() ? static_cast<int>(base->as_int()) : 10;
      if (b >= 2 && b <= 36 && ParsePyInt(v.s(), b, &i)) return Value::Int(i);
      double d;
      if (ParsePyFloat(v.s(), &d) && std::isfinite(d) && std::fabs(d) < 9.2e18) {
        return Value::Int(static_cast<int64_t>(d));
      }
    }
    return fallback;
  }
  if (name == "float") {
    const Value* def = args.Get(0, "default");
    if (v.is_undefined()) return Error(v.undefined_message());
    if (v.is_number()) return Value::Float(v.as_double());
    double d;
    if (v.is_string() && ParsePyFloat(v.s(), &d)) return Value::Float(d);
    return def == nullptr ? Value::Float(0.0) : *def;
  }
  if (name == "indent") {
    const Value* width = args.Get(0, "width");
    const Value* first = args.Get(1, "first");
    const Value* blank = args.Get(2, "blank");
    std::string indention;
    if (width == nullptr) {
      indention = "    ";
    } else if (width->is_string()) {
      indention = width->s();
    } else if (width->is_int_like()) {
      indention = std::string(std::clamp<int64_t>(width->as_int(), 0, 4096), ' ');
    } else {
      return Error("indent: width must be an int or a string");
    }
    if (!v.is_string()) {
      if (v.is_undefined()) return Error(v.undefined_message());
      return Error(absl::StrCat("'", TypeName(v), "' object has no attribute 'splitlines'"));
    }
    std::string s = v.s() + "\n";
    std::vector<std::string> lines = SplitLines(s, false);
    RETURN_IF_ERROR(CheckSize(s.size() + (lines.size() + 1) * indention.size()));
    std::string rv;
    if (blank != nullptr && Truthy(*blank)) {
      rv = absl::StrJoin(lines, "\n" + indention);
    } else {
      rv = lines.empty() ? "" : lines[0];
      for (size_t i = 1; i < lines.size(); ++i) {
        rv += "\n";
        if (!lines[i].empty()) rv += indention;
        rv += lines[i];
      }
    }
    if (first != nullptr && Truthy(*first)) rv = indention + rv;
    RETURN_IF_ERROR(CheckSize(rv.size()));
    return Value::String(std::move(rv));
  }
  if (name == "center") {
    const Value* width = args.Get(0, "width");
    const int64_t w = width == nullptr ? 80 : width->is_int_like() ? width->as_int() : -1;
    if (width != nullptr && !width->is_int_like()) return Error("center: width must be an integer");
    RETURN_IF_ERROR(CheckSize(static_cast<size_t>(std::max<int64_t>(w, 0))));
    const std::string s = Str(v);
    const int64_t len = CodePointCount(s);
    if (w <= len) return Value::String(s);
    const int64_t marg = w - len;
    const int64_t left = marg / 2 + (marg & w & 1);
    return Value::String(std::string(left, ' ') + s + std::string(marg - left, ' '));
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : Decode(Str(v))) {
      const bool w = IsWordChar(c);
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value::Int(n);
  }
  if (name == "format") {
    if (!args.kw.empty() && !args.pos.empty()) {
      return Error("can't handle positional and keyword arguments at the same time");
    }
    if (!args.kw.empty()) {
      std::vector<std::pair<Value, Value>> entries;
      for (auto& [k, val] : args.kw) entries.emplace_back(Value::String(k), val);
      return PercentFormat(Str(v), Value::Dict(std::move(entries)));
    }
    return PercentFormat(Str(v), Value::List(args.pos, true));
  }
  if (name == "sum") {
    const Value* attribute = args.Get(0, "attribute");
    const Value* start = args.Get(1, "start");
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    Value total = start == nullptr ? Value::Int(0) : *start;
    for (const Value& item : items) {
      Value x = item;
      if (attribute != nullptr && !attribute->is_none()) {
        ASSIGN_OR_RETURN(x, GetPath(item, *attribute));
      }
      ASSIGN_OR_RETURN(total, Binary("+", total, x));
    }
    return total;
  }
  if (name == "min" || name == "max") {
    const Value* cs = args.Get(0, "case_sensitive");
    const Value* attribute = args.Get(1, "attribute");
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    Value best_key;
    for (size_t i = 0; i < items.size(); ++i) {
      Value key = items[i];
      if (attribute != nullptr && !attribute->is_none()) {
        ASSIGN_OR_RETURN(key, GetPath(items[i], *attribute));
      }
      if ((cs == nullptr || !Truthy(*cs)) && key.is_string()) key = Value::String(Lower(key.s()));
      if (i == 0) {
        best_key = key;
        continue;
      }
      ASSIGN_OR_RETURN(bool better, name == "min" ? Less(key, best_key) : Less(best_key, key));
      if (better) {
        best = i;
        best_key = key;
      }
    }
    return items[best];
  }
  if (name == "attr") {
    const Value* attribute = args.Get(0, "name");
    if (attribute == nullptr || !attribute->is_string()) return Error("attr needs a name");
    if (v.is_dict()) {
      const std::string& n = attribute->s();
      if (n == "items" || n == "keys" || n == "values" || n == "get" || n == "copy") {
        return BoundMethod(v, n);
      }
      return NoAttribute(v, n);
    }
    return GetAttr(v, attribute->s());
  }
  if (name == "batch") {
    const Value* count = args.Get(0, "linecount");
    const Value* fill = args.Get(1, "fill_with");
    if (count == nullptr || !count->is_int_like() || count->as_int() <= 0) {
      return Error("batch needs a positive line count");
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    std::vector<Value> out, cur;
    for (Value& item : items) {
      cur.push_back(std::move(item));
      if (static_cast<int64_t>(cur.size()) == count->as_int()) {
        out.push_back(Value::List(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (fill != nullptr && !fill->is_none()) {
        while (static_cast<int64_t>(cur.size()) < count->as_int()) cur.push_back(*fill);
      }
      out.push_back(Value::List(std::move(cur)));
    }
    return Value::List(std::move(out));
  }
  if (name == "truncate") {
    const Value* length = args.Get(0, "length");
    const Value* killwords = args.Get(1, "killwords");
    const std::string end = str_arg(2, "end", "...");
    const Value* leeway = args.Get(3, "leeway");
    const int64_t len = length != nullptr && length->is_int_like() ? length->as_int() : 255;
    const int64_t lee = leeway != nullptr && leeway->is_int_like() ? leeway->as_int() : 5;
    if (!v.is_string()) {
      // jinja2 takes len() of the value and returns it unchanged when short enough.
      int64_t n = -1;
      if (v.is_list() && !v.generator) n = v.items().size();
      if (v.is_dict()) n = v.entries().size();
      if (v.is_undefined()) n = 0;
      if (n < 0) return Error(absl::StrCat("object of type '", TypeName(v), "' has no len()"));
      if (n <= len + lee) return v;
      return Error("truncate: value is not a string");
    }
    const std::vector<char32_t> cps = Decode(v.s());
    const int64_t end_len = CodePointCount(end);
    if (len < end_len) return Error("expected length >= len(end)");
    if (lee < 0) return Error("expected leeway >= 0");
    if (static_cast<int64_t>(cps.size()) <= len + lee) return Value::String(Encode(cps));
    std::string head = Encode(std::vector<char32_t>(cps.begin(), cps.begin() + (len - end_len)));
    if (killwords != nullptr && Truthy(*killwords)) return Value::String(head + end);
    const size_t sp = head.rfind(' ');
    if (sp != std::string::npos) head.resize(sp);
    return Value::String(head + end);
  }
  return Error(absl::StrCat("no filter named '", Sv(name), "'"));
}

// ---------------------------------------------------------------------------------------------
// Methods of Python objects.

absl::StatusOr<Value> Renderer::CallMethod(const Value& self, const std::string& name,
                                           CallValues& args) {
  if (self.is_string()) return StrMethod(self.s(), name, args);
  if (self.is_dict()) {
    if (name == "items") {
      std::vector<Value> out;
      for (const auto& [k, val] : self.entries()) out.push_back(Value::List({k, val}, true));
      return Value::List(std::move(out));
    }
    if (name == "keys" || name == "values") {
      std::vector<Value> out;
      for (const auto& [k, val] : self.entries()) out.push_back(name == "keys" ? k : val);
      return Value::List(std::move(out));
    }
    if (name == "get") {
      const Value* key = args.Get(0, "key");
      if (key == nullptr) return Error("get expected at least 1 argument, got 0");
      if (const Value* v = AsDict(self)->Find(*key)) return *v;
      const Value* def = args.Get(1, "default");
      return def == nullptr ? Value::None() : *def;
    }
    if (name == "copy") return Value::Dict(self.entries());
    if (name == "fromkeys") {
      const Value* keys = args.Get(0, "iterable");
      const Value* val = args.Get(1, "value");
      if (keys == nullptr) return Error("fromkeys expected at least 1 argument");
      ASSIGN_OR_RETURN(std::vector<Value> ks, Iterate(*keys));
      auto dict = std::make_shared<DictObject>();
      for (Value& k : ks) dict->Set(k, val == nullptr ? Value::None() : *val);
      Value v;
      v.kind = Kind::kDict;
      v.obj = std::move(dict);
      return v;
    }
  }
  if (self.is_list()) {
    if (name == "copy") return Value::List(self.items());
    if (name == "count") {
      if (args.pos.size() != 1) return Error("count() takes exactly one argument");
      int64_t n = 0;
      for (const Value& v : self.items()) n += Equal(v, args.pos[0]);
      return Value::Int(n);
    }
    if (name == "index") {
      if (args.pos.empty()) return Error("index expected at least 1 argument");
      for (size_t i = 0; i < self.items().size(); ++i) {
        if (Equal(self.items()[i], args.pos[0])) return Value::Int(i);
      }
      return Error(absl::StrCat(Repr(args.pos[0]), " is not in list"));
    }
  }
  if (self.kind == Kind::kFloat && name == "is_integer") {
    return Value::Bool(std::isfinite(self.f) && self.f == std::floor(self.f));
  }
  return Error(absl::StrCat("'", TypeName(self), "' object has no attribute '", name, "'"));
}

absl::StatusOr<Value> Renderer::StrMethod(const std::string& s, const std::string& name,
                                          CallValues& args) {
  auto need_str = [&](size_t i, std::string_view n) -> absl::StatusOr<const Value*> {
    const Value* a = args.Get(i, n);
    if (a == nullptr) return Error(absl::StrCat(name, "() missing an argument"));
    if (!a->is_string()) {
      if (a->is_undefined()) return Error(a->undefined_message());
      return Error(absl::StrCat("must be str, not ", TypeName(*a)));
    }
    return a;
  };
  auto int_arg = [&](size_t i, std::string_view n, int64_t def) -> absl::StatusOr<int64_t> {
    const Value* a = args.Get(i, n);
    if (a == nullptr || a->is_none()) return def;
    if (!a->is_int_like())
      return Error(absl::StrCat("'", TypeName(*a), "' object cannot be interpreted as an integer"));
    return a->as_int();
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = args.Get(0, "chars");
    if (chars != nullptr && !chars->is_none() && !chars->is_string()) {
      return Error(absl::StrCat(name, " arg must be None or str"));
    }
    return Value::String(Strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const Value* sep = args.Get(0, "sep");
    ASSIGN_OR_RETURN(int64_t maxsplit, int_arg(1, "maxsplit", -1));
    std::vector<std::string> parts;
    if (sep == nullptr || sep->is_none()) {
      parts = SplitWhitespace(s, maxsplit, name == "rsplit");
    } else {
      if (!sep->is_string()) return Error("must be str or None");
      if (sep->s().empty()) return Error("empty separator");
      parts = SplitSep(s, sep->s(), maxsplit, name == "rsplit");
    }
    std::vector<Value> out;
    out.reserve(parts.size());
    for (std::string& p : parts) out.push_back(Value::String(std::move(p)));
    return Value::List(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    const Value* arg = args.Get(0, "prefix");
    if (arg == nullptr) return Error(absl::StrCat(name, " takes at least 1 argument"));
    std::vector<Value> options;
    if (arg->is_list() && arg->tuple) {
      options = arg->items();
    } else if (arg->is_string()) {
      options.push_back(*arg);
    } else {
      return Error(
          absl::StrCat(name, " first arg must be str or a tuple of str, not ", TypeName(*arg)));
    }
    std::string_view subject = s;
    const Value* start = args.Get(1, "start");
    const Value* end = args.Get(2, "end");
    std::string sliced;
    if ((start != nullptr && !start->is_none()) || (end != nullptr && !end->is_none())) {
      ASSIGN_OR_RETURN(Value sub, Slice(Value::String(s), start ? *start : Value::None(),
                                        end ? *end : Value::None(), Value::None()));
      sliced = sub.s();
      subject = sliced;
    }
    for (const Value& o : options) {
      if (!o.is_string()) return Error("tuple for startswith must only contain str");
      if (name == "startswith" ? subject.starts_with(o.s()) : subject.ends_with(o.s())) {
        return Value::Bool(true);
      }
    }
    return Value::Bool(false);
  }
  if (name == "upper") return Value::String(Upper(s));
  if (name == "lower" || name == "casefold") return Value::String(Lower(s));
  if (name == "title") return Value::String(PyTitle(s));
  if (name == "capitalize") return Value::String(Capitalize(s));
  if (name == "swapcase") {
    std::vector<char32_t> cps = Decode(s);
    for (char32_t& c : cps) c = PyLower(c) != c ? PyLower(c) : PyUpper(c);
    return Value::String(Encode(cps));
  }
  if (name == "replace") {
    ASSIGN_OR_RETURN(const Value* old, need_str(0, "old"));
    ASSIGN_OR_RETURN(const Value* repl, need_str(1, "new"));
    ASSIGN_OR_RETURN(int64_t count, int_arg(2, "count", -1));
    RETURN_IF_ERROR(CheckSize(ReplacedSize(s, old->s(), repl->s(), count)));
    std::string out = Replace(s, old->s(), repl->s(), count);
    return Value::String(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    ASSIGN_OR_RETURN(const Value* sub, need_str(0, "sub"));
    const bool ascii = IsAscii(s);
    if (name == "count") {
      if (sub->s().empty()) return Value::Int(CodePointCount(s) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub->s()); at != std::string::npos;
           at = s.find(sub->s(), at + sub->s().size())) {
        ++n;
      }
      return Value::Int(n);
    }
    const size_t at = (name == "find" || name == "index") ? s.find(sub->s()) : s.rfind(sub->s());
    if (at == std::string::npos) {
      if (name == "index" || name == "rindex") return Error("substring not found");
      return Value::Int(-1);
    }
    return Value::Int(ascii ? at : CodePointCount(std::string_view(s).substr(0, at)));
  }
  if (name == "join") {
    const Value* items = args.Get(0, "iterable");
    if (items == nullptr) return Error("join() takes exactly one argument");
    ASSIGN_OR_RETURN(std::vector<Value> list, Iterate(*items));
    std::string out;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_string()) {
        return Error(absl::StrCat("sequence item ", i, ": expected str instance, ",
                                  TypeName(list[i]), " found"));
      }
      if (i > 0) out += s;
      out += list[i].s();
      RETURN_IF_ERROR(CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  if (name == "splitlines") {
    const Value* keep = args.Get(0, "keepends");
    std::vector<Value> out;
    for (std::string& line : SplitLines(s, keep != nullptr && Truthy(*keep))) {
      out.push_back(Value::String(std::move(line)));
    }
    return Value::List(std::move(out));
  }
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal" || name == "isalpha" ||
      name == "isalnum" || name == "isspace") {
    std::vector<char32_t> cps = Decode(s);
    if (cps.empty()) return Value::Bool(false);
    for (char32_t c : cps) {
      bool ok;
      if (name == "isalpha") {
        ok = IsPyAlpha(c);
      } else if (name == "isalnum") {
        ok = IsPyAlpha(c) || IsPyDigit(c);
      } else if (name == "isspace") {
        ok = IsPySpace(c);
      } else {
        ok = IsPyDigit(c);
      }
      if (!ok) return Value::Bool(false);
    }
    return Value::Bool(true);
  }
  if (name == "islower" || name == "isupper") {
    bool cased = false;
    for (char32_t c : Decode(s)) {
      if (!IsCased(c)) continue;
      cased = true;
      if (name == "islower" ? PyLower(c) != c : PyUpper(c) != c) return Value::Bool(false);
    }
    return Value::Bool(cased);
  }
  if (name == "isascii") return Value::Bool(IsAscii(s));
  if (name == "zfill" || name == "center" || name == "ljust" || name == "rjust") {
    ASSIGN_OR_RETURN(int64_t width, int_arg(0, "width", 0));
    RETURN_IF_ERROR(CheckSize(static_cast<size_t>(std::max<int64_t>(width, 0))));
    std::string fill = " ";
    if (name != "zfill") {
      if (const Value* f = args.Get(1, "fillchar")) {
        if (!f->is_string() || CodePointCount(f->s()) != 1) {
          return Error("The fill character must be exactly one character long");
        }
        fill = f->s();
      }
    }
    const int64_t len = CodePointCount(s);
    if (width <= len) return Value::String(s);
    const int64_t pad = width - len;
    auto rep = [&](int64_t n) {
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += fill;
      return out;
    };
    if (name == "zfill") {
      if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
        return Value::String(s.substr(0, 1) + std::string(pad, '0') + s.substr(1));
      }
      return Value::String(std::string(pad, '0') + s);
    }
    if (name == "ljust") return Value::String(s + rep(pad));
    if (name == "rjust") return Value::String(rep(pad) + s);
    const int64_t left = pad / 2 + (pad & width & 1);
    return Value::String(rep(left) + s + rep(pad - left));
  }
  if (name == "partition" || name == "rpartition") {
    ASSIGN_OR_RETURN(const Value* sep, need_str(0, "sep"));
    if (sep->s().empty()) return Error("empty separator");
    const size_t at = name == "partition" ? s.find(sep->s()) : s.rfind(sep->s());
    if (at == std::string::npos) {
      if (name == "partition") {
        return Value::List({Value::String(s), Value::String(""), Value::String("")}, true);
      }
      return Value::List({Value::String(""), Value::String(""), Value::String(s)}, true);
    }
    return Value::List(
        {Value::String(s.substr(0, at)), *sep, Value::String(s.substr(at + sep->s().size()))},
        true);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    ASSIGN_OR_RETURN(const Value* a, need_str(0, "prefix"));
    if (name == "removeprefix" && std::string_view(s).starts_with(a->s())) {
      return Value::String(s.substr(a->s().size()));
    }
    if (name == "removesuffix" && !a->s().empty() && std::string_view(s).ends_with(a->s())) {
      return Value::String(s.substr(0, s.size() - a->s().size()));
    }
    return Value::String(s);
  }
  if (name == "format") {
    // str.format with {} / {0} / {name} fields (no format specs or conversions).
    std::string out;
    size_t auto_index = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      if (c == '}') {
        if (i + 1 < s.size() && s[i + 1] == '}') {
          out.push_back('}');
          ++i;
          continue;
        }
        return Error("Single '}' encountered in format string");
      }
      if (c != '{') {
        out.push_back(c);
        continue;
      }
      if (i + 1 < s.size() && s[i + 1] == '{') {
        out.push_back('{');
        ++i;
        continue;
      }
      const size_t close = s.find('}', i);
      if (close == std::string::npos) return Error("Single '{' encountered in format string");
      const std::string field = s.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!{[.") != std::string::npos) {
        return Error("format specs in str.format are not supported");
      }
      const Value* v = nullptr;
      int64_t index;
      if (field.empty()) {
        v = auto_index < args.pos.size() ? &args.pos[auto_index] : nullptr;
        ++auto_index;
      } else if (ParsePyInt(field, 10, &index)) {
        v = index >= 0 && static_cast<size_t>(index) < args.pos.size() ? &args.pos[index] : nullptr;
      } else {
        for (const auto& [k, val] : args.kw) {
          if (k == field) v = &val;
        }
      }
      if (v == nullptr) return Error(absl::StrCat("Replacement index out of range: {", field, "}"));
      AppendStr(*v, &out);
      RETURN_IF_ERROR(CheckSize(out.size()));
      i = close;
    }
    return Value::String(std::move(out));
  }
  return Error(absl::StrCat("str method '", name, "' is not supported"));
}

}  // namespace

bool IsKnownFilter(std::string_view name) {
  static constexpr std::string_view kFilters[] = {
      "abs",     "attr",     "batch", "capitalize", "center", "count",      "d",
      "default", "dictsort", "e",     "escape",     "first",  "float",      "forceescape",
      "format",  "indent",   "int",   "items",      "join",   "last",       "length",
      "list",    "lower",    "map",   "max",        "min",    "reject",     "rejectattr",
      "replace", "reverse",  "round", "safe",       "select", "selectattr", "sort",
      "string",  "sum",      "title", "tojson",     "trim",   "truncate",   "unique",
      "upper",   "wordcount"};
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool IsKnownTest(std::string_view name) {
  static constexpr std::string_view kTests[] = {
      "defined", "undefined",   "none",     "string",      "number", "integer",  "float",
      "mapping", "iterable",    "sequence", "boolean",     "true",   "false",    "odd",
      "even",    "divisibleby", "equalto",  "eq",          "ne",     "lt",       "gt",
      "ge",      "le",          "lessthan", "greaterthan", "in",     "callable", "lower",
      "upper",   "sameas",      "escaped",  "filter",      "test"};
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

}  // namespace internal

absl::StatusOr<JinjaTemplate> JinjaTemplate::Parse(std::string_view source,
                                                   const JinjaOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<const internal::Program> program,
                   internal::ParseProgram(source, options));
  return JinjaTemplate(std::move(program));
}

absl::StatusOr<std::string> JinjaTemplate::Render(const nlohmann::ordered_json& context,
                                                  const RenderLimits& limits) const {
  if (!context.is_object() && !context.is_null()) {
    return absl::InvalidArgumentError("template context must be a JSON object");
  }
  absl::StatusOr<internal::Value> globals =
      context.is_null() ? internal::Value::Dict({}) : internal::FromJson(context);
  if (!globals.ok()) return globals.status();
  const absl::Time now = limits.now ? limits.now() : absl::Now();
  internal::Renderer renderer(limits, *std::move(globals), now);
  return renderer.Run(*program_);
}

}  // namespace tandem::chat
