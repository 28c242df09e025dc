#include "common/model/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utypes.h>

#include <algorithm>
#include <array>
#include <exception>
#include <functional>
#include <mutex>
#include <queue>
#include <shared_mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace tandem::model {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// ---------------------------------------------------------------------------------------------
// UTF-8

// The length of the well-formed UTF-8 sequence at s[i], or 0 when it is ill-formed (then the
// maximal ill-formed subpart has length *bad, at least 1), following Unicode's recommendation
// for U+FFFD substitution (as Rust's String::from_utf8_lossy does).
size_t Utf8SequenceLength(std::string_view s, size_t i, size_t* bad) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(i);
  *bad = 1;
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) {
      *bad = k;
      return 0;
    }
    const unsigned char b = at(i + k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) {
      *bad = k;
      return 0;
    }
  }
  return len;
}

bool IsValidUtf8(std::string_view s) {
  size_t bad;
  for (size_t i = 0; i < s.size();) {
    const size_t len = Utf8SequenceLength(s, i, &bad);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

// `bytes` with each ill-formed subpart replaced by U+FFFD.
std::string LossyUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t bad;
  for (size_t i = 0; i < bytes.size();) {
    const size_t len = Utf8SequenceLength(bytes, i, &bad);
    if (len == 0) {
      out += kReplacementChar;
      i += bad;
    } else {
      out.append(bytes.substr(i, len));
      i += len;
    }
  }
  return out;
}

// The code point at s[*i] of valid UTF-8; advances *i past it.
UChar32 NextChar(std::string_view s, size_t* i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(*i);
  if (c < 0x80) {
    ++*i;
    return c;
  }
  if (c < 0xE0) {
    const UChar32 cp = (c & 0x1F) << 6 | (at(*i + 1) & 0x3F);
    *i += 2;
    return cp;
  }
  if (c < 0xF0) {
    const UChar32 cp = (c & 0x0F) << 12 | (at(*i + 1) & 0x3F) << 6 | (at(*i + 2) & 0x3F);
    *i += 3;
    return cp;
  }
  const UChar32 cp =
      (c & 0x07) << 18 | (at(*i + 1) & 0x3F) << 12 | (at(*i + 2) & 0x3F) << 6 | (at(*i + 3) & 0x3F);
  *i += 4;
  return cp;
}

// The code point before s[*i]; moves *i back to its start.
UChar32 PrevChar(std::string_view s, size_t* i) {
  size_t start = *i - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t k = start;
  *i = start;
  return NextChar(s, &k);
}

void AppendChar(UChar32 cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | cp >> 6));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | cp >> 12));
    out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | cp >> 18));
    out->push_back(static_cast<char>(0x80 | (cp >> 12 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Rust's char::is_whitespace (the White_Space property).
bool IsWhitespace(UChar32 c) { return u_isUWhiteSpace(c); }

// Rust's char::is_alphanumeric (Alphabetic, or a numeric general category).
bool IsAlphanumeric(UChar32 c) {
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC)) return true;
  const int8_t type = u_charType(c);
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

bool IsNumeric(UChar32 c) {
  const int8_t type = u_charType(c);
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

// The tokenizers library's punctuation: ASCII punctuation or a Unicode P* category.
bool IsPunctuation(UChar32 c) {
  if (c < 0x80) return std::ispunct(static_cast<int>(c)) != 0;
  return (U_GET_GC_MASK(c) & U_GC_P_MASK) != 0;
}

// ---------------------------------------------------------------------------------------------
// JSON access with the key path in every error.

absl::Status Invalid(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", key, " ", what));
}

absl::StatusOr<std::string> GetString(const Json& obj, const std::string& name,
                                      const std::string& key) {
  auto it = obj.find(name);
  if (it == obj.end() || !it->is_string()) {
    return Invalid(absl::StrCat(key, ".", name), "must be a string");
  }
  return it->get<std::string>();
}

// The string at `name`, or `fallback` when the key is absent or null.
absl::StatusOr<std::string> GetOptionalString(const Json& obj, const std::string& name,
                                              const std::string& key, std::string fallback) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) return Invalid(absl::StrCat(key, ".", name), "must be a string");
  return it->get<std::string>();
}

absl::StatusOr<bool> GetBool(const Json& obj, const std::string& name, const std::string& key,
                             bool fallback) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Invalid(absl::StrCat(key, ".", name), "must be a boolean");
  return it->get<bool>();
}

absl::StatusOr<int64_t> GetInt(const Json& obj, const std::string& name, const std::string& key,
                               int64_t fallback) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) {
    return Invalid(absl::StrCat(key, ".", name), "must be an integer");
  }
  return it->get<int64_t>();
}

// A component's type. Sequences nest components; deeper than any real file is refused (the
// parsers recurse).
absl::StatusOr<std::string> GetType(const Json& obj, const std::string& key) {
  if (std::count(key.begin(), key.end(), '.') > 16) return Invalid(key, "nests too deeply");
  if (!obj.is_object()) return Invalid(key, "must be an object");
  return GetString(obj, "type", key);
}

// The steps of a Sequence component (its list `field`), each read by `parse`.
template <typename T>
absl::StatusOr<std::vector<std::unique_ptr<T>>> ParseSteps(
    const Json& obj, const std::string& key, const char* field,
    absl::StatusOr<std::unique_ptr<T>> (*parse)(const Json&, const std::string&)) {
  auto it = obj.find(field);
  if (it == obj.end() || !it->is_array()) {
    return Invalid(absl::StrCat(key, ".", field), "must be a list");
  }
  std::vector<std::unique_ptr<T>> steps;
  for (size_t i = 0; i < it->size(); ++i) {
    absl::StatusOr<std::unique_ptr<T>> step =
        parse((*it)[i], absl::StrCat(key, ".", field, "[", i, "]"));
    if (!step.ok()) return step.status();
    steps.push_back(std::move(*step));
  }
  return steps;
}

// ---------------------------------------------------------------------------------------------
// PCRE2 regular expressions (the tokenizers library uses Oniguruma; PCRE2 with UTF and UCP
// gives the same classes for the patterns published tokenizers use).

// Oniguruma's Unicode \s is the White_Space property and its \w the Word property; PCRE2's
// (with UCP) differ at the edges (PCRE2's \s takes U+180E, its \w no marks). So those
// escapes become explicit classes before compiling. (\S and \W inside a class are left as
// they are: no published pattern has them.)
constexpr char kSpaceClass[] =
    R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr char kWordClass[] = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D})";

std::string OnigurumaClasses(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      const bool space = e == 's' || e == 'S', word = e == 'w' || e == 'W';
      const char* set = space ? kSpaceClass : word ? kWordClass : nullptr;
      const bool negated = e == 'S' || e == 'W';
      if (set != nullptr && !in_class) {
        absl::StrAppend(&out, negated ? "[^" : "[", set, "]");
      } else if (set != nullptr && !negated) {
        out += set;
      } else {
        out.append(pattern, i, 2);
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A leading "^" and then a leading "]" belong to the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // a POSIX class such as [:alpha:]
      if (end != std::string::npos) {
        out.append(pattern, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(const std::string& written,
                                                        const std::string& key) {
    const std::string pattern = OnigurumaClasses(written);
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      return Invalid(key, absl::StrCat("does not compile",
                                       pattern == written ? absl::StrCat(" at offset ", offset)
                                                          : std::string(),
                                       ": ", reinterpret_cast<const char*>(message.data())));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
    return std::unique_ptr<Regex>(new Regex(code));
  }

  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The non-overlapping matches in `s` (valid UTF-8), left to right, as Oniguruma's find_iter
  // reports them: after an empty match the search moves on one character, and an empty match
  // right where the previous match ended is skipped.
  absl::Status FindAll(std::string_view s, std::vector<std::pair<size_t, size_t>>* out) const {
    out->clear();
    pcre2_match_data* data = MatchData();
    size_t pos = 0;
    size_t last_end = std::string_view::npos;
    while (pos <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                                 PCRE2_NO_UTF_CHECK, data, MatchContext());
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        std::array<PCRE2_UCHAR, 256> message{};
        pcre2_get_error_message(rc, message.data(), message.size());
        return absl::ResourceExhaustedError(absl::StrCat(
            "regular expression match failed: ", reinterpret_cast<const char*>(message.data())));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
      const size_t start = ovector[0], end = ovector[1];
      if (start == end) {
        if (start != last_end) out->emplace_back(start, end);
        if (start >= s.size()) break;
        size_t next = start;
        NextChar(s, &next);
        pos = next;
      } else {
        out->emplace_back(start, end);
        pos = end;
      }
      last_end = end;
    }
    return absl::OkStatus();
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}

  // One match-data block per thread, shared by all patterns (only the whole match is read).
  static pcre2_match_data* MatchData() {
    thread_local std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
        pcre2_match_data_create(1, nullptr), pcre2_match_data_free);
    return data.get();
  }

  // Bounds backtracking so that a pathological pattern fails instead of hanging.
  static pcre2_match_context* MatchContext() {
    static pcre2_match_context* context = [] {
      pcre2_match_context* c = pcre2_match_context_create(nullptr);
      pcre2_set_match_limit(c, 1000000);
      pcre2_set_depth_limit(c, 10000);
      return c;
    }();
    return context;
  }

  pcre2_code* code_;
};

// A Split / Replace "pattern": {"String": s} (literal) or {"Regex": r}.
class Pattern {
 public:
  static absl::StatusOr<Pattern> Parse(const Json& obj, const std::string& key) {
    if (!obj.is_object() || obj.size() != 1) {
      return Invalid(key, "must be {\"String\": ...} or {\"Regex\": ...}");
    }
    Pattern pattern;
    if (auto it = obj.find("String"); it != obj.end() && it->is_string()) {
      pattern.literal_ = it->get<std::string>();
      return pattern;
    }
    if (auto it = obj.find("Regex"); it != obj.end() && it->is_string()) {
      absl::StatusOr<std::unique_ptr<Regex>> regex =
          Regex::Compile(it->get<std::string>(), absl::StrCat(key, ".Regex"));
      if (!regex.ok()) return regex.status();
      pattern.regex_ = std::shared_ptr<const Regex>(std::move(*regex));
      return pattern;
    }
    return Invalid(key, "must be {\"String\": ...} or {\"Regex\": ...}");
  }

  absl::Status FindAll(std::string_view s, std::vector<std::pair<size_t, size_t>>* out) const {
    if (regex_ != nullptr) return regex_->FindAll(s, out);
    out->clear();
    if (literal_.empty()) return absl::OkStatus();
    for (size_t pos = s.find(literal_); pos != std::string_view::npos;
         pos = s.find(literal_, pos + literal_.size())) {
      out->emplace_back(pos, pos + literal_.size());
    }
    return absl::OkStatus();
  }

  // `s` with every match replaced by `content`.
  absl::Status ReplaceAll(std::string_view content, std::string* s) const {
    std::vector<std::pair<size_t, size_t>> matches;
    if (absl::Status status = FindAll(*s, &matches); !status.ok()) return status;
    if (matches.empty()) return absl::OkStatus();
    std::string out;
    size_t prev = 0;
    for (const auto& [start, end] : matches) {
      out.append(*s, prev, start - prev);
      out.append(content);
      prev = end;
    }
    out.append(*s, prev, std::string::npos);
    *s = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
};

// ---------------------------------------------------------------------------------------------
// Normalizers

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual absl::Status Normalize(std::string* s) const = 0;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(const icu::Normalizer2* normalizer) : normalizer_(normalizer) {}
  absl::Status Normalize(std::string* s) const override {
    if (std::all_of(s->begin(), s->end(),
                    [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
      return absl::OkStatus();  // ASCII is invariant under every normalization form
    }
    std::string out;
    icu::StringByteSink<std::string> sink(&out);
    UErrorCode error = U_ZERO_ERROR;
    normalizer_->normalizeUTF8(0, icu::StringPiece(s->data(), static_cast<int32_t>(s->size())),
                               sink, nullptr, error);
    if (U_FAILURE(error)) {
      return absl::InternalError(absl::StrCat("Unicode normalization: ", u_errorName(error)));
    }
    *s = std::move(out);
    return absl::OkStatus();
  }

 private:
  const icu::Normalizer2* normalizer_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  absl::Status Normalize(std::string* s) const override {
    for (const auto& step : steps_) {
      if (absl::Status status = step->Normalize(s); !status.ok()) return status;
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status Normalize(std::string* s) const override { return pattern_.ReplaceAll(content_, s); }

 private:
  Pattern pattern_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  absl::Status Normalize(std::string* s) const override {
    if (!s->empty()) *s = absl::StrCat(prepend_, *s);
    return absl::OkStatus();
  }

 private:
  std::string prepend_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Normalize(std::string* s) const override {
    size_t start = 0, end = s->size();
    if (left_) {
      while (start < end) {
        size_t next = start;
        if (!IsWhitespace(NextChar(*s, &next))) break;
        start = next;
      }
    }
    if (right_) {
      while (end > start) {
        size_t prev = end;
        if (!IsWhitespace(PrevChar(*s, &prev))) break;
        end = prev;
      }
    }
    *s = s->substr(start, end - start);
    return absl::OkStatus();
  }

 private:
  bool left_, right_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  absl::Status Normalize(std::string* s) const override {
    icu::UnicodeString text =
        icu::UnicodeString::fromUTF8(icu::StringPiece(s->data(), static_cast<int32_t>(s->size())));
    text.toLower(icu::Locale::getRoot());
    s->clear();
    text.toUTF8String(*s);
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& obj,
                                                            const std::string& key) {
  absl::StatusOr<std::string> type = GetType(obj, key);
  if (!type.ok()) return type.status();
  UErrorCode error = U_ZERO_ERROR;
  const icu::Normalizer2* unicode = nullptr;
  if (*type == "NFC") unicode = icu::Normalizer2::getNFCInstance(error);
  if (*type == "NFD") unicode = icu::Normalizer2::getNFDInstance(error);
  if (*type == "NFKC") unicode = icu::Normalizer2::getNFKCInstance(error);
  if (*type == "NFKD") unicode = icu::Normalizer2::getNFKDInstance(error);
  if (U_FAILURE(error)) {
    return absl::InternalError(absl::StrCat("ICU normalizer: ", u_errorName(error)));
  }
  if (unicode != nullptr) return std::make_unique<UnicodeNormalizer>(unicode);
  if (*type == "Sequence") {
    absl::StatusOr<std::vector<std::unique_ptr<Normalizer>>> steps =
        ParseSteps<Normalizer>(obj, key, "normalizers", ParseNormalizer);
    if (!steps.ok()) return steps.status();
    return std::make_unique<SequenceNormalizer>(std::move(*steps));
  }
  if (*type == "Replace") {
    auto it = obj.find("pattern");
    if (it == obj.end()) return Invalid(key + ".pattern", "is missing");
    absl::StatusOr<Pattern> pattern = Pattern::Parse(*it, key + ".pattern");
    if (!pattern.ok()) return pattern.status();
    absl::StatusOr<std::string> content = GetString(obj, "content", key);
    if (!content.ok()) return content.status();
    return std::make_unique<ReplaceNormalizer>(std::move(*pattern), std::move(*content));
  }
  if (*type == "Prepend") {
    absl::StatusOr<std::string> prepend = GetString(obj, "prepend", key);
    if (!prepend.ok()) return prepend.status();
    return std::make_unique<PrependNormalizer>(std::move(*prepend));
  }
  if (*type == "Strip") {
    absl::StatusOr<bool> left = GetBool(obj, "strip_left", key, true);
    if (!left.ok()) return left.status();
    absl::StatusOr<bool> right = GetBool(obj, "strip_right", key, true);
    if (!right.ok()) return right.status();
    return std::make_unique<StripNormalizer>(*left, *right);
  }
  if (*type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  return Invalid(key, absl::StrCat("type ", *type, " is not supported"));
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

// A part of the text on its way to the model; `at_start` when it begins at offset 0 of the
// original text (Metaspace's prepend_scheme "first").
struct Piece {
  std::string text;
  bool at_start = false;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

absl::StatusOr<SplitBehavior> ParseBehavior(const Json& obj, const std::string& key,
                                            SplitBehavior fallback) {
  auto it = obj.find("behavior");
  if (it == obj.end() || it->is_null()) return fallback;
  const std::string name = it->is_string() ? it->get<std::string>() : "";
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return Invalid(absl::StrCat(key, ".behavior"),
                 "must be one of Removed, Isolated, "
                 "MergedWithPrevious, MergedWithNext, Contiguous");
}

// Splits `piece` at `matches` (sorted, non-overlapping) the way the tokenizers library's
// NormalizedString::split does, appending the non-empty parts to `out`.
void SplitPiece(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                SplitBehavior behavior, bool invert, std::vector<Piece>* out) {
  const std::string& s = piece.text;
  // Every part of the text, marked as match or not.
  struct Part {
    size_t start, end;
    bool match;
  };
  std::vector<Part> parts;
  size_t prev = 0;
  for (const auto& [start, end] : matches) {
    if (prev != start) parts.push_back({prev, start, false});
    parts.push_back({start, end, true});
    prev = end;
  }
  if (prev != s.size()) parts.push_back({prev, s.size(), false});
  if (invert) {
    for (Part& part : parts) part.match = !part.match;
  }
  std::vector<Part> kept;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Part& part : parts) {
        if (!part.match) kept.push_back(part);
      }
      break;
    case SplitBehavior::kIsolated:
      kept = parts;
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Part& part : parts) {
        if (part.match && !previous_match && !kept.empty()) {
          kept.back().end = part.end;
        } else {
          kept.push_back(part);
        }
        previous_match = part.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (size_t i = parts.size(); i-- > 0;) {
        const Part& part = parts[i];
        if (part.match && !previous_match && !kept.empty()) {
          kept.back().start = part.start;
        } else {
          kept.push_back(part);
        }
        previous_match = part.match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Part& part : parts) {
        if (part.match == previous_match && !kept.empty()) {
          kept.back().end = part.end;
        } else {
          kept.push_back(part);
        }
        previous_match = part.match;
      }
      break;
    }
  }
  for (const Part& part : kept) {
    if (part.start == part.end) continue;
    out->push_back(
        {s.substr(part.start, part.end - part.start), piece.at_start && part.start == 0});
  }
}

// The matches of a character predicate: each matching character on its own.
void CharMatches(std::string_view s, const std::function<bool(UChar32)>& predicate,
                 std::vector<std::pair<size_t, size_t>>* out) {
  out->clear();
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    if (predicate(NextChar(s, &i))) out->emplace_back(start, i);
  }
}

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual absl::Status Apply(std::vector<Piece>* pieces) const = 0;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  absl::Status Apply(std::vector<Piece>* pieces) const override {
    for (const auto& step : steps_) {
      if (absl::Status status = step->Apply(pieces); !status.ok()) return status;
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  absl::Status Apply(std::vector<Piece>* pieces) const override {
    std::vector<Piece> out;
    std::vector<std::pair<size_t, size_t>> matches;
    for (const Piece& piece : *pieces) {
      if (absl::Status status = pattern_.FindAll(piece.text, &matches); !status.ok()) {
        return status;
      }
      SplitPiece(piece, matches, behavior_, invert_, &out);
    }
    *pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// Splits on a character predicate (Digits, Punctuation, WhitespaceSplit).
class CharSplitPreTokenizer final : public PreTokenizer {
 public:
  CharSplitPreTokenizer(std::function<bool(UChar32)> predicate, SplitBehavior behavior)
      : predicate_(std::move(predicate)), behavior_(behavior) {}
  absl::Status Apply(std::vector<Piece>* pieces) const override {
    std::vector<Piece> out;
    std::vector<std::pair<size_t, size_t>> matches;
    for (const Piece& piece : *pieces) {
      CharMatches(piece.text, predicate_, &matches);
      SplitPiece(piece, matches, behavior_, /*invert=*/false, &out);
    }
    *pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::function<bool(UChar32)> predicate_;
  SplitBehavior behavior_;
};

// GPT-2's byte-to-unicode table: printable bytes stand for themselves, the others for
// U+0100 onwards, so that every byte has a visible, valid-UTF-8 spelling.
struct ByteTable {
  std::array<std::string, 256> encode;
  std::array<int16_t, 512> decode;  // code point -> byte, -1 when none
  ByteTable() {
    decode.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const int cp = printable ? b : next++;
      AppendChar(cp, &encode[static_cast<size_t>(b)]);
      decode[static_cast<size_t>(cp)] = static_cast<int16_t>(b);
    }
  }
};

const ByteTable& Bytes() {
  static const ByteTable* table = new ByteTable();
  return *table;
}

constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  absl::Status Apply(std::vector<Piece>* pieces) const override {
    std::vector<Piece> split;
    std::vector<std::pair<size_t, size_t>> matches;
    for (Piece& piece : *pieces) {
      if (add_prefix_space_ && !piece.text.starts_with(' '))
        piece.text = absl::StrCat(" ", piece.text);
      if (regex_ == nullptr) {
        split.push_back(std::move(piece));
        continue;
      }
      if (absl::Status status = regex_->FindAll(piece.text, &matches); !status.ok()) {
        return status;
      }
      SplitPiece(piece, matches, SplitBehavior::kIsolated, /*invert=*/false, &split);
    }
    const ByteTable& table = Bytes();
    for (Piece& piece : split) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (char c : piece.text) mapped += table.encode[static_cast<unsigned char>(c)];
      piece.text = std::move(mapped);
    }
    *pieces = std::move(split);
    return absl::OkStatus();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

absl::StatusOr<PrependScheme> ParsePrependScheme(const Json& obj, const std::string& key) {
  auto it = obj.find("prepend_scheme");
  if (it == obj.end() || it->is_null()) {
    // Files from before prepend_scheme say add_prefix_space.
    absl::StatusOr<bool> add = GetBool(obj, "add_prefix_space", key, true);
    if (!add.ok()) return add.status();
    return *add ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  const std::string name = it->is_string() ? it->get<std::string>() : "";
  if (name == "always") return PrependScheme::kAlways;
  if (name == "first") return PrependScheme::kFirst;
  if (name == "never") return PrependScheme::kNever;
  return Invalid(absl::StrCat(key, ".prepend_scheme"), "must be always, first or never");
}

absl::StatusOr<std::string> ParseReplacement(const Json& obj, const std::string& key) {
  absl::StatusOr<std::string> replacement =
      GetOptionalString(obj, "replacement", key, "\xE2\x96\x81");  // "▁"
  if (!replacement.ok()) return replacement.status();
  size_t i = 0;
  if (replacement->empty() || (NextChar(*replacement, &i), i != replacement->size())) {
    return Invalid(absl::StrCat(key, ".replacement"), "must be one character");
  }
  return replacement;
}

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  absl::Status Apply(std::vector<Piece>* pieces) const override {
    std::vector<Piece> out;
    std::vector<std::pair<size_t, size_t>> matches;
    for (Piece& piece : *pieces) {
      std::string text;
      for (char c : piece.text) {
        if (c == ' ') {
          text += replacement_;
        } else {
          text.push_back(c);
        }
      }
      piece.text = std::move(text);
      const bool prepend =
          scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && piece.at_start);
      if (prepend && !piece.text.starts_with(replacement_))
        piece.text = absl::StrCat(replacement_, piece.text);
      if (!split_) {
        if (!piece.text.empty()) out.push_back(std::move(piece));
        continue;
      }
      matches.clear();
      for (size_t pos = piece.text.find(replacement_); pos != std::string::npos;
           pos = piece.text.find(replacement_, pos + replacement_.size())) {
        matches.emplace_back(pos, pos + replacement_.size());
      }
      SplitPiece(piece, matches, SplitBehavior::kMergedWithNext, /*invert=*/false, &out);
    }
    *pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& obj,
                                                                const std::string& key) {
  absl::StatusOr<std::string> type = GetType(obj, key);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    absl::StatusOr<std::vector<std::unique_ptr<PreTokenizer>>> steps =
        ParseSteps<PreTokenizer>(obj, key, "pretokenizers", ParsePreTokenizer);
    if (!steps.ok()) return steps.status();
    return std::make_unique<SequencePreTokenizer>(std::move(*steps));
  }
  if (*type == "Split") {
    auto it = obj.find("pattern");
    if (it == obj.end()) return Invalid(key + ".pattern", "is missing");
    absl::StatusOr<Pattern> pattern = Pattern::Parse(*it, key + ".pattern");
    if (!pattern.ok()) return pattern.status();
    absl::StatusOr<SplitBehavior> behavior = ParseBehavior(obj, key, SplitBehavior::kRemoved);
    if (!behavior.ok()) return behavior.status();
    absl::StatusOr<bool> invert = GetBool(obj, "invert", key, false);
    if (!invert.ok()) return invert.status();
    return std::make_unique<SplitPreTokenizer>(std::move(*pattern), *behavior, *invert);
  }
  if (*type == "ByteLevel") {
    absl::StatusOr<bool> add_prefix_space = GetBool(obj, "add_prefix_space", key, true);
    if (!add_prefix_space.ok()) return add_prefix_space.status();
    absl::StatusOr<bool> use_regex = GetBool(obj, "use_regex", key, true);
    if (!use_regex.ok()) return use_regex.status();
    std::unique_ptr<Regex> regex;
    if (*use_regex) {
      absl::StatusOr<std::unique_ptr<Regex>> compiled = Regex::Compile(kGpt2Pattern, key);
      if (!compiled.ok()) return compiled.status();
      regex = std::move(*compiled);
    }
    return std::make_unique<ByteLevelPreTokenizer>(*add_prefix_space, std::move(regex));
  }
  if (*type == "Metaspace") {
    absl::StatusOr<std::string> replacement = ParseReplacement(obj, key);
    if (!replacement.ok()) return replacement.status();
    absl::StatusOr<PrependScheme> scheme = ParsePrependScheme(obj, key);
    if (!scheme.ok()) return scheme.status();
    absl::StatusOr<bool> split = GetBool(obj, "split", key, true);
    if (!split.ok()) return split.status();
    return std::make_unique<MetaspacePreTokenizer>(std::move(*replacement), *scheme, *split);
  }
  if (*type == "Digits") {
    absl::StatusOr<bool> individual = GetBool(obj, "individual_digits", key, false);
    if (!individual.ok()) return individual.status();
    return std::make_unique<CharSplitPreTokenizer>(
        IsNumeric, *individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
  }
  if (*type == "WhitespaceSplit") {
    return std::make_unique<CharSplitPreTokenizer>(IsWhitespace, SplitBehavior::kRemoved);
  }
  if (*type == "Punctuation") {
    absl::StatusOr<SplitBehavior> behavior = ParseBehavior(obj, key, SplitBehavior::kIsolated);
    if (!behavior.ok()) return behavior.status();
    return std::make_unique<CharSplitPreTokenizer>(IsPunctuation, *behavior);
  }
  if (*type == "Whitespace") {
    absl::StatusOr<std::unique_ptr<Regex>> regex = Regex::Compile(R"(\w+|[^\w\s]+)", key);
    if (!regex.ok()) return regex.status();
    Json pattern = {{"Regex", R"(\w+|[^\w\s]+)"}};
    absl::StatusOr<Pattern> parsed = Pattern::Parse(pattern, key);
    if (!parsed.ok()) return parsed.status();
    return std::make_unique<SplitPreTokenizer>(std::move(*parsed), SplitBehavior::kRemoved,
                                               /*invert=*/true);
  }
  return Invalid(key, absl::StrCat("type ", *type, " is not supported"));
}

// ---------------------------------------------------------------------------------------------
// Decoders: each turns the list of token strings into another list, as in the tokenizers
// library's decode_chain; the final text is their concatenation.

class Decoder {
 public:
  virtual ~Decoder() = default;
  // raw: the bytes as they are, for a token inside a text (no U+FFFD for incomplete UTF-8,
  // nothing stripped at the start).
  virtual absl::Status Apply(std::vector<std::string>* tokens, bool raw) const = 0;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  absl::Status Apply(std::vector<std::string>* tokens, bool raw) const override {
    for (const auto& step : steps_) {
      if (absl::Status status = step->Apply(tokens, raw); !status.ok()) return status;
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

class ByteLevelDecoder final : public Decoder {
 public:
  absl::Status Apply(std::vector<std::string>* tokens, bool raw) const override {
    const ByteTable& table = Bytes();
    std::string bytes;
    for (const std::string& token : *tokens) {
      const size_t mark = bytes.size();
      bool mapped = true;
      for (size_t i = 0; i < token.size();) {
        const UChar32 cp = NextChar(token, &i);
        const int16_t b = cp < 512 ? table.decode[static_cast<size_t>(cp)] : -1;
        if (b < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!mapped) {  // not a byte-level token: its own bytes
        bytes.resize(mark);
        bytes += token;
      }
    }
    tokens->assign(1, raw ? bytes : LossyUtf8(bytes));
    return absl::OkStatus();
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, PrependScheme scheme)
      : replacement_(std::move(replacement)), scheme_(scheme) {}
  absl::Status Apply(std::vector<std::string>* tokens, bool raw) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& token = (*tokens)[i];
      std::string out;
      for (size_t pos = 0;;) {
        const size_t next = token.find(replacement_, pos);
        out.append(token, pos, next == std::string::npos ? std::string::npos : next - pos);
        if (next == std::string::npos) break;
        out.push_back(' ');
        pos = next + replacement_.size();
      }
      if (!raw && i == 0 && scheme_ != PrependScheme::kNever && out.starts_with(' ')) {
        out.erase(0, 1);
      }
      token = std::move(out);
    }
    return absl::OkStatus();
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status Apply(std::vector<std::string>* tokens, bool raw) const override {
    for (std::string& token : *tokens) {
      if (absl::Status status = pattern_.ReplaceAll(content_, &token); !status.ok()) {
        return status;
      }
    }
    return absl::OkStatus();
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// The byte value of a "<0xXX>" piece, or -1.
int ByteFallbackValue(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

class ByteFallbackDecoder final : public Decoder {
 public:
  absl::Status Apply(std::vector<std::string>* tokens, bool raw) const override {
    std::vector<std::string> out;
    std::string pending;  // bytes of consecutive byte pieces
    size_t pending_count = 0;
    const auto flush = [&] {
      if (pending_count == 0) return;
      if (raw || IsValidUtf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending_count; ++i) out.emplace_back(kReplacementChar);
      }
      pending.clear();
      pending_count = 0;
    };
    for (std::string& token : *tokens) {
      const int value = ByteFallbackValue(token);
      if (value >= 0) {
        pending.push_back(static_cast<char>(value));
        ++pending_count;
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    *tokens = std::move(out);
    return absl::OkStatus();
  }
};

class FuseDecoder final : public Decoder {
 public:
  absl::Status Apply(std::vector<std::string>* tokens, bool raw) const override {
    std::string all;
    for (const std::string& token : *tokens) all += token;
    tokens->assign(1, std::move(all));
    return absl::OkStatus();
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, int64_t start, int64_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  absl::Status Apply(std::vector<std::string>* tokens, bool raw) const override {
    if (raw) return absl::OkStatus();
    for (std::string& token : *tokens) {
      size_t begin = 0, end = token.size();
      for (int64_t i = 0; i < start_ && std::string_view(token).substr(begin).starts_with(content_);
           ++i) {
        begin += content_.size();
      }
      for (int64_t i = 0; i < stop_ && end - begin >= content_.size() &&
                          std::string_view(token).substr(begin, end - begin).ends_with(content_);
           ++i) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
    return absl::OkStatus();
  }

 private:
  std::string content_;
  int64_t start_, stop_;
};

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& obj, const std::string& key) {
  absl::StatusOr<std::string> type = GetType(obj, key);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    absl::StatusOr<std::vector<std::unique_ptr<Decoder>>> steps =
        ParseSteps<Decoder>(obj, key, "decoders", ParseDecoder);
    if (!steps.ok()) return steps.status();
    return std::make_unique<SequenceDecoder>(std::move(*steps));
  }
  if (*type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (*type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (*type == "Fuse") return std::make_unique<FuseDecoder>();
  if (*type == "Metaspace") {
    absl::StatusOr<std::string> replacement = ParseReplacement(obj, key);
    if (!replacement.ok()) return replacement.status();
    absl::StatusOr<PrependScheme> scheme = ParsePrependScheme(obj, key);
    if (!scheme.ok()) return scheme.status();
    return std::make_unique<MetaspaceDecoder>(std::move(*replacement), *scheme);
  }
  if (*type == "Replace") {
    auto it = obj.find("pattern");
    if (it == obj.end()) return Invalid(key + ".pattern", "is missing");
    absl::StatusOr<Pattern> pattern = Pattern::Parse(*it, key + ".pattern");
    if (!pattern.ok()) return pattern.status();
    absl::StatusOr<std::string> content = GetString(obj, "content", key);
    if (!content.ok()) return content.status();
    return std::make_unique<ReplaceDecoder>(std::move(*pattern), std::move(*content));
  }
  if (*type == "Strip") {
    absl::StatusOr<std::string> content = GetString(obj, "content", key);
    if (!content.ok()) return content.status();
    if (content->empty()) return Invalid(key + ".content", "must not be empty");
    absl::StatusOr<int64_t> start = GetInt(obj, "start", key, 0);
    if (!start.ok()) return start.status();
    absl::StatusOr<int64_t> stop = GetInt(obj, "stop", key, 0);
    if (!stop.ok()) return stop.status();
    return std::make_unique<StripDecoder>(std::move(*content), *start, *stop);
  }
  return Invalid(key, absl::StrCat("type ", *type, " is not supported"));
}

// ---------------------------------------------------------------------------------------------
// Added tokens: matched whole in the text, leftmost-longest, before pre-tokenization.

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// A byte trie over a set of added tokens' spellings.
class AddedTokenMatcher {
 public:
  // `pattern` is the text to find for added_[index].
  void Add(std::string_view pattern, size_t index) {
    if (pattern.empty()) return;
    int32_t node = 0;
    for (char c : pattern) {
      const uint64_t key = static_cast<uint64_t>(node) << 8 | static_cast<unsigned char>(c);
      auto [it, inserted] = children_.try_emplace(key, static_cast<int32_t>(terminal_.size()));
      if (inserted) terminal_.push_back(-1);
      node = it->second;
    }
    first_byte_[static_cast<unsigned char>(pattern[0])] = true;
    if (terminal_[static_cast<size_t>(node)] < 0) {
      terminal_[static_cast<size_t>(node)] = static_cast<int32_t>(index);
    }
  }

  bool empty() const { return children_.empty(); }

  struct Match {
    size_t start, end, index;
  };

  // Non-overlapping leftmost-longest matches.
  void FindAll(std::string_view s, std::vector<Match>* out) const {
    out->clear();
    for (size_t i = 0; i < s.size();) {
      if (!first_byte_[static_cast<unsigned char>(s[i])]) {
        ++i;
        continue;
      }
      int32_t node = 0;
      size_t best_end = 0;
      int32_t best = -1;
      for (size_t k = i; k < s.size(); ++k) {
        const uint64_t key = static_cast<uint64_t>(node) << 8 | static_cast<unsigned char>(s[k]);
        auto it = children_.find(key);
        if (it == children_.end()) break;
        node = it->second;
        if (terminal_[static_cast<size_t>(node)] >= 0) {
          best = terminal_[static_cast<size_t>(node)];
          best_end = k + 1;
        }
      }
      if (best < 0) {
        ++i;
        continue;
      }
      out->push_back({i, best_end, static_cast<size_t>(best)});
      i = best_end;
    }
  }

 private:
  absl::flat_hash_map<uint64_t, int32_t> children_;  // (node << 8 | byte) -> child
  std::vector<int32_t> terminal_{-1};                // node -> token index, or -1
  std::array<bool, 256> first_byte_{};
};

bool IsWordChar(UChar32 c) { return IsAlphanumeric(c) || c == '_'; }

// ---------------------------------------------------------------------------------------------
// The BPE model

class BpeModel {
 public:
  absl::flat_hash_map<std::string, int32_t> vocab;
  // (left id << 32 | right id) -> (rank, merged id)
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::string prefix;                   // continuing_subword_prefix
  std::string suffix;                   // end_of_word_suffix
  std::array<int32_t, 256> byte_ids{};  // "<0xXX>" ids, -1 when absent

  // Appends the ids of `word`.
  void Tokenize(const std::string& word, std::vector<int32_t>* out) const {
    if (word.size() <= kMaxCachedWordBytes) {
      std::shared_lock lock(cache_mutex_);
      auto it = cache_.find(word);
      if (it != cache_.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids;
    TokenizeUncached(word, &ids);
    out->insert(out->end(), ids.begin(), ids.end());
    if (word.size() <= kMaxCachedWordBytes) {
      std::unique_lock lock(cache_mutex_);
      if (cache_.size() < kMaxCachedWords) cache_.emplace(word, std::move(ids));
    }
  }

 private:
  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kMaxCachedWords = 200000;

  void TokenizeUncached(const std::string& word, std::vector<int32_t>* out) const {
    if (ignore_merges) {
      if (auto it = vocab.find(word); it != vocab.end()) {
        out->push_back(it->second);
        return;
      }
    }
    // The initial symbols: one per character (or per byte, with byte fallback).
    std::vector<int32_t> symbols;
    int32_t pending_unk = -1;  // an unknown run not yet added (fuse_unk)
    std::string piece;
    for (size_t i = 0; i < word.size();) {
      const size_t start = i;
      NextChar(word, &i);
      piece.clear();
      if (start > 0) piece += prefix;
      piece.append(word, start, i - start);
      if (i == word.size()) piece += suffix;
      if (auto it = vocab.find(piece); it != vocab.end()) {
        if (pending_unk >= 0) symbols.push_back(pending_unk);
        pending_unk = -1;
        symbols.push_back(it->second);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (char c : piece) all = all && byte_ids[static_cast<unsigned char>(c)] >= 0;
        if (all) {
          if (pending_unk >= 0) symbols.push_back(pending_unk);
          pending_unk = -1;
          for (char c : piece) symbols.push_back(byte_ids[static_cast<unsigned char>(c)]);
          continue;
        }
      }
      if (unk_id >= 0) {
        if (pending_unk >= 0 && !fuse_unk) symbols.push_back(pending_unk);
        pending_unk = unk_id;
      }
    }
    if (pending_unk >= 0) symbols.push_back(pending_unk);
    if (symbols.size() <= 1) {
      out->insert(out->end(), symbols.begin(), symbols.end());
      return;
    }

    // Merges, lowest rank first, leftmost among equals.
    struct Symbol {
      int32_t id, prev, next;
    };
    std::vector<Symbol> list(symbols.size());
    const int32_t n = static_cast<int32_t>(symbols.size());
    for (int32_t i = 0; i < n; ++i) {
      list[static_cast<size_t>(i)] = {symbols[static_cast<size_t>(i)], i - 1,
                                      i + 1 < n ? i + 1 : -1};
    }
    struct Candidate {
      int32_t rank, pos, merged;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : pos > o.pos;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
    const auto consider = [&](int32_t pos) {
      const int32_t next = list[static_cast<size_t>(pos)].next;
      if (next < 0) return;
      auto it =
          merges.find(Key(list[static_cast<size_t>(pos)].id, list[static_cast<size_t>(next)].id));
      if (it != merges.end()) queue.push({it->second.first, pos, it->second.second});
    };
    for (int32_t i = 0; i + 1 < n; ++i) consider(i);
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& left = list[static_cast<size_t>(top.pos)];
      if (left.id < 0 || left.next < 0) continue;
      Symbol& right = list[static_cast<size_t>(left.next)];
      auto it = merges.find(Key(left.id, right.id));
      if (it == merges.end() || it->second.second != top.merged) continue;
      left.id = top.merged;
      right.id = -1;  // removed
      left.next = right.next;
      if (left.next >= 0) list[static_cast<size_t>(left.next)].prev = top.pos;
      if (left.prev >= 0) consider(left.prev);
      consider(top.pos);
    }
    for (int32_t i = 0; i >= 0; i = list[static_cast<size_t>(i)].next) {
      out->push_back(list[static_cast<size_t>(i)].id);
    }
  }

 public:
  static uint64_t Key(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }

 private:
  mutable std::shared_mutex cache_mutex_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;
};

absl::Status ParseBpe(const Json& model, BpeModel* bpe) {
  absl::StatusOr<std::string> type = GetOptionalString(model, "type", "model", "BPE");
  if (!type.ok()) return type.status();
  if (*type != "BPE")
    return Invalid("model.type", absl::StrCat(*type, ": model type ", *type, " is not supported"));
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    return Invalid("model.dropout", "must be null (BPE dropout is not supported)");
  }
  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return Invalid("model.vocab", "must be an object of token -> id");
  }
  bpe->vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > (int64_t{1} << 30)) {
      return Invalid(absl::StrCat("model.vocab[\"", it.key(), "\"]"), "must be an id in [0, 2^30]");
    }
    bpe->vocab[it.key()] = static_cast<int32_t>(it.value().get<int64_t>());
  }
  absl::StatusOr<std::string> prefix =
      GetOptionalString(model, "continuing_subword_prefix", "model", "");
  if (!prefix.ok()) return prefix.status();
  absl::StatusOr<std::string> suffix = GetOptionalString(model, "end_of_word_suffix", "model", "");
  if (!suffix.ok()) return suffix.status();
  bpe->prefix = *prefix;
  bpe->suffix = *suffix;
  for (const auto& [name, field] :
       {std::pair{"fuse_unk", &bpe->fuse_unk}, std::pair{"byte_fallback", &bpe->byte_fallback},
        std::pair{"ignore_merges", &bpe->ignore_merges}}) {
    absl::StatusOr<bool> value = GetBool(model, name, "model", false);
    if (!value.ok()) return value.status();
    *field = *value;
  }
  absl::StatusOr<std::string> unk = GetOptionalString(model, "unk_token", "model", "");
  if (!unk.ok()) return unk.status();
  if (!unk->empty()) {
    auto it = bpe->vocab.find(*unk);
    if (it == bpe->vocab.end()) return Invalid("model.unk_token", "is not in the vocabulary");
    bpe->unk_id = it->second;
  }
  bpe->byte_ids.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = bpe->vocab.find(absl::StrFormat("<0x%02X>", b));
    if (it != bpe->vocab.end()) bpe->byte_ids[static_cast<size_t>(b)] = it->second;
  }

  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array())
    return Invalid("model.merges", "must be a list");
  bpe->merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& merge = (*merges)[i];
    const std::string key = absl::StrCat("model.merges[", i, "]");
    std::string left, right;
    if (merge.is_string()) {
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        return Invalid(key, "is not a pair (\"a b\")");
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return Invalid(key, "is not a pair");
    }
    auto l = bpe->vocab.find(left);
    if (l == bpe->vocab.end())
      return Invalid(key, absl::StrCat("names \"", left, "\", not in the vocabulary"));
    auto r = bpe->vocab.find(right);
    if (r == bpe->vocab.end())
      return Invalid(key, absl::StrCat("names \"", right, "\", not in the vocabulary"));
    std::string_view right_part = right;
    if (!bpe->prefix.empty() && right_part.starts_with(bpe->prefix)) {
      right_part.remove_prefix(bpe->prefix.size());
    }
    const std::string merged = absl::StrCat(left, std::string(right_part));
    auto m = bpe->vocab.find(merged);
    if (m == bpe->vocab.end()) {
      return Invalid(key, absl::StrCat("makes \"", merged, "\", not in the vocabulary"));
    }
    bpe->merges[BpeModel::Key(l->second, r->second)] = {static_cast<int32_t>(i), m->second};
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// tokenizer_config.json

absl::StatusOr<std::optional<std::string>> ConfigToken(const Json& doc, const std::string& name) {
  auto it = doc.find(name);
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer_config.json: ", name, " must be a string or an object with a \"content\" string"));
}

absl::StatusOr<std::optional<bool>> ConfigBool(const Json& doc, const std::string& name) {
  auto it = doc.find(name);
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer_config.json: ", name, " must be a boolean"));
  }
  return it->get<bool>();
}

}  // namespace

absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(std::string_view json) {
  TokenizerConfig config;
  if (json.empty()) return config;
  const Json doc = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config.json is not a JSON object");
  }
  for (auto [name, field] :
       {std::pair{"bos_token", &config.bos_token}, std::pair{"eos_token", &config.eos_token},
        std::pair{"pad_token", &config.pad_token}, std::pair{"unk_token", &config.unk_token}}) {
    absl::StatusOr<std::optional<std::string>> value = ConfigToken(doc, name);
    if (!value.ok()) return value.status();
    *field = std::move(*value);
  }
  for (auto [name, field] : {std::pair{"add_bos_token", &config.add_bos_token},
                             std::pair{"add_eos_token", &config.add_eos_token}}) {
    absl::StatusOr<std::optional<bool>> value = ConfigBool(doc, name);
    if (!value.ok()) return value.status();
    *field = *value;
  }
  return config;
}

// ---------------------------------------------------------------------------------------------
// HfTokenizer

struct HfTokenizer::Impl {
  BpeModel bpe;
  std::unique_ptr<Normalizer> normalizer;       // null when none
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // null when none
  std::unique_ptr<Decoder> decoder;             // null: tokens joined with spaces
  std::vector<AddedToken> added;
  AddedTokenMatcher raw_matcher;         // added tokens with normalized = false
  AddedTokenMatcher normalized_matcher;  // the others, by their normalized spelling
  absl::flat_hash_map<std::string, int32_t> added_ids;
  std::vector<std::string> pieces;  // id -> token ("" for holes)
  std::vector<uint8_t> special;     // id -> special added token
  std::vector<uint8_t> byte_piece;  // id -> "<0xXX>" byte-fallback piece
  // TemplateProcessing's single: ids before and after the sequence.
  std::optional<std::pair<std::vector<int32_t>, std::vector<int32_t>>> single_template;
  bool add_bos = false, add_eos = false;
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;

  // Splits each piece without an id at the matches of `matcher` (HF's AddedVocabulary
  // find_matches with lstrip / rstrip / single_word), appending to `out`.
  void SplitAdded(const AddedTokenMatcher& matcher, std::string_view text, bool at_start,
                  std::vector<std::pair<Piece, int32_t>>* out) const {
    std::vector<AddedTokenMatcher::Match> matches;
    matcher.FindAll(text, &matches);
    size_t consumed = 0;  // text before this offset is already in `out`
    for (const AddedTokenMatcher::Match& match : matches) {
      const AddedToken& token = added[match.index];
      size_t start = match.start, end = match.end;
      if (start < consumed) continue;  // inside the previous token's stripped spaces
      if (token.single_word) {
        bool word_before = false, word_after = false;
        if (start > 0) {
          size_t k = start;
          word_before = IsWordChar(PrevChar(text, &k));
        }
        if (end < text.size()) {
          size_t k = end;
          word_after = IsWordChar(NextChar(text, &k));
        }
        if (word_before || word_after) continue;
      }
      if (token.lstrip) {
        while (start > consumed) {
          size_t k = start;
          if (!IsWhitespace(PrevChar(text, &k))) break;
          start = k;
        }
      }
      if (token.rstrip) {
        while (end < text.size()) {
          size_t k = end;
          if (!IsWhitespace(NextChar(text, &k))) break;
          end = k;
        }
      }
      if (start > consumed) {
        out->push_back(
            {{std::string(text.substr(consumed, start - consumed)), at_start && consumed == 0},
             -1});
      }
      out->push_back({{std::string(text.substr(start, end - start)), false}, token.id});
      consumed = end;
    }
    if (consumed < text.size()) {
      out->push_back({{std::string(text.substr(consumed)), at_start && consumed == 0}, -1});
    }
  }

  absl::Status Encode(std::string_view text, std::vector<int32_t>* ids) const {
    if (!IsValidUtf8(text)) return absl::InvalidArgumentError("text is not valid UTF-8");
    std::vector<std::pair<Piece, int32_t>> raw;
    SplitAdded(raw_matcher, text, /*at_start=*/true, &raw);
    std::vector<std::pair<Piece, int32_t>> split;
    for (auto& [piece, id] : raw) {
      if (id >= 0) {
        split.emplace_back(std::move(piece), id);
        continue;
      }
      if (normalizer != nullptr) {
        if (absl::Status status = normalizer->Normalize(&piece.text); !status.ok()) {
          return status;
        }
      }
      if (normalized_matcher.empty()) {
        split.emplace_back(std::move(piece), -1);
      } else {
        SplitAdded(normalized_matcher, piece.text, piece.at_start, &split);
      }
    }
    std::vector<Piece> words;
    for (auto& [piece, id] : split) {
      if (id >= 0) {
        ids->push_back(id);
        continue;
      }
      if (piece.text.empty()) continue;
      words.clear();
      words.push_back(std::move(piece));
      if (pre_tokenizer != nullptr) {
        if (absl::Status status = pre_tokenizer->Apply(&words); !status.ok()) return status;
      }
      for (const Piece& word : words) {
        if (!word.text.empty()) bpe.Tokenize(word.text, ids);
      }
    }
    return absl::OkStatus();
  }
};

namespace {

// post_processor: finds TemplateProcessing (alone or in a Sequence) and refuses the kinds
// that would add tokens we do not model.
absl::Status ParsePostProcessor(const Json& obj, const std::string& key, HfTokenizer::Impl* impl) {
  absl::StatusOr<std::string> type = GetType(obj, key);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return absl::OkStatus();
  if (*type == "Sequence") {
    auto it = obj.find("processors");
    if (it == obj.end() || !it->is_array()) return Invalid(key + ".processors", "must be a list");
    for (size_t i = 0; i < it->size(); ++i) {
      if (absl::Status status =
              ParsePostProcessor((*it)[i], absl::StrCat(key, ".processors[", i, "]"), impl);
          !status.ok()) {
        return status;
      }
    }
    return absl::OkStatus();
  }
  if (*type != "TemplateProcessing") {
    return Invalid(key, absl::StrCat("type ", *type, " is not supported"));
  }
  auto single = obj.find("single");
  if (single == obj.end() || !single->is_array()) return Invalid(key + ".single", "must be a list");
  auto specials = obj.find("special_tokens");
  if (specials != obj.end() && !specials->is_object()) {
    return Invalid(key + ".special_tokens", "must be an object");
  }
  std::pair<std::vector<int32_t>, std::vector<int32_t>> frame;
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& item = (*single)[i];
    const std::string item_key = absl::StrCat(key, ".single[", i, "]");
    if (!item.is_object()) return Invalid(item_key, "must be an object");
    if (item.contains("Sequence")) {
      if (seen_sequence) return Invalid(item_key, "is a second Sequence");
      seen_sequence = true;
      continue;
    }
    auto special = item.find("SpecialToken");
    if (special == item.end() || !special->is_object()) {
      return Invalid(item_key, "must be {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
    absl::StatusOr<std::string> name = GetString(*special, "id", item_key + ".SpecialToken");
    if (!name.ok()) return name.status();
    if (specials == obj.end() || !specials->contains(*name)) {
      return Invalid(item_key, absl::StrCat("names \"", *name, "\", not in special_tokens"));
    }
    const Json& entry = (*specials)[*name];
    auto ids = entry.is_object() ? entry.find("ids") : entry.end();
    if (!entry.is_object() || ids == entry.end() || !ids->is_array()) {
      return Invalid(absl::StrCat(key, ".special_tokens[\"", *name, "\"].ids"), "must be a list");
    }
    for (const Json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= static_cast<int64_t>(impl->pieces.size())) {
        return Invalid(absl::StrCat(key, ".special_tokens[\"", *name, "\"].ids"),
                       "must be ids in the vocabulary");
      }
      (seen_sequence ? frame.second : frame.first)
          .push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  if (!seen_sequence) return Invalid(key + ".single", "has no Sequence");
  impl->single_template = std::move(frame);
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const Json& doc, HfTokenizer::Impl* impl) {
  auto list = doc.find("added_tokens");
  if (list == doc.end() || list->is_null()) return absl::OkStatus();
  if (!list->is_array()) return Invalid("added_tokens", "must be a list");
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& item = (*list)[i];
    const std::string key = absl::StrCat("added_tokens[", i, "]");
    if (!item.is_object()) return Invalid(key, "must be an object");
    AddedToken token;
    absl::StatusOr<std::string> content = GetString(item, "content", key);
    if (!content.ok()) return content.status();
    if (content->empty()) return Invalid(key + ".content", "must not be empty");
    token.content = std::move(*content);
    absl::StatusOr<int64_t> id = GetInt(item, "id", key, -1);
    if (!id.ok()) return id.status();
    if (*id < 0 || *id > (int64_t{1} << 30))
      return Invalid(key + ".id", "must be an id in [0, 2^30]");
    token.id = static_cast<int32_t>(*id);
    for (const auto& [name, field, fallback] :
         {std::tuple{"single_word", &token.single_word, false},
          std::tuple{"lstrip", &token.lstrip, false}, std::tuple{"rstrip", &token.rstrip, false},
          std::tuple{"special", &token.special, false}}) {
      absl::StatusOr<bool> value = GetBool(item, name, key, fallback);
      if (!value.ok()) return value.status();
      *field = *value;
    }
    // The library's default: special tokens are not normalized, others are.
    absl::StatusOr<bool> normalized = GetBool(item, "normalized", key, !token.special);
    if (!normalized.ok()) return normalized.status();
    token.normalized = *normalized;
    impl->added.push_back(std::move(token));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HfTokenizer::Impl>> Build(std::string_view tokenizer_json,
                                                         std::string_view config_json) {
  auto impl = std::make_unique<HfTokenizer::Impl>();
  const Json doc = Json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json is not a JSON object");
  }
  absl::StatusOr<TokenizerConfig> config = ParseTokenizerConfig(config_json);
  if (!config.ok()) return config.status();

  auto model = doc.find("model");
  if (model == doc.end() || !model->is_object()) return Invalid("model", "must be an object");
  if (absl::Status status = ParseBpe(*model, &impl->bpe); !status.ok()) return status;
  if (absl::Status status = ParseAddedTokens(doc, impl.get()); !status.ok()) return status;

  // id -> piece over the vocabulary and the added tokens (which win where both name an id).
  int32_t size = 0;
  for (const auto& [piece, id] : impl->bpe.vocab) size = std::max(size, id + 1);
  for (const AddedToken& token : impl->added) size = std::max(size, token.id + 1);
  // Published vocabularies are dense; a few ids far beyond the rest would only make the
  // id -> piece table huge.
  const size_t entries = impl->bpe.vocab.size() + impl->added.size();
  if (static_cast<size_t>(size) > 2 * entries + 1024) {
    return Invalid("model.vocab",
                   absl::StrCat("ids reach ", size - 1, " for ", entries, " tokens: too sparse"));
  }
  impl->pieces.resize(static_cast<size_t>(size));
  impl->special.assign(static_cast<size_t>(size), 0);
  impl->byte_piece.assign(static_cast<size_t>(size), 0);
  for (const auto& [piece, id] : impl->bpe.vocab) impl->pieces[static_cast<size_t>(id)] = piece;
  if (impl->bpe.byte_fallback) {
    for (int32_t id : impl->bpe.byte_ids) {
      if (id >= 0) impl->byte_piece[static_cast<size_t>(id)] = 1;
    }
  }
  for (const AddedToken& token : impl->added) {
    impl->pieces[static_cast<size_t>(token.id)] = token.content;
    impl->special[static_cast<size_t>(token.id)] = token.special;
    impl->added_ids[token.content] = token.id;
  }

  for (const auto& [name, parse] :
       {std::pair<std::string, std::function<absl::Status(const Json&)>>{
            "normalizer",
            [&](const Json& obj) {
              absl::StatusOr<std::unique_ptr<Normalizer>> n = ParseNormalizer(obj, "normalizer");
              if (!n.ok()) return n.status();
              impl->normalizer = std::move(*n);
              return absl::OkStatus();
            }},
        {"pre_tokenizer",
         [&](const Json& obj) {
           absl::StatusOr<std::unique_ptr<PreTokenizer>> p =
               ParsePreTokenizer(obj, "pre_tokenizer");
           if (!p.ok()) return p.status();
           impl->pre_tokenizer = std::move(*p);
           return absl::OkStatus();
         }},
        {"decoder",
         [&](const Json& obj) {
           absl::StatusOr<std::unique_ptr<Decoder>> d = ParseDecoder(obj, "decoder");
           if (!d.ok()) return d.status();
           impl->decoder = std::move(*d);
           return absl::OkStatus();
         }},
        {"post_processor",
         [&](const Json& obj) { return ParsePostProcessor(obj, "post_processor", impl.get()); }}}) {
    auto it = doc.find(name);
    if (it == doc.end() || it->is_null()) continue;
    if (absl::Status status = parse(*it); !status.ok()) return status;
  }

  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& token = impl->added[i];
    if (!token.normalized) {
      impl->raw_matcher.Add(token.content, i);
      continue;
    }
    std::string normalized = token.content;
    if (impl->normalizer != nullptr) {
      if (absl::Status status = impl->normalizer->Normalize(&normalized); !status.ok()) {
        return status;
      }
    }
    impl->normalized_matcher.Add(normalized, i);
  }

  const auto lookup = [&](const std::optional<std::string>& token) -> int32_t {
    if (!token.has_value()) return -1;
    if (auto it = impl->added_ids.find(*token); it != impl->added_ids.end()) return it->second;
    if (auto it = impl->bpe.vocab.find(*token); it != impl->bpe.vocab.end()) return it->second;
    return -1;
  };
  impl->bos = lookup(config->bos_token);
  impl->eos = lookup(config->eos_token);
  impl->pad = lookup(config->pad_token);
  impl->unk = impl->bpe.unk_id >= 0 ? impl->bpe.unk_id : lookup(config->unk_token);
  if (impl->single_template.has_value()) {
    impl->add_bos = !impl->single_template->first.empty();
    if (impl->bos < 0 && impl->add_bos) impl->bos = impl->single_template->first.front();
  } else {
    impl->add_bos = config->add_bos_token.value_or(false) && impl->bos >= 0;
    impl->add_eos = config->add_eos_token.value_or(false) && impl->eos >= 0;
  }
  return impl;
}

}  // namespace

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json) {
  try {
    absl::StatusOr<std::unique_ptr<Impl>> impl = Build(tokenizer_json, tokenizer_config_json);
    if (!impl.ok()) return impl.status();
    return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(*impl)));
  } catch (const std::exception& e) {  // a JSON access the checks above missed
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  }
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  if (absl::Status status = impl_->Encode(text, &ids); !status.ok()) return status;
  return ids;
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::EncodeWithSpecialTokens(
    std::string_view text) const {
  std::vector<int32_t> ids;
  if (impl_->single_template.has_value()) {
    ids = impl_->single_template->first;
  } else if (impl_->add_bos) {
    ids.push_back(impl_->bos);
  }
  if (absl::Status status = impl_->Encode(text, &ids); !status.ok()) return status;
  if (impl_->single_template.has_value()) {
    ids.insert(ids.end(), impl_->single_template->second.begin(),
               impl_->single_template->second.end());
  } else if (impl_->add_eos) {
    ids.push_back(impl_->eos);
  }
  return ids;
}

absl::StatusOr<std::string> HfTokenizer::Decode(absl::Span<const int32_t> ids) const {
  const int32_t size = vocab_size();
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", size, ")"));
    }
    const std::string& piece = impl_->pieces[static_cast<size_t>(id)];
    if (impl_->special[static_cast<size_t>(id)] || piece.empty()) continue;
    tokens.push_back(piece);
  }
  if (impl_->decoder == nullptr) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) absl::StrAppend(&out, i > 0 ? " " : "", tokens[i]);
    return out;
  }
  if (absl::Status status = impl_->decoder->Apply(&tokens, /*raw=*/false); !status.ok()) {
    return status;
  }
  std::string out;
  for (const std::string& token : tokens) out += token;
  return out;
}

std::optional<std::string> HfTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || impl_->special[static_cast<size_t>(id)] || id == impl_->unk) {
    return std::nullopt;
  }
  const std::string& piece = impl_->pieces[static_cast<size_t>(id)];
  if (piece.empty() || impl_->decoder == nullptr) return piece;
  std::vector<std::string> tokens = {piece};
  if (!impl_->decoder->Apply(&tokens, /*raw=*/true).ok()) return std::nullopt;
  std::string out;
  for (const std::string& token : tokens) out += token;
  return out;
}

bool HfTokenizer::add_bos() const { return impl_->add_bos; }
int32_t HfTokenizer::vocab_size() const { return static_cast<int32_t>(impl_->pieces.size()); }
int32_t HfTokenizer::bos_id() const { return impl_->bos; }
int32_t HfTokenizer::eos_id() const { return impl_->eos; }
int32_t HfTokenizer::unk_id() const { return impl_->unk; }
int32_t HfTokenizer::pad_id() const { return impl_->pad; }

std::string HfTokenizer::IdToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return impl_->pieces[static_cast<size_t>(id)];
}

int32_t HfTokenizer::TokenToId(std::string_view piece) const {
  if (auto it = impl_->added_ids.find(std::string(piece)); it != impl_->added_ids.end())
    return it->second;
  if (auto it = impl_->bpe.vocab.find(std::string(piece)); it != impl_->bpe.vocab.end())
    return it->second;
  return -1;
}

bool HfTokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[static_cast<size_t>(id)];
}

bool HfTokenizer::IsByte(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->byte_piece[static_cast<size_t>(id)];
}

std::vector<int32_t> HfTokenizer::SpecialTokenIds() const {
  std::vector<int32_t> out;
  for (size_t id = 0; id < impl_->special.size(); ++id) {
    if (impl_->special[id]) out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

}  // namespace tandem::model
