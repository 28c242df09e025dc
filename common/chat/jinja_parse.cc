// jinja2's lexer and parser, for the syntax chat templates use.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/chat/jinja_ast.h"

namespace tandem::chat::internal {
namespace {

constexpr int kMaxNesting = 150;
constexpr int kMaxHeight = 200;

enum class Tok {
  kData,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string text;
  int line = 1;
  Value value;
};

absl::Status SyntaxError(int line, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", Sv(message)));
}

// Python's whitespace (str.isspace, the regex \s jinja2's lexer uses): the byte length of the
// whitespace character at s[i], or 0.
size_t SpaceAt(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  const unsigned char c = s[i];
  if (c < 0x80) return (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f)) ? 1 : 0;
  const size_t len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  const std::vector<char32_t> cps = Decode(s.substr(i, len));
  return cps.size() == 1 && IsPySpace(cps[0]) ? len : 0;
}
// The byte length of the whitespace character that ends at s[end - 1], or 0.
size_t SpaceBefore(std::string_view s, size_t end) {
  for (size_t len = 1; len <= 3 && len <= end; ++len) {
    if (SpaceAt(s, end - len) == len) return len;
  }
  return 0;
}
bool AllSpace(std::string_view s, size_t from) {
  if (from >= s.size()) return false;
  for (size_t i = from; i < s.size();) {
    const size_t k = SpaceAt(s, i);
    if (k == 0) return false;
    i += k;
  }
  return true;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

#define RETURN_IF_ERR(expr)   \
  do {                        \
    absl::Status _s = (expr); \
    if (!_s.ok()) return _s;  \
  } while (0)
#define ASSIGN_OR_RET(lhs, expr)                \
  auto lhs##_or = (expr);                       \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = std::move(lhs##_or).value()

class Lexer {
 public:
  Lexer(std::string_view source, const JinjaOptions& options) : options_(options) {
    // jinja2 normalizes newlines to \n and drops one trailing newline.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
        src_.push_back('\n');
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  absl::StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t start = pos_;
      for (;;) {
        start = src_.find('{', start);
        if (start == std::string::npos || start + 1 >= src_.size()) {
          start = std::string::npos;
          break;
        }
        const char k = src_[start + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++start;
      }
      if (start == std::string::npos) {
        Emit(Tok::kData, src_.substr(pos_));
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      const char kind = src_[start + 1];
      size_t after = start + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      size_t raw_end = 0;
      const bool raw = kind == '%' && MatchRaw(after, "raw", &raw_end);
      if (sign == '-') {
        size_t n = text.size();
        while (const size_t k = SpaceBefore(text, n)) n -= k;
        text.resize(n);
      } else if (sign != '+' && options_.lstrip_blocks && kind != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (l_pos > 0 || line_starting) {
          const bool all_space = AllSpace(text, l_pos);
          if (all_space) text.resize(l_pos);
        }
      }
      Emit(Tok::kData, text);
      CountLines(pos_, start);
      pos_ = after;
      if (raw) {
        RETURN_IF_ERR(LexRaw(raw_end));
        line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
        continue;
      }
      if (kind == '#') {
        RETURN_IF_ERR(LexComment());
      } else {
        RETURN_IF_ERR(LexTag(kind));
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Token{Tok::kEof, "", line_, {}});
    return std::move(tokens_);
  }

 private:
  void Emit(Tok type, std::string text) {
    if (type == Tok::kData && text.empty()) return;
    tokens_.push_back(Token{type, std::move(text), line_, {}});
  }
  void CountLines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) line_ += src_[i] == '\n';
  }

  // At `p`: whitespace, `word`, whitespace, then -%} or %}; *end is past it (and past the
  // whitespace a -%} strips).
  bool MatchRaw(size_t p, std::string_view word, size_t* end) const {
    while (const size_t k = SpaceAt(src_, p)) p += k;
    if (src_.compare(p, word.size(), word) != 0) return false;
    p += word.size();
    if (p < src_.size() && IsNameChar(src_[p])) return false;
    while (const size_t k = SpaceAt(src_, p)) p += k;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (const size_t k = SpaceAt(src_, p)) p += k;
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    *end = p;
    return true;
  }

  absl::Status LexRaw(size_t begin_end) {
    CountLines(pos_, begin_end);
    pos_ = begin_end;
    if (pos_ >= src_.size()) return absl::OkStatus();  // jinja2 stops quietly here
    // The body runs to {%[-+]? endraw [-+]?%}.
    for (size_t p = src_.find("{%", pos_); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (const size_t k = SpaceAt(src_, q)) q += k;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (const size_t k = SpaceAt(src_, q)) q += k;
      size_t end;
      if (src_.compare(q, 3, "+%}") == 0) {
        end = q + 3;
      } else if (src_.compare(q, 3, "-%}") == 0) {
        end = q + 3;
        while (const size_t k = SpaceAt(src_, end)) end += k;
      } else if (src_.compare(q, 2, "%}") == 0) {
        end = q + 2;
        if (options_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      std::string text = src_.substr(pos_, p - pos_);
      if (sign == '-') {
        size_t n = text.size();
        while (const size_t k = SpaceBefore(text, n)) n -= k;
        text.resize(n);
      } else if (sign != '+' && options_.lstrip_blocks) {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0) {  // line_starting is false right after the raw tag
          const bool all_space = AllSpace(text, l_pos);
          if (all_space) text.resize(l_pos);
        }
      }
      Emit(Tok::kData, text);
      CountLines(pos_, end);
      pos_ = end;
      return absl::OkStatus();
    }
    return SyntaxError(line_, "missing end of raw directive");
  }

  absl::Status LexComment() {
    if (pos_ >= src_.size()) return absl::OkStatus();  // jinja2 stops quietly here
    for (size_t p = pos_; p < src_.size(); ++p) {
      size_t end = 0;
      if (src_.compare(p, 3, "+#}") == 0) {
        end = p + 3;
      } else if (src_.compare(p, 3, "-#}") == 0) {
        end = p + 3;
        while (const size_t k = SpaceAt(src_, end)) end += k;
      } else if (src_.compare(p, 2, "#}") == 0) {
        end = p + 2;
        if (options_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      CountLines(pos_, end);
      pos_ = end;
      return absl::OkStatus();
    }
    return SyntaxError(line_, "missing end of comment tag");
  }

  absl::Status LexTag(char kind) {
    const int begin_line = line_;
    Emit(kind == '%' ? Tok::kBlockBegin : Tok::kVarBegin, kind == '%' ? "{%" : "{{");
    for (;;) {
      while (const size_t k = SpaceAt(src_, pos_)) {
        line_ += src_[pos_] == '\n';
        pos_ += k;
      }
      if (pos_ >= src_.size()) {
        return SyntaxError(begin_line, kind == '%' ? "unexpected end of template, expected '%}'"
                                                   : "unexpected end of template, expected '}}'");
      }
      // As in jinja2, the end of the tag is only looked for where brackets balance.
      if (!brackets_.empty()) {
        RETURN_IF_ERR(LexToken());
        continue;
      }
      const char close = kind == '%' ? '%' : '}';
      const std::string end2 = std::string(1, close) + "}";
      if (src_.compare(pos_, 3, "-" + end2) == 0) {
        Emit(kind == '%' ? Tok::kBlockEnd : Tok::kVarEnd, end2);
        pos_ += 3;
        while (const size_t k = SpaceAt(src_, pos_)) {
          line_ += src_[pos_] == '\n';
          pos_ += k;
        }
        return absl::OkStatus();
      }
      if (kind == '%' && src_.compare(pos_, 3, "+%}") == 0) {
        Emit(Tok::kBlockEnd, end2);
        pos_ += 3;
        return absl::OkStatus();
      }
      if (src_.compare(pos_, 2, end2) == 0) {
        Emit(kind == '%' ? Tok::kBlockEnd : Tok::kVarEnd, end2);
        pos_ += 2;
        if (kind == '%' && options_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
          ++line_;
          ++pos_;
        }
        return absl::OkStatus();
      }
      RETURN_IF_ERR(LexToken());
    }
  }

  absl::Status LexToken() {
    const char c = src_[pos_];
    if (IsDigit(c)) return LexNumber();
    if (IsNameStart(c)) {
      size_t end = pos_;
      while (end < src_.size() && IsNameChar(src_[end])) ++end;
      Emit(Tok::kName, src_.substr(pos_, end - pos_));
      pos_ = end;
      return absl::OkStatus();
    }
    if (c == '\'' || c == '"') return LexString(c);
    static constexpr std::string_view kOps2[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kOps2) {
      if (src_.compare(pos_, 2, op) == 0) {
        Emit(Tok::kOp, std::string(op));
        pos_ += 2;
        return absl::OkStatus();
      }
    }
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) != std::string_view::npos) {
      if (c == '(' || c == '[' || c == '{') {
        brackets_.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (c == ')' || c == ']' || c == '}') {
        if (brackets_.empty()) {
          return SyntaxError(line_, absl::StrCat("unexpected '", std::string(1, c), "'"));
        }
        if (brackets_.back() != c) {
          return SyntaxError(line_, absl::StrCat("unexpected '", std::string(1, c), "', expected '",
                                                 std::string(1, brackets_.back()), "'"));
        }
        brackets_.pop_back();
      }
      Emit(Tok::kOp, std::string(1, c));
      ++pos_;
      return absl::OkStatus();
    }
    return SyntaxError(line_, absl::StrCat("unexpected char '", std::string(1, c), "'"));
  }

  absl::Status LexNumber() {
    auto digits = [&](size_t p, bool hex) {
      while (p < src_.size() && (IsDigit(src_[p]) || (hex && HexValue(src_[p]) >= 0) ||
                                 (src_[p] == '_' && p + 1 < src_.size() &&
                                  (IsDigit(src_[p + 1]) || (hex && HexValue(src_[p + 1]) >= 0))))) {
        ++p;
      }
      return p;
    };
    auto clean = [](std::string s) {
      std::string out;
      for (char ch : s) {
        if (ch != '_') out.push_back(ch);
      }
      return out;
    };
    const char c1 = pos_ + 1 < src_.size() ? src_[pos_ + 1] : 0;
    if (src_[pos_] == '0' &&
        (c1 == 'x' || c1 == 'X' || c1 == 'o' || c1 == 'O' || c1 == 'b' || c1 == 'B')) {
      const int base = (c1 == 'x' || c1 == 'X') ? 16 : (c1 == 'o' || c1 == 'O') ? 8 : 2;
      size_t end = pos_ + 2;
      if (end < src_.size() && src_[end] == '_') ++end;
      end = digits(end, base == 16);
      const std::string body = clean(src_.substr(pos_ + 2, end - pos_ - 2));
      if (!body.empty()) {
        errno = 0;
        char* stop = nullptr;
        const long long v = std::strtoll(body.c_str(), &stop, base);
        if (errno != 0 || *stop != 0) return SyntaxError(line_, "invalid integer literal");
        Token t{Tok::kInt, src_.substr(pos_, end - pos_), line_, Value::Int(v)};
        tokens_.push_back(std::move(t));
        pos_ = end;
        return absl::OkStatus();
      }
    }
    size_t end = digits(pos_, false);
    bool is_float = false;
    const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
    if (!after_dot && end + 1 < src_.size() && src_[end] == '.' && IsDigit(src_[end + 1])) {
      end = digits(end + 1, false);
      is_float = true;
    }
    if (!after_dot && end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t p = end + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && IsDigit(src_[p])) {
        end = digits(p, false);
        is_float = true;
      }
    }
    const std::string text = clean(src_.substr(pos_, end - pos_));
    Token t{is_float ? Tok::kFloat : Tok::kInt, text, line_, {}};
    if (is_float) {
      t.value = Value::Float(std::strtod(text.c_str(), nullptr));
    } else {
      errno = 0;
      const long long v = std::strtoll(text.c_str(), nullptr, 10);
      if (errno != 0) return SyntaxError(line_, "integer literal too large");
      t.value = Value::Int(v);
    }
    tokens_.push_back(std::move(t));
    pos_ = end;
    return absl::OkStatus();
  }

  absl::Status LexString(char quote) {
    const int line = line_;
    size_t p = pos_ + 1;
    std::string out;
    while (p < src_.size() && src_[p] != quote) {
      const char c = src_[p];
      if (c == '\n') ++line_;
      if (c != '\\') {
        out.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) break;
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n':
          ++line_;
          break;
        case '\\':
        case '\'':
        case '"':
          out.push_back(e);
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < n; ++k) {
            const int h = p + k < src_.size() ? HexValue(src_[p + k]) : -1;
            if (h < 0)
              return SyntaxError(line, absl::StrCat("truncated \\", std::string(1, e), " escape"));
            cp = cp * 16 + h;
          }
          if (cp > 0x10ffff) return SyntaxError(line, "illegal Unicode character");
          if (cp >= 0xd800 && cp <= 0xdfff) cp = 0xfffd;
          AppendCodePoint(cp, &out);
          p += n;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = e - '0';
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) {
              cp = cp * 8 + (src_[p++] - '0');
            }
            AppendCodePoint(cp, &out);
          } else {
            out.push_back('\\');
            out.push_back(e);
            if (e == '\n') ++line_;
          }
      }
    }
    if (p >= src_.size()) return SyntaxError(line, "unterminated string");
    Token t{Tok::kString, out, line, Value::String(out)};
    tokens_.push_back(std::move(t));
    pos_ = p + 1;
    return absl::OkStatus();
  }
#undef RETURN_IF

  const JinjaOptions& options_;
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
  std::string brackets_;  // the closing brackets expected, innermost last
};

// Whether an expression or body reads the variable `name`.
bool Mentions(const Expr* e, std::string_view name);
bool Mentions(const Body& body, std::string_view name) {
  for (const auto& st : body) {
    for (const ExprPtr& e : st->exprs) {
      if (Mentions(e.get(), name)) return true;
    }
    for (const ExprPtr& e : st->filters) {
      if (Mentions(e.get(), name)) return true;
    }
    for (const Body& b : st->bodies) {
      if (Mentions(b, name)) return true;
    }
  }
  return false;
}
bool Mentions(const Expr* e, std::string_view name) {
  if (e == nullptr) return false;
  if (e->type == ExprType::kName && e->name == name) return true;
  for (const ExprPtr& c : e->children) {
    if (Mentions(c.get(), name)) return true;
  }
  for (const ExprPtr& c : e->slice_parts) {
    if (Mentions(c.get(), name)) return true;
  }
  for (const ExprPtr& c : e->args.positional) {
    if (Mentions(c.get(), name)) return true;
  }
  for (const auto& [k, c] : e->args.keyword) {
    if (Mentions(c.get(), name)) return true;
  }
  return Mentions(e->args.star_args.get(), name) || Mentions(e->args.star_kwargs.get(), name);
}

void MarkSpecialNames(Stmt* s) {
  s->uses_varargs = Mentions(s->bodies[0], "varargs");
  s->uses_kwargs = Mentions(s->bodies[0], "kwargs");
  s->uses_caller = Mentions(s->bodies[0], "caller");
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseTemplate() {
    std::string end;
    ASSIGN_OR_RET(body, Subparse({}, &end));
    return body;
  }

 private:
  const Token& Cur() const { return t_[i_]; }
  const Token& Look(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  void Advance() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool IsOp(std::string_view op) const { return Cur().type == Tok::kOp && Cur().text == op; }
  bool IsName(std::string_view n) const { return Cur().type == Tok::kName && Cur().text == n; }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Advance();
    return true;
  }
  bool SkipName(std::string_view n) {
    if (!IsName(n)) return false;
    Advance();
    return true;
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof:
        return "end of template";
      case Tok::kBlockEnd:
        return "end of statement block";
      case Tok::kVarEnd:
        return "end of print statement";
      case Tok::kData:
        return "template data";
      case Tok::kString:
        return "string";
      default:
        return "'" + t.text + "'";
    }
  }
  absl::Status Unexpected() const {
    return SyntaxError(Cur().line, absl::StrCat("unexpected ", Describe(Cur())));
  }
  absl::Status ExpectOp(std::string_view op) {
    if (!SkipOp(op)) {
      return SyntaxError(Cur().line,
                         absl::StrCat("expected '", Sv(op), "', got ", Describe(Cur())));
    }
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != Tok::kBlockEnd) {
      return SyntaxError(Cur().line,
                         absl::StrCat("expected end of statement block, got ", Describe(Cur())));
    }
    Advance();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != Tok::kName) {
      return SyntaxError(Cur().line, absl::StrCat("expected name, got ", Describe(Cur())));
    }
    std::string n = Cur().text;
    Advance();
    return n;
  }

  struct Depth {
    explicit Depth(int* d) : d_(d) { ++*d_; }
    ~Depth() { --*d_; }
    int* d_;
  };
  absl::Status CheckDepth() const {
    if (depth_ > kMaxNesting) return SyntaxError(Cur().line, "template nested too deeply");
    return absl::OkStatus();
  }

  // Parses until {% name %} with name in `ends` (left at the name), or the end of input when
  // `ends` is empty.
  absl::StatusOr<Body> Subparse(const std::vector<std::string_view>& ends, std::string* end) {
    Depth guard(&depth_);
    RETURN_IF_ERR(CheckDepth());
    Body body;
    for (;;) {
      const Token& t = Cur();
      if (t.type == Tok::kEof) {
        if (!ends.empty()) {
          return SyntaxError(
              t.line, absl::StrCat("unexpected end of template, expected '", Sv(ends.back()), "'"));
        }
        return body;
      }
      if (t.type == Tok::kData) {
        auto s = std::make_unique<Stmt>();
        s->type = StmtType::kData;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        Advance();
      } else if (t.type == Tok::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->type = StmtType::kPrint;
        s->line = t.line;
        Advance();
        ASSIGN_OR_RET(e, ParseTuple(true, {}, false));
        s->exprs.push_back(std::move(e));
        if (Cur().type != Tok::kVarEnd) return Unexpected();
        Advance();
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        Advance();
        if (Cur().type == Tok::kName) {
          for (std::string_view e : ends) {
            if (Cur().text == e) {
              *end = Cur().text;
              return body;
            }
          }
        }
        ASSIGN_OR_RET(s, ParseStatement());
        body.push_back(std::move(s));
      } else {
        return Unexpected();
      }
    }
  }

  // After {% name ... %} bodies: consumes `end_name` %}.
  absl::Status EndTag() {
    Advance();  // the end name
    return ExpectBlockEnd();
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseStatement() {
    if (Cur().type != Tok::kName) return Unexpected();
    const std::string tag = Cur().text;
    const int line = Cur().line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    Advance();
    std::string end;
    if (tag == "if") {
      s->type = StmtType::kIf;
      ++soft_;
      for (;;) {
        ASSIGN_OR_RET(cond, ParseTuple(false, {}, false));
        s->exprs.push_back(std::move(cond));
        RETURN_IF_ERR(ExpectBlockEnd());
        ASSIGN_OR_RET(body, Subparse({"elif", "else", "endif"}, &end));
        s->bodies.push_back(std::move(body));
        if (end == "elif") {
          Advance();
          continue;
        }
        if (end == "else") {
          Advance();
          RETURN_IF_ERR(ExpectBlockEnd());
          ASSIGN_OR_RET(else_body, Subparse({"endif"}, &end));
          s->bodies.push_back(std::move(else_body));
          s->has_else = true;
        }
        break;
      }
      --soft_;
      RETURN_IF_ERR(EndTag());
      return s;
    }
    if (tag == "for") {
      s->type = StmtType::kFor;
      ASSIGN_OR_RET(target, ParseAssignTarget(false));
      s->targets.push_back(std::move(target));
      if (!SkipName("in")) return SyntaxError(Cur().line, "expected 'in' in for loop");
      ASSIGN_OR_RET(iter, ParseTuple(false, {"recursive"}, false));
      s->exprs.push_back(std::move(iter));
      if (SkipName("if")) {
        ASSIGN_OR_RET(filter, ParseExpression(true));
        s->exprs.push_back(std::move(filter));
      } else {
        s->exprs.push_back(nullptr);
      }
      if (IsName("recursive")) return SyntaxError(Cur().line, "recursive loops are not supported");
      RETURN_IF_ERR(ExpectBlockEnd());
      ++loop_depth_;
      ASSIGN_OR_RET(body, Subparse({"endfor", "else"}, &end));
      --loop_depth_;
      s->bodies.push_back(std::move(body));
      if (end == "else") {
        Advance();
        RETURN_IF_ERR(ExpectBlockEnd());
        ASSIGN_OR_RET(else_body, Subparse({"endfor"}, &end));
        s->bodies.push_back(std::move(else_body));
        s->has_else = true;
      }
      RETURN_IF_ERR(EndTag());
      return s;
    }
    if (tag == "set") {
      ASSIGN_OR_RET(target, ParseAssignTarget(true));
      s->targets.push_back(std::move(target));
      if (SkipOp("=")) {
        s->type = StmtType::kSet;
        ASSIGN_OR_RET(value, ParseTuple(true, {}, false));
        s->exprs.push_back(std::move(value));
        RETURN_IF_ERR(ExpectBlockEnd());
        return s;
      }
      if (s->targets[0].tuple || !s->targets[0].ns_attr.empty()) return Unexpected();
      s->type = StmtType::kSetBlock;
      RETURN_IF_ERR(ParseFilterChain(&s->filters));
      RETURN_IF_ERR(ExpectBlockEnd());
      ASSIGN_OR_RET(body, Subparse({"endset"}, &end));
      s->bodies.push_back(std::move(body));
      RETURN_IF_ERR(EndTag());
      return s;
    }
    if (tag == "macro") {
      s->type = StmtType::kMacro;
      ASSIGN_OR_RET(name, ExpectName());
      s->text = name;
      RETURN_IF_ERR(ParseSignature(s.get()));
      RETURN_IF_ERR(ExpectBlockEnd());
      const int saved_loop = loop_depth_;
      loop_depth_ = 0;
      ASSIGN_OR_RET(body, Subparse({"endmacro"}, &end));
      loop_depth_ = saved_loop;
      s->bodies.push_back(std::move(body));
      MarkSpecialNames(s.get());
      RETURN_IF_ERR(EndTag());
      return s;
    }
    if (tag == "call") {
      s->type = StmtType::kCallBlock;
      if (IsOp("(")) RETURN_IF_ERR(ParseSignature(s.get()));
      ASSIGN_OR_RET(call, ParseExpression(true));
      if (call->type != ExprType::kCall) return SyntaxError(line, "expected call");
      s->exprs.insert(s->exprs.begin(), std::move(call));
      RETURN_IF_ERR(ExpectBlockEnd());
      const int saved_loop = loop_depth_;
      loop_depth_ = 0;
      ASSIGN_OR_RET(body, Subparse({"endcall"}, &end));
      loop_depth_ = saved_loop;
      s->bodies.push_back(std::move(body));
      MarkSpecialNames(s.get());
      RETURN_IF_ERR(EndTag());
      return s;
    }
    if (tag == "filter") {
      s->type = StmtType::kFilterBlock;
      if (!IsOp("|")) {
        // The first filter has no leading '|'.
        ASSIGN_OR_RET(f, ParseFilter(nullptr, false));
        s->filters.push_back(std::move(f));
      }
      RETURN_IF_ERR(ParseFilterChain(&s->filters));
      RETURN_IF_ERR(ExpectBlockEnd());
      ASSIGN_OR_RET(body, Subparse({"endfilter"}, &end));
      s->bodies.push_back(std::move(body));
      RETURN_IF_ERR(EndTag());
      return s;
    }
    if (tag == "with") {
      s->type = StmtType::kWith;
      while (Cur().type != Tok::kBlockEnd) {
        if (!s->targets.empty()) RETURN_IF_ERR(ExpectOp(","));
        ASSIGN_OR_RET(target, ParseAssignTarget(false));
        RETURN_IF_ERR(ExpectOp("="));
        ASSIGN_OR_RET(value, ParseExpression(true));
        s->targets.push_back(std::move(target));
        s->exprs.push_back(std::move(value));
      }
      Advance();
      ASSIGN_OR_RET(body, Subparse({"endwith"}, &end));
      s->bodies.push_back(std::move(body));
      RETURN_IF_ERR(EndTag());
      return s;
    }
    if (tag == "generation") {
      s->type = StmtType::kScope;
      RETURN_IF_ERR(ExpectBlockEnd());
      ASSIGN_OR_RET(body, Subparse({"endgeneration"}, &end));
      s->bodies.push_back(std::move(body));
      RETURN_IF_ERR(EndTag());
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return SyntaxError(line, absl::StrCat("'", tag, "' outside of a loop"));
      s->type = tag == "break" ? StmtType::kBreak : StmtType::kContinue;
      RETURN_IF_ERR(ExpectBlockEnd());
      return s;
    }
    static constexpr std::string_view kEnds[] = {"endif",   "endfor",    "endset",  "endmacro",
                                                 "endcall", "endfilter", "endwith", "endgeneration",
                                                 "elif",    "else",      "endraw"};
    for (std::string_view e : kEnds) {
      if (tag == e) return SyntaxError(line, absl::StrCat("unexpected '", tag, "'"));
    }
    return SyntaxError(line, absl::StrCat("unknown tag '", tag, "'"));
  }

  // (name [= default], ...)
  absl::Status ParseSignature(Stmt* s) {
    RETURN_IF_ERR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!s->params.empty()) RETURN_IF_ERR(ExpectOp(","));
      if (IsOp(")")) break;
      ASSIGN_OR_RET(name, ExpectName());
      s->params.push_back(name);
      if (SkipOp("=")) {
        ASSIGN_OR_RET(def, ParseExpression(true));
        s->exprs.push_back(std::move(def));
      } else {
        s->exprs.push_back(nullptr);
      }
    }
    Advance();
    return absl::OkStatus();
  }

  absl::Status ParseFilterChain(std::vector<ExprPtr>* filters) {
    while (SkipOp("|")) {
      ASSIGN_OR_RET(f, ParseFilter(nullptr, false));
      filters->push_back(std::move(f));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Target> ParseAssignTarget(bool allow_ns) {
    Target target;
    const bool paren = SkipOp("(");
    for (;;) {
      if (Cur().type != Tok::kName) return SyntaxError(Cur().line, "expected a name to assign to");
      const std::string name = Cur().text;
      if (name == "true" || name == "false" || name == "none" || name == "True" ||
          name == "False" || name == "None") {
        return SyntaxError(Cur().line, absl::StrCat("cannot assign to '", name, "'"));
      }
      Advance();
      if (allow_ns && !paren && target.names.empty() && IsOp(".")) {
        Advance();
        ASSIGN_OR_RET(attr, ExpectName());
        target.names.push_back(name);
        target.ns_attr = attr;
        return target;
      }
      target.names.push_back(name);
      if (!SkipOp(",")) break;
      target.tuple = true;
      if (paren && IsOp(")")) break;
      if (!paren && Cur().type != Tok::kName) break;
    }
    if (paren) {
      RETURN_IF_ERR(ExpectOp(")"));
      target.tuple = true;
    }
    return target;
  }

  ExprPtr Make(ExprType type, int line) {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->line = line;
    return e;
  }

  // jinja2's parse_tuple: expressions separated by commas; a tuple if there is a comma.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, std::vector<std::string_view> extra_end,
                                     bool explicit_parens) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    for (;;) {
      if (!items.empty()) {
        if (!SkipOp(",")) break;
        is_tuple = true;
      }
      // End of the tuple?
      if (Cur().type == Tok::kVarEnd || Cur().type == Tok::kBlockEnd || IsOp(")") ||
          Cur().type == Tok::kEof) {
        break;
      }
      bool stop = false;
      for (std::string_view e : extra_end) stop |= IsName(e);
      if (stop) break;
      ExprPtr e;
      if (with_condexpr) {
        ASSIGN_OR_RET(x, ParseExpression(true));
        e = std::move(x);
      } else {
        ASSIGN_OR_RET(x, ParseOr());
        e = std::move(x);
      }
      items.push_back(std::move(e));
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) {
        return SyntaxError(line, absl::StrCat("expected an expression, got ", Describe(Cur())));
      }
    }
    auto t = Make(ExprType::kTuple, line);
    t->children = std::move(items);
    RETURN_IF_ERR(Seal(*t));
    return t;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    Depth guard(&depth_);
    RETURN_IF_ERR(CheckDepth());
    if (!with_condexpr) return ParseOr();
    ASSIGN_OR_RET(expr, ParseOr());
    while (IsName("if")) {
      const int line = Cur().line;
      Advance();
      ++soft_;
      ASSIGN_OR_RET(cond, ParseOr());
      ExprPtr other;
      if (SkipName("else")) {
        ASSIGN_OR_RET(x, ParseExpression(true));
        other = std::move(x);
      }
      --soft_;
      auto c = Make(ExprType::kCondExpr, line);
      c->children.push_back(std::move(cond));
      c->children.push_back(std::move(expr));
      c->children.push_back(std::move(other));
      RETURN_IF_ERR(Seal(*c));
      expr = std::move(c);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    ASSIGN_OR_RET(left, ParseAnd());
    while (IsName("or")) {
      const int line = Cur().line;
      Advance();
      ASSIGN_OR_RET(right, ParseAnd());
      auto e = Make(ExprType::kOr, line);
      e->children.push_back(std::move(left));
      e->children.push_back(std::move(right));
      RETURN_IF_ERR(Seal(*e));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    ASSIGN_OR_RET(left, ParseNot());
    while (IsName("and")) {
      const int line = Cur().line;
      Advance();
      ASSIGN_OR_RET(right, ParseNot());
      auto e = Make(ExprType::kAnd, line);
      e->children.push_back(std::move(left));
      e->children.push_back(std::move(right));
      RETURN_IF_ERR(Seal(*e));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      Depth guard(&depth_);
      RETURN_IF_ERR(CheckDepth());
      const int line = Cur().line;
      Advance();
      ASSIGN_OR_RET(inner, ParseNot());
      auto e = Make(ExprType::kNot, line);
      e->children.push_back(std::move(inner));
      RETURN_IF_ERR(Seal(*e));
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const int line = Cur().line;
    ASSIGN_OR_RET(left, ParseMath1());
    ExprPtr cmp;
    for (;;) {
      std::string op;
      if (Cur().type == Tok::kOp &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == "<=" ||
           Cur().text == ">" || Cur().text == ">=")) {
        op = Cur().text;
        Advance();
      } else if (IsName("in")) {
        op = "in";
        Advance();
      } else if (IsName("not") && Look().type == Tok::kName && Look().text == "in") {
        op = "notin";
        Advance();
        Advance();
      } else {
        break;
      }
      ASSIGN_OR_RET(right, ParseMath1());
      if (cmp == nullptr) {
        cmp = Make(ExprType::kCompare, line);
        cmp->children.push_back(std::move(left));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(std::move(right));
      RETURN_IF_ERR(Seal(*cmp));
    }
    if (cmp != nullptr) return cmp;
    return left;
  }

  ExprPtr Binary(std::string op, ExprPtr a, ExprPtr b, int line) {
    auto e = Make(ExprType::kBinary, line);
    e->name = std::move(op);
    e->children.push_back(std::move(a));
    e->children.push_back(std::move(b));
    if (!Seal(*e).ok() && deep_line_ == 0) deep_line_ = line;
    return e;
  }

  // Sets e.height; expressions nested deeper than kMaxHeight are refused (evaluating and
  // destroying them recurses).
  absl::Status Seal(Expr& e) {
    int h = 0;
    auto see = [&](const ExprPtr& c) {
      if (c != nullptr) h = std::max(h, c->height);
    };
    for (const ExprPtr& c : e.children) see(c);
    for (const ExprPtr& c : e.slice_parts) see(c);
    for (const ExprPtr& c : e.args.positional) see(c);
    for (const auto& [k, c] : e.args.keyword) see(c);
    see(e.args.star_args);
    see(e.args.star_kwargs);
    e.height = h + 1;
    if (e.height > kMaxHeight) return SyntaxError(e.line, "expression nested too deeply");
    return absl::OkStatus();
  }
  absl::Status CheckDeep() const {
    if (deep_line_ != 0) return SyntaxError(deep_line_, "expression nested too deeply");
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    ASSIGN_OR_RET(left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Cur().text;
      const int line = Cur().line;
      Advance();
      ASSIGN_OR_RET(right, ParseConcat());
      left = Binary(op, std::move(left), std::move(right), line);
      RETURN_IF_ERR(CheckDeep());
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    ASSIGN_OR_RET(left, ParseMath2());
    while (IsOp("~")) {
      const int line = Cur().line;
      Advance();
      ASSIGN_OR_RET(right, ParseMath2());
      left = Binary("~", std::move(left), std::move(right), line);
      RETURN_IF_ERR(CheckDeep());
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    ASSIGN_OR_RET(left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Cur().text;
      const int line = Cur().line;
      Advance();
      ASSIGN_OR_RET(right, ParsePow());
      left = Binary(op, std::move(left), std::move(right), line);
      RETURN_IF_ERR(CheckDeep());
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    ASSIGN_OR_RET(left, ParseUnary(true));
    while (IsOp("**")) {
      const int line = Cur().line;
      Advance();
      ASSIGN_OR_RET(right, ParseUnary(true));
      left = Binary("**", std::move(left), std::move(right), line);
      RETURN_IF_ERR(CheckDeep());
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    Depth guard(&depth_);
    RETURN_IF_ERR(CheckDepth());
    const int line = Cur().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const bool neg = IsOp("-");
      Advance();
      ASSIGN_OR_RET(inner, ParseUnary(false));
      node = Make(neg ? ExprType::kNeg : ExprType::kPos, line);
      node->children.push_back(std::move(inner));
      RETURN_IF_ERR(Seal(*node));
    } else {
      ASSIGN_OR_RET(primary, ParsePrimary());
      node = std::move(primary);
    }
    ASSIGN_OR_RET(post, ParsePostfix(std::move(node)));
    if (!with_filter) return post;
    return ParseFilterExpr(std::move(post));
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    Depth guard(&depth_);
    RETURN_IF_ERR(CheckDepth());
    const Token& t = Cur();
    const int line = t.line;
    if (t.type == Tok::kName) {
      auto e = Make(ExprType::kConst, line);
      if (t.text == "true" || t.text == "True") {
        e->value = Value::Bool(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value::Bool(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::None();
      } else {
        e->type = ExprType::kName;
        e->name = t.text;
      }
      Advance();
      return e;
    }
    if (t.type == Tok::kString) {
      std::string s = t.text;
      Advance();
      while (Cur().type == Tok::kString) {  // adjacent literals concatenate
        s += Cur().text;
        Advance();
      }
      auto e = Make(ExprType::kConst, line);
      e->value = Value::String(std::move(s));
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      auto e = Make(ExprType::kConst, line);
      e->value = t.value;
      Advance();
      return e;
    }
    if (IsOp("(")) {
      Advance();
      ASSIGN_OR_RET(e, ParseTuple(true, {}, true));
      RETURN_IF_ERR(ExpectOp(")"));
      return e;
    }
    if (IsOp("[")) {
      Advance();
      auto e = Make(ExprType::kList, line);
      while (!IsOp("]")) {
        if (!e->children.empty()) RETURN_IF_ERR(ExpectOp(","));
        if (IsOp("]")) break;
        ASSIGN_OR_RET(item, ParseExpression(true));
        e->children.push_back(std::move(item));
      }
      Advance();
      RETURN_IF_ERR(Seal(*e));
      return e;
    }
    if (IsOp("{")) {
      Advance();
      auto e = Make(ExprType::kDict, line);
      while (!IsOp("}")) {
        if (!e->children.empty()) RETURN_IF_ERR(ExpectOp(","));
        if (IsOp("}")) break;
        ASSIGN_OR_RET(key, ParseExpression(true));
        RETURN_IF_ERR(ExpectOp(":"));
        ASSIGN_OR_RET(value, ParseExpression(true));
        e->children.push_back(std::move(key));
        e->children.push_back(std::move(value));
      }
      Advance();
      RETURN_IF_ERR(Seal(*e));
      return e;
    }
    return Unexpected();
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    for (;;) {
      const int line = Cur().line;
      if (IsOp(".")) {
        Advance();
        if (Cur().type == Tok::kName) {
          auto e = Make(ExprType::kGetAttr, line);
          e->name = Cur().text;
          e->children.push_back(std::move(node));
          RETURN_IF_ERR(Seal(*e));
          node = std::move(e);
          Advance();
        } else if (Cur().type == Tok::kInt) {
          auto e = Make(ExprType::kGetItem, line);
          e->children.push_back(std::move(node));
          auto k = Make(ExprType::kConst, line);
          k->value = Cur().value;
          e->children.push_back(std::move(k));
          RETURN_IF_ERR(Seal(*e));
          node = std::move(e);
          Advance();
        } else {
          return SyntaxError(line, "expected name or number after '.'");
        }
      } else if (IsOp("[")) {
        Advance();
        RETURN_IF_ERR(ParseSubscript(&node, line));
      } else if (IsOp("(")) {
        ASSIGN_OR_RET(call, ParseCall(std::move(node)));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  absl::Status ParseSubscript(ExprPtr* node, int line) {
    std::vector<ExprPtr> parts;
    bool is_tuple = false;
    ExprPtr slice;
    for (;;) {
      // One subscript: expression or slice.
      ExprPtr a, b, c;
      bool is_slice = false;
      if (!IsOp(":")) {
        ASSIGN_OR_RET(x, ParseExpression(true));
        a = std::move(x);
      }
      if (SkipOp(":")) {
        is_slice = true;
        if (!IsOp("]") && !IsOp(",") && !IsOp(":")) {
          ASSIGN_OR_RET(x, ParseExpression(true));
          b = std::move(x);
        }
        if (SkipOp(":")) {
          if (!IsOp("]") && !IsOp(",")) {
            ASSIGN_OR_RET(x, ParseExpression(true));
            c = std::move(x);
          }
        }
      }
      if (is_slice) {
        auto s = Make(ExprType::kSlice, line);
        s->slice_parts[0] = std::move(a);
        s->slice_parts[1] = std::move(b);
        s->slice_parts[2] = std::move(c);
        parts.push_back(std::move(s));
      } else {
        parts.push_back(std::move(a));
      }
      if (SkipOp(",")) {
        is_tuple = true;
        if (IsOp("]")) break;
        continue;
      }
      break;
    }
    RETURN_IF_ERR(ExpectOp("]"));
    if (!is_tuple && parts[0]->type == ExprType::kSlice) {
      parts[0]->children.push_back(std::move(*node));
      RETURN_IF_ERR(Seal(*parts[0]));
      *node = std::move(parts[0]);
      return absl::OkStatus();
    }
    for (const ExprPtr& p : parts) {
      if (p->type == ExprType::kSlice)
        return SyntaxError(line, "slices in tuples are not supported");
    }
    auto e = Make(ExprType::kGetItem, line);
    e->children.push_back(std::move(*node));
    if (is_tuple) {
      auto t = Make(ExprType::kTuple, line);
      t->children = std::move(parts);
      e->children.push_back(std::move(t));
    } else {
      e->children.push_back(std::move(parts[0]));
    }
    RETURN_IF_ERR(Seal(*e));
    *node = std::move(e);
    return absl::OkStatus();
  }

  absl::Status ParseCallArgs(CallArgs* args) {
    RETURN_IF_ERR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) {
        RETURN_IF_ERR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      first = false;
      if (IsOp("**")) {
        Advance();
        ASSIGN_OR_RET(x, ParseExpression(true));
        args->star_kwargs = std::move(x);
      } else if (IsOp("*")) {
        Advance();
        ASSIGN_OR_RET(x, ParseExpression(true));
        args->star_args = std::move(x);
      } else if (Cur().type == Tok::kName && Look().type == Tok::kOp && Look().text == "=") {
        std::string key = Cur().text;
        Advance();
        Advance();
        ASSIGN_OR_RET(x, ParseExpression(true));
        args->keyword.emplace_back(std::move(key), std::move(x));
      } else {
        if (!args->keyword.empty() || args->star_args || args->star_kwargs) {
          return SyntaxError(Cur().line, "invalid syntax for function call expression");
        }
        ASSIGN_OR_RET(x, ParseExpression(true));
        args->positional.push_back(std::move(x));
      }
    }
    Advance();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto e = Make(ExprType::kCall, Cur().line);
    RETURN_IF_ERR(ParseCallArgs(&e->args));
    e->children.push_back(std::move(callee));
    RETURN_IF_ERR(Seal(*e));
    return e;
  }

  absl::StatusOr<std::string> DottedName() {
    ASSIGN_OR_RET(name, ExpectName());
    while (IsOp(".")) {
      Advance();
      ASSIGN_OR_RET(part, ExpectName());
      name += "." + part;
    }
    return name;
  }

  // name[(args)], applied to `input` (null for filter blocks).
  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr input, bool) {
    auto e = Make(ExprType::kFilter, Cur().line);
    ASSIGN_OR_RET(name, DottedName());
    e->name = name;
    e->known = IsKnownFilter(name);
    if (!e->known && soft_ == 0) {
      return SyntaxError(e->line, absl::StrCat("no filter named '", name, "'"));
    }
    if (IsOp("(")) RETURN_IF_ERR(ParseCallArgs(&e->args));
    e->children.push_back(std::move(input));
    RETURN_IF_ERR(Seal(*e));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    for (;;) {
      if (IsOp("|")) {
        Advance();
        ASSIGN_OR_RET(f, ParseFilter(std::move(node), true));
        node = std::move(f);
      } else if (IsName("is")) {
        const int line = Cur().line;
        Advance();
        auto e = Make(ExprType::kTest, line);
        e->negated = SkipName("not");
        ASSIGN_OR_RET(name, DottedName());
        e->name = name;
        e->known = IsKnownTest(name);
        if (!e->known && soft_ == 0) {
          return SyntaxError(line, absl::StrCat("no test named '", name, "'"));
        }
        const Token& c = Cur();
        if (IsOp("(")) {
          RETURN_IF_ERR(ParseCallArgs(&e->args));
        } else if ((c.type == Tok::kName || c.type == Tok::kString || c.type == Tok::kInt ||
                    c.type == Tok::kFloat || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          if (IsName("is")) return SyntaxError(line, "you cannot chain multiple tests with is");
          ASSIGN_OR_RET(arg, ParsePrimary());
          ASSIGN_OR_RET(post, ParsePostfix(std::move(arg)));
          e->args.positional.push_back(std::move(post));
        }
        e->children.push_back(std::move(node));
        RETURN_IF_ERR(Seal(*e));
        node = std::move(e);
      } else if (IsOp("(")) {
        ASSIGN_OR_RET(call, ParseCall(std::move(node)));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int soft_ = 0;
  int loop_depth_ = 0;
  int deep_line_ = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Program>> ParseProgram(std::string_view source,
                                                            const JinjaOptions& options) {
  Lexer lexer(source, options);
  absl::StatusOr<std::vector<Token>> tokens = lexer.Run();
  if (!tokens.ok()) return tokens.status();
  Parser parser(*std::move(tokens));
  absl::StatusOr<Body> body = parser.ParseTemplate();
  if (!body.ok()) return body.status();
  auto program = std::make_shared<Program>();
  program->body = *std::move(body);
  return program;
}

}  // namespace tandem::chat::internal
