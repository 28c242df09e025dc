#include "common/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::chat::internal {

Value Value::List(std::vector<Value> items, bool tuple) {
  auto list = std::make_shared<ListObject>();
  list->items = std::move(items);
  for (const Value& item : list->items) {
    list->depth = std::max(list->depth, DepthOf(item) + 1);
    list->holds_ns |= HoldsNamespace(item);
  }
  Value v;
  v.kind = Kind::kList;
  v.tuple = tuple;
  v.obj = std::move(list);
  return v;
}

Value Value::Generator(std::vector<Value> items) {
  Value v = List(std::move(items));
  v.generator = true;
  return v;
}

Value Value::FailedGenerator(absl::Status error) {
  Value v = Generator({});
  static_cast<ListObject*>(v.obj.get())->error = std::move(error);
  return v;
}

Value Value::Dict(std::vector<std::pair<Value, Value>> items) {
  auto dict = std::make_shared<DictObject>();
  dict->entries = std::move(items);
  dict->Recompute();
  Value v;
  v.kind = Kind::kDict;
  v.obj = std::move(dict);
  return v;
}

Value Value::Namespace(std::vector<std::pair<Value, Value>> items) {
  Value v = Dict(std::move(items));
  v.kind = Kind::kNamespace;
  v.obj->holds_ns = true;
  return v;
}

const Value* DictObject::Find(const Value& key) const {
  for (const auto& [k, v] : entries) {
    if (Equal(k, key)) return &v;
  }
  return nullptr;
}

const Value* DictObject::FindString(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k.kind == Kind::kString && *k.str == key) return &v;
  }
  return nullptr;
}

void DictObject::Recompute() {
  for (const auto& [k, v] : entries) {
    depth = std::max(depth, std::max(DepthOf(k), DepthOf(v)) + 1);
    holds_ns |= HoldsNamespace(k) || HoldsNamespace(v);
  }
}

void DictObject::Set(const Value& key, Value value) {
  depth = std::max(depth, std::max(DepthOf(key), DepthOf(value)) + 1);
  holds_ns |= HoldsNamespace(key) || HoldsNamespace(value);
  for (auto& [k, v] : entries) {
    if (Equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(key, std::move(value));
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.flag;
    case Kind::kInt:
      return v.i != 0;
    case Kind::kFloat:
      return v.f != 0;
    case Kind::kString:
      return !v.str->empty();
    case Kind::kList:
      return v.generator || !v.items().empty();
    case Kind::kDict:
      return !v.entries().empty();
    default:
      return true;
  }
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int_like() && b.is_int_like()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.str == b.str || *a.str == *b.str;
    case Kind::kList: {
      if (a.generator || b.generator) return a.obj == b.obj;
      if (a.tuple != b.tuple) return false;
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equal(x[i], y[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const auto& x = a.entries();
      if (x.size() != b.entries().size()) return false;
      const DictObject* other = AsDict(b);
      for (const auto& [k, v] : x) {
        const Value* w = other->Find(k);
        if (w == nullptr || !Equal(v, *w)) return false;
      }
      return true;
    }
    default:
      return a.obj == b.obj;
  }
}

absl::StatusOr<bool> Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int_like() && b.is_int_like()) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return *a.str < *b.str;  // UTF-8 order is code point order
  if (a.is_list() && b.is_list() && a.tuple == b.tuple && !a.generator && !b.generator) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equal(x[i], y[i])) continue;
      return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined() || b.is_undefined()) {
    return absl::InvalidArgumentError(a.is_undefined() ? a.undefined_message()
                                                       : b.undefined_message());
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 TypeName(a), "' and '", TypeName(b), "'"));
}

std::string TypeName(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return v.generator ? "generator" : v.tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return "function";
    case Kind::kLoop:
      return "LoopContext";
  }
  return "object";
}

std::string TypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  return TypeName(v) + " object";
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, result.ptr);
  std::string out;
  if (sci[0] == '-') {
    out = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string int_part = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (static_cast<int>(int_part.size()) < exp + 1) int_part += '0';
      std::string frac =
          digits.size() > static_cast<size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
      out += int_part + "." + frac;
    } else {
      out += "0." + std::string(-exp - 1, '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + ebuf;
}

namespace {

bool IsPrintable(char32_t c) {
  if (c < 0x20 || c == 0x7f) return false;
  if (c < 0x7f) return true;
  if (c >= 0x110000) return false;
  if (c <= 0xa0 || c == 0xad) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
      (c >= 0x205f && c <= 0x206f) || c == 0x3000 || c == 0xfeff || (c >= 0xfff9 && c <= 0xfffb) ||
      c == 0xfffe || c == 0xffff) {
    return false;
  }
  if ((c >= 0x600 && c <= 0x605) || c == 0x61c || c == 0x6dd || c == 0x70f || c == 0x180e) {
    return false;
  }
  if ((c >= 0xd800 && c <= 0xf8ff) || c >= 0xf0000 || (c >= 0xe0000 && c <= 0xe007f)) return false;
  return true;
}

void AppendHex(const char* prefix, uint32_t value, int width, std::string* out) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%s%0*x", prefix, width, value);
  *out += buf;
}

void AppendStringRepr(const std::string& s, std::string* out) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out->push_back(quote);
  for (char32_t c : Decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c == '\t') {
      *out += "\\t";
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (IsPrintable(c)) {
      AppendCodePoint(c, out);
    } else if (c >= 0x110000) {
      AppendHex("\\udc", c - 0x110000, 2, out);  // surrogateescape
    } else if (c < 0x100) {
      AppendHex("\\x", c, 2, out);
    } else if (c < 0x10000) {
      AppendHex("\\u", c, 4, out);
    } else {
      AppendHex("\\U", c, 8, out);
    }
  }
  out->push_back(quote);
}

void AppendRepr(const Value& v, std::string* out) {
  switch (v.kind) {
    case Kind::kUndefined:
      *out += "Undefined";
      return;
    case Kind::kString:
      AppendStringRepr(*v.str, out);
      return;
    case Kind::kList: {
      if (v.generator) {
        *out += "<generator object>";
        return;
      }
      if (const std::string& r = static_cast<const ListObject*>(v.obj.get())->repr; !r.empty()) {
        *out += r;
        return;
      }
      out->push_back(v.tuple ? '(' : '[');
      const auto& items = v.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += ", ";
        AppendRepr(items[i], out);
      }
      if (v.tuple && items.size() == 1) out->push_back(',');
      out->push_back(v.tuple ? ')' : ']');
      return;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      if (v.kind == Kind::kNamespace) *out += "<Namespace ";
      out->push_back('{');
      bool first = true;
      for (const auto& [k, val] : v.entries()) {
        if (!first) *out += ", ";
        first = false;
        AppendRepr(k, out);
        *out += ": ";
        AppendRepr(val, out);
      }
      out->push_back('}');
      if (v.kind == Kind::kNamespace) out->push_back('>');
      return;
    }
    default:
      AppendStr(v, out);
  }
}

}  // namespace

void AppendStr(const Value& v, std::string* out) {
  switch (v.kind) {
    case Kind::kUndefined:
      return;
    case Kind::kNone:
      *out += "None";
      return;
    case Kind::kBool:
      *out += v.flag ? "True" : "False";
      return;
    case Kind::kInt:
      *out += std::to_string(v.i);
      return;
    case Kind::kFloat:
      *out += FloatRepr(v.f);
      return;
    case Kind::kString:
      *out += *v.str;
      return;
    case Kind::kFunction:
      *out += v.str != nullptr ? *v.str : "<function>";
      return;
    case Kind::kLoop:
      *out += "<LoopContext>";
      return;
    default:
      AppendRepr(v, out);
  }
}

std::string Str(const Value& v) {
  if (v.is_string()) return *v.str;
  std::string out;
  AppendStr(v, &out);
  return out;
}

std::string Repr(const Value& v) {
  std::string out;
  AppendRepr(v, &out);
  return out;
}

namespace {

void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (char32_t c : Decode(s)) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
          AppendHex("\\u", c, 4, out);
        } else if (ensure_ascii && c >= 0x80 && c < 0x110000) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            AppendHex("\\u", 0xd800 + (v >> 10), 4, out);
            AppendHex("\\u", 0xdc00 + (v & 0x3ff), 4, out);
          } else {
            AppendHex("\\u", c, 4, out);
          }
        } else {
          AppendCodePoint(c, out);
        }
    }
  }
  out->push_back('"');
}

std::string JsonFloat(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return FloatRepr(d);
}

absl::Status Dump(const Value& v, const JsonOptions& o, int level, std::string* out) {
  if (level > 512) return absl::InvalidArgumentError("tojson: value nested too deeply");
  if (out->size() > o.max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("template output exceeds max_output_bytes (", o.max_bytes, ")"));
  }
  auto newline = [&](int lvl) {
    out->push_back('\n');
    for (int i = 0; i < lvl; ++i) *out += o.indent;
  };
  switch (v.kind) {
    case Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Kind::kBool:
      *out += v.flag ? "true" : "false";
      return absl::OkStatus();
    case Kind::kInt:
      *out += std::to_string(v.i);
      return absl::OkStatus();
    case Kind::kFloat:
      *out += JsonFloat(v.f);
      return absl::OkStatus();
    case Kind::kString:
      JsonString(*v.str, o.ensure_ascii, out);
      return absl::OkStatus();
    case Kind::kList: {
      if (v.generator) {
        return absl::InvalidArgumentError("Object of type generator is not JSON serializable");
      }
      if (!static_cast<const ListObject*>(v.obj.get())->repr.empty()) {
        return absl::InvalidArgumentError("Object of type range is not JSON serializable");
      }
      const auto& items = v.items();
      if (items.empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += o.item_separator;
        if (o.has_indent) newline(level + 1);
        if (absl::Status s = Dump(items[i], o, level + 1, out); !s.ok()) return s;
      }
      if (o.has_indent) newline(level);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Kind::kDict: {
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, val] : v.entries()) {
        std::string key;
        switch (k.kind) {
          case Kind::kString:
            key = *k.str;
            break;
          case Kind::kInt:
            key = std::to_string(k.i);
            break;
          case Kind::kBool:
            key = k.flag ? "true" : "false";
            break;
          case Kind::kNone:
            key = "null";
            break;
          case Kind::kFloat:
            key = JsonFloat(k.f);
            break;
          default:
            return absl::InvalidArgumentError(
                absl::StrCat("keys must be str, int, float, bool or None, not ", TypeName(k)));
        }
        entries.emplace_back(std::move(key), &val);
      }
      if (entries.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) *out += o.item_separator;
        if (o.has_indent) newline(level + 1);
        JsonString(entries[i].first, o.ensure_ascii, out);
        *out += o.key_separator;
        if (absl::Status s = Dump(*entries[i].second, o, level + 1, out); !s.ok()) return s;
      }
      if (o.has_indent) newline(level);
      out->push_back('}');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Object of type ", TypeName(v), " is not JSON serializable"));
  }
}

}  // namespace

absl::Status JsonDumps(const Value& v, const JsonOptions& options, std::string* out) {
  return Dump(v, options, 0, out);
}

absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) {
    return absl::InvalidArgumentError("template context is nested too deeply");
  }
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        absl::StatusOr<Value> v = FromJson(e, depth + 1);
        if (!v.ok()) return v.status();
        items.push_back(*std::move(v));
      }
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<Value, Value>> entries;
      entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        absl::StatusOr<Value> v = FromJson(it.value(), depth + 1);
        if (!v.ok()) return v.status();
        entries.emplace_back(Value::String(it.key()), *std::move(v));
      }
      return Value::Dict(std::move(entries));
    }
    default:
      return Value::None();
  }
}

std::vector<char32_t> Decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int len = 0;
    char32_t cp = 0;
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    }
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const unsigned char d = s[i + k];
      if ((d & 0xc0) != 0x80) {
        ok = false;
      } else {
        cp = (cp << 6) | (d & 0x3f);
      }
    }
    if (ok) {
      // Overlong forms, surrogates and values past U+10FFFF are invalid.
      static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) ok = false;
    }
    if (!ok) {
      out.push_back(0x110000 + c);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void AppendCodePoint(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else if (c < 0x110000) {
    out->push_back(static_cast<char>(0xf0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else {
    out->push_back(static_cast<char>(c - 0x110000));
  }
}

std::string Encode(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) AppendCodePoint(c, &out);
  return out;
}

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

size_t CodePointCount(std::string_view s) {
  if (IsAscii(s)) return s.size();
  return Decode(s).size();
}

bool IsPySpace(char32_t c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f) || c == 0x85 ||
         c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

char32_t PyLower(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 32;
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}

char32_t PyUpper(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c >= 0xe0 && c <= 0xfe && c != 0xf7) return c - 32;
  if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) return c - 32;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}

bool IsPyAlpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return (c >= 0xc0 && c <= 0x24f && c != 0xd7 && c != 0xf7) || c == 0xaa || c == 0xb5 ||
         c == 0xba || (c >= 0x370 && c <= 0x3ff && c != 0x37e && c != 0x387) ||
         (c >= 0x400 && c <= 0x52f && !(c >= 0x482 && c <= 0x489)) || (c >= 0x5d0 && c <= 0x5ea) ||
         (c >= 0x620 && c <= 0x64a) || (c >= 0x3041 && c <= 0x3096) ||
         (c >= 0x30a1 && c <= 0x30fa) || (c >= 0x3400 && c <= 0x4dbf) ||
         (c >= 0x4e00 && c <= 0x9fff) || (c >= 0xac00 && c <= 0xd7a3);
}

bool IsPyDigit(char32_t c) { return c >= '0' && c <= '9'; }

}  // namespace tandem::chat::internal
