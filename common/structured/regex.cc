#include "common/structured/regex.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::structured {
namespace {

using Sequence = GrammarBuilder::Sequence;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// A set of code points as sorted, disjoint, non-adjacent closed ranges.
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges Normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

Ranges Complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

Ranges Subtract(const Ranges& a, const Ranges& b) {
  // a \ b = complement(complement(a) | b)
  Ranges both = Complement(a);
  both.insert(both.end(), b.begin(), b.end());
  return Complement(Normalize(std::move(both)));
}

int Utf8Length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

std::string Utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

// Splits [lo, hi] (same UTF-8 length, no surrogates) into ranges whose encodings are
// products of per-byte ranges, each appended to `out` as byte-range sequences.
void AppendUtf8Ranges(uint32_t lo, uint32_t hi,
                      std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  const int n = Utf8Length(lo);
  if (n != Utf8Length(hi)) {
    const uint32_t limit = n == 1 ? 0x7F : n == 2 ? 0x7FF : 0xFFFF;
    AppendUtf8Ranges(lo, limit, out);
    AppendUtf8Ranges(limit + 1, hi, out);
    return;
  }
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        AppendUtf8Ranges(lo, lo | m, out);
        AppendUtf8Ranges((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        AppendUtf8Ranges(lo, (hi & ~m) - 1, out);
        AppendUtf8Ranges(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = Utf8(lo), b = Utf8(hi);
  std::vector<std::pair<uint8_t, uint8_t>> bytes;
  for (int i = 0; i < n; ++i) {
    bytes.emplace_back(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i]));
  }
  out->push_back(std::move(bytes));
}

// Alternatives, one sequence each, that derive the UTF-8 encodings of `ranges`; all one-byte
// code points share a single element.
std::vector<Sequence> Utf8Alternatives(const Ranges& ranges, GrammarBuilder* b) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> parts;
  for (auto [lo, hi] : ranges) {
    // Surrogates are not characters.
    if (lo <= 0xDFFF && hi >= 0xD800) {
      if (lo < 0xD800) AppendUtf8Ranges(lo, 0xD7FF, &parts);
      if (hi > 0xDFFF) AppendUtf8Ranges(0xE000, hi, &parts);
      continue;
    }
    AppendUtf8Ranges(lo, hi, &parts);
  }
  std::vector<Sequence> out;
  ByteSet ascii;
  for (const auto& part : parts) {
    if (part.size() == 1) {
      for (int c = part[0].first; c <= part[0].second; ++c) ascii.set(static_cast<size_t>(c));
      continue;
    }
    Sequence seq;
    for (auto [x, y] : part) {
      ByteSet set;
      for (int c = x; c <= y; ++c) set.set(static_cast<size_t>(c));
      seq.push_back(b->Bytes(set));
    }
    out.push_back(std::move(seq));
  }
  if (ascii.any()) out.insert(out.begin(), Sequence{b->Bytes(ascii)});
  return out;
}

// The JSON escape of a character JSON cannot hold raw.
std::string JsonEscape(uint32_t cp) {
  switch (cp) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\t':
      return "\\t";
    case '\r':
      return "\\r";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default: {
      static constexpr char kHex[] = "0123456789abcdef";
      return absl::StrCat("\\u00", std::string(1, kHex[cp >> 4]), std::string(1, kHex[cp & 15]));
    }
  }
}

// One element deriving a character of `ranges`, in `mode`'s encoding.
Element CharClass(const Ranges& ranges, RegexMode mode, GrammarBuilder* b) {
  Ranges raw = ranges;
  std::vector<Sequence> alternatives;
  if (mode == RegexMode::kJsonStringSearch) {
    const Ranges special = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    for (auto [lo, hi] : special) {
      for (uint32_t cp = lo; cp <= hi; ++cp) {
        const bool in = std::any_of(ranges.begin(), ranges.end(), [cp](const auto& r) {
          return r.first <= cp && cp <= r.second;
        });
        if (in) alternatives.push_back(b->Literal(JsonEscape(cp)));
      }
    }
    raw = Subtract(ranges, special);
  }
  std::vector<Sequence> chars = Utf8Alternatives(raw, b);
  alternatives.insert(alternatives.begin(), chars.begin(), chars.end());
  if (alternatives.size() == 1 && alternatives[0].size() == 1) return alternatives[0][0];
  return GrammarBuilder::Ref(b->Rule(alternatives));
}

Ranges Digits() { return {{'0', '9'}}; }
Ranges Word() { return Normalize({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}); }
Ranges Space() { return Normalize({{' ', ' '}, {'\t', '\r'}}); }  // \t \n \v \f \r

class RegexParser {
 public:
  RegexParser(std::string_view pattern, RegexMode mode, GrammarBuilder* b)
      : p_(pattern), mode_(mode), b_(b) {}

  absl::StatusOr<uint32_t> Parse() {
    bool anchored_start = false, anchored_end = false;
    if (!p_.empty() && p_[0] == '^') {
      anchored_start = true;
      pos_ = 1;
    }
    if (p_.size() > pos_ && p_.back() == '$' && !EscapedAt(p_.size() - 1)) {
      anchored_end = true;
      end_ = p_.size() - 1;
    } else {
      end_ = p_.size();
    }
    absl::StatusOr<Sequence> body = Alternation();
    if (!body.ok()) return body.status();
    if (pos_ != end_) return Error(p_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    if (mode_ == RegexMode::kFullMatch) return b_->Rule({*body});
    // JSON Schema patterns search: any characters may come before and after the match.
    Sequence seq;
    const uint32_t any = JsonStringCharsRule(b_);
    if (!anchored_start) seq.push_back(GrammarBuilder::Ref(any));
    seq.insert(seq.end(), body->begin(), body->end());
    if (!anchored_end) seq.push_back(GrammarBuilder::Ref(any));
    return b_->Rule({seq});
  }

 private:
  // Whether the character at `i` is escaped by an odd run of backslashes before it.
  bool EscapedAt(size_t i) const {
    size_t n = 0;
    while (i > n && p_[i - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }

  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("regular expression: ", what, " at offset ", pos_));
  }

  bool AtEnd() const { return pos_ >= end_; }

  absl::StatusOr<Sequence> Alternation() {
    if (++depth_ > kMaxDepth) return Error("groups nested too deeply");
    std::vector<Sequence> alternatives;
    for (;;) {
      absl::StatusOr<Sequence> seq = Concatenation();
      if (!seq.ok()) return seq.status();
      alternatives.push_back(*std::move(seq));
      if (AtEnd() || p_[pos_] != '|') break;
      ++pos_;
    }
    --depth_;
    if (alternatives.size() == 1) return std::move(alternatives[0]);
    return Sequence{GrammarBuilder::Ref(b_->Rule(alternatives))};
  }

  absl::StatusOr<Sequence> Concatenation() {
    Sequence out;
    while (!AtEnd() && p_[pos_] != '|' && p_[pos_] != ')') {
      if (b_->too_large()) return Error("pattern too large");
      absl::StatusOr<Sequence> atom = Atom();
      if (!atom.ok()) return atom.status();
      absl::StatusOr<Sequence> repeated = Quantified(*std::move(atom));
      if (!repeated.ok()) return repeated.status();
      out.insert(out.end(), repeated->begin(), repeated->end());
    }
    return out;
  }

  absl::StatusOr<Sequence> Quantified(Sequence atom) {
    while (!AtEnd()) {
      int64_t min = 0, max = GrammarBuilder::kUnbounded;
      const char c = p_[pos_];
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        min = 1;
        ++pos_;
      } else if (c == '?') {
        max = 1;
        ++pos_;
      } else if (c == '{' && IsCountedRepeat()) {
        ++pos_;
        absl::StatusOr<int64_t> lo = Number();
        if (!lo.ok()) return lo.status();
        min = *lo;
        max = *lo;
        if (p_[pos_] == ',') {
          ++pos_;
          max = GrammarBuilder::kUnbounded;
          if (p_[pos_] != '}') {
            absl::StatusOr<int64_t> hi = Number();
            if (!hi.ok()) return hi.status();
            max = *hi;
          }
        }
        ++pos_;  // '}'
        if (max != GrammarBuilder::kUnbounded && max < min) {
          return Error("repetition {n,m} with m < n");
        }
      } else {
        break;
      }
      if (!AtEnd() && p_[pos_] == '?') {
        ++pos_;  // lazy: the same language
      } else if (!AtEnd() && p_[pos_] == '+') {
        return Error("possessive quantifiers are not supported");
      }
      if (b_->too_large()) return Error("pattern too large");
      atom = Sequence{GrammarBuilder::Ref(b_->Repeat(atom, min, max))};
    }
    return atom;
  }

  // Whether '{' at pos_ starts {n}, {n,} or {n,m} (otherwise it is a literal, as in Python).
  bool IsCountedRepeat() const {
    size_t i = pos_ + 1;
    const size_t digits = i;
    while (i < end_ && p_[i] >= '0' && p_[i] <= '9') ++i;
    if (i == digits) return false;
    if (i < end_ && p_[i] == ',') {
      ++i;
      while (i < end_ && p_[i] >= '0' && p_[i] <= '9') ++i;
    }
    return i < end_ && p_[i] == '}';
  }

  absl::StatusOr<int64_t> Number() {
    int64_t v = 0;
    while (!AtEnd() && p_[pos_] >= '0' && p_[pos_] <= '9') {
      v = v * 10 + (p_[pos_++] - '0');
      if (v > kMaxRepeat) {
        return Error(absl::StrCat("repetition count above ", kMaxRepeat));
      }
    }
    return v;
  }

  absl::StatusOr<Sequence> Atom() {
    const char c = p_[pos_];
    switch (c) {
      case '(': {
        ++pos_;
        if (!AtEnd() && p_[pos_] == '?') {
          std::string_view rest = p_.substr(pos_);
          if (rest.starts_with("?:")) {
            pos_ += 2;
          } else if (rest.starts_with("?P<") || (rest.starts_with("?<") && rest.size() > 2 &&
                                                 rest[2] != '=' && rest[2] != '!')) {
            const size_t close = p_.find('>', pos_);
            if (close == std::string_view::npos || close >= end_)
              return Error("unclosed group name");
            pos_ = close + 1;
          } else if (rest.starts_with("?=") || rest.starts_with("?!") || rest.starts_with("?<=") ||
                     rest.starts_with("?<!")) {
            return Error("look-around assertions are not supported");
          } else {
            return Error("inline flags and other (?...) groups are not supported");
          }
        }
        absl::StatusOr<Sequence> inner = Alternation();
        if (!inner.ok()) return inner.status();
        if (AtEnd() || p_[pos_] != ')') return Error("missing ')'");
        ++pos_;
        return Sequence{GrammarBuilder::Ref(b_->Rule({*inner}))};
      }
      case '[':
        return Class();
      case '.':
        ++pos_;
        return Sequence{CharClass(Complement({{'\n', '\n'}}), mode_, b_)};
      case '\\':
        return Escape();
      case '*':
      case '+':
      case '?':
        return Error("quantifier with nothing to repeat");
      case '^':
        return Error("'^' is supported only at the start of the pattern");
      case '$':
        return Error("'$' is supported only at the end of the pattern");
      default: {
        absl::StatusOr<uint32_t> cp = CodePoint();
        if (!cp.ok()) return cp.status();
        return Sequence{CharClass({{*cp, *cp}}, mode_, b_)};
      }
    }
  }

  // One UTF-8 character of the pattern at pos_.
  absl::StatusOr<uint32_t> CodePoint() {
    const auto byte = [this](size_t i) { return static_cast<uint8_t>(p_[i]); };
    const uint8_t lead = byte(pos_);
    const int n = lead < 0x80         ? 1
                  : (lead >> 5) == 6  ? 2
                  : (lead >> 4) == 14 ? 3
                  : (lead >> 3) == 30 ? 4
                                      : 0;
    if (n == 0 || pos_ + n > end_) return Error("invalid UTF-8");
    uint32_t cp = n == 1 ? lead : lead & (0x7F >> n);
    for (int i = 1; i < n; ++i) {
      if ((byte(pos_ + i) & 0xC0) != 0x80) return Error("invalid UTF-8");
      cp = (cp << 6) | (byte(pos_ + i) & 0x3F);
    }
    if (cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF) || Utf8Length(cp) != n) {
      return Error("invalid UTF-8");
    }
    pos_ += n;
    return cp;
  }

  // An escape at pos_ ('\'): a class (\d ...) or one code point.
  absl::StatusOr<Ranges> EscapeRanges() {
    ++pos_;
    if (AtEnd()) return Error("trailing backslash");
    const char c = p_[pos_++];
    switch (c) {
      case 'd':
        return Digits();
      case 'D':
        return Complement(Digits());
      case 'w':
        return Word();
      case 'W':
        return Complement(Word());
      case 's':
        return Space();
      case 'S':
        return Complement(Space());
      case 'n':
        return Ranges{{'\n', '\n'}};
      case 't':
        return Ranges{{'\t', '\t'}};
      case 'r':
        return Ranges{{'\r', '\r'}};
      case 'f':
        return Ranges{{'\f', '\f'}};
      case 'v':
        return Ranges{{'\v', '\v'}};
      case '0':
        return Ranges{{0, 0}};
      case 'x':
      case 'u': {
        const int n = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 0; i < n; ++i, ++pos_) {
          if (AtEnd()) return Error("truncated hexadecimal escape");
          const char h = p_[pos_];
          const int d = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
          if (d < 0) return Error("bad hexadecimal escape");
          v = v * 16 + static_cast<uint32_t>(d);
        }
        if (v >= 0xD800 && v <= 0xDFFF) return Error("surrogate code point");
        return Ranges{{v, v}};
      }
      case 'b':
      case 'B':
      case 'A':
      case 'Z':
      case 'z':
        return Error("anchors and word boundaries (\\b \\B \\A \\Z) are not supported");
      default:
        if (c >= '1' && c <= '9') return Error("back-references are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          return Error(absl::StrCat("unknown escape \\", std::string(1, c)));
        }
        --pos_;
        absl::StatusOr<uint32_t> cp = CodePoint();  // escaped punctuation or any other character
        if (!cp.ok()) return cp.status();
        return Ranges{{*cp, *cp}};
    }
  }

  absl::StatusOr<Sequence> Escape() {
    absl::StatusOr<Ranges> r = EscapeRanges();
    if (!r.ok()) return r.status();
    return Sequence{CharClass(Normalize(*r), mode_, b_)};
  }

  absl::StatusOr<Sequence> Class() {
    ++pos_;  // '['
    bool negated = false;
    if (!AtEnd() && p_[pos_] == '^') {
      negated = true;
      ++pos_;
    }
    Ranges ranges;
    bool first = true;
    for (;;) {
      if (AtEnd()) return Error("missing ']'");
      if (p_[pos_] == ']' && !first) break;
      first = false;
      if (p_.substr(pos_).starts_with("[:")) return Error("POSIX classes are not supported");
      absl::StatusOr<Ranges> lo = ClassAtom();
      if (!lo.ok()) return lo.status();
      if (pos_ + 1 < end_ && p_[pos_] == '-' && p_[pos_ + 1] != ']' && lo->size() == 1 &&
          lo->front().first == lo->front().second) {
        ++pos_;
        absl::StatusOr<Ranges> hi = ClassAtom();
        if (!hi.ok()) return hi.status();
        if (hi->size() != 1 || hi->front().first != hi->front().second) {
          return Error("a class range must end in a single character");
        }
        if (hi->front().first < lo->front().first) return Error("class range out of order");
        ranges.emplace_back(lo->front().first, hi->front().first);
        continue;
      }
      ranges.insert(ranges.end(), lo->begin(), lo->end());
    }
    ++pos_;  // ']'
    ranges = Normalize(std::move(ranges));
    if (negated) ranges = Complement(ranges);
    if (ranges.empty()) return Error("empty character class");
    return Sequence{CharClass(ranges, mode_, b_)};
  }

  absl::StatusOr<Ranges> ClassAtom() {
    if (p_[pos_] == '\\') {
      if (pos_ + 1 < end_ && p_[pos_ + 1] == 'b') {  // backspace inside a class
        pos_ += 2;
        return Ranges{{'\b', '\b'}};
      }
      return EscapeRanges();
    }
    absl::StatusOr<uint32_t> cp = CodePoint();
    if (!cp.ok()) return cp.status();
    return Ranges{{*cp, *cp}};
  }

  static constexpr int kMaxDepth = 64;
  std::string_view p_;
  const RegexMode mode_;
  GrammarBuilder* const b_;
  size_t pos_ = 0;
  size_t end_ = 0;
  int depth_ = 0;
};

}  // namespace

namespace {

// A JSON string's characters other than '"', '\\' and controls, raw, and its escapes.
uint32_t JsonCharacters(GrammarBuilder* b, bool ascii) {
  std::vector<Sequence> alternatives =
      Utf8Alternatives(ascii ? Subtract({{0, kMaxCodePoint}}, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}})
                             : Ranges{{0x80, kMaxCodePoint}},
                       b);
  ByteSet simple;
  for (char c : std::string_view("\"\\/bfnrt")) simple.set(static_cast<uint8_t>(c));
  alternatives.push_back({b->Byte('\\'), b->Bytes(simple)});
  // \uXXXX other than a surrogate, so that every escape is one character, as a validator
  // counts them.
  const auto set_of = [b](std::string_view chars) {
    ByteSet set;
    for (char c : chars) set.set(static_cast<uint8_t>(c));
    return b->Bytes(set);
  };
  const Element h = set_of("0123456789abcdefABCDEF");
  alternatives.push_back({b->Byte('\\'), b->Byte('u'), set_of("0123456789abcefABCEF"), h, h, h});
  alternatives.push_back({b->Byte('\\'), b->Byte('u'), set_of("dD"), set_of("01234567"), h, h});
  return b->Rule(alternatives);
}

}  // namespace

uint32_t JsonStringCharRule(GrammarBuilder* b) {
  uint32_t& rule = b->Shared("json string character");
  if (rule == GrammarBuilder::kNoRule) rule = JsonCharacters(b, /*ascii=*/true);
  return rule;
}

uint32_t JsonStringCharsRule(GrammarBuilder* b) {
  uint32_t& rule = b->Shared("json string characters");
  if (rule == GrammarBuilder::kNoRule) {
    rule = b->Repeat({GrammarBuilder::Ref(JsonStringCharRule(b))}, 0, GrammarBuilder::kUnbounded);
  }
  return rule;
}

uint32_t JsonStringEscapeOrNonAsciiRule(GrammarBuilder* b) {
  uint32_t& rule = b->Shared("json string escape or non-ASCII character");
  if (rule == GrammarBuilder::kNoRule) rule = JsonCharacters(b, /*ascii=*/false);
  return rule;
}

absl::StatusOr<uint32_t> CompileRegex(std::string_view pattern, RegexMode mode,
                                      GrammarBuilder* builder) {
  return RegexParser(pattern, mode, builder).Parse();
}

}  // namespace tandem::structured
