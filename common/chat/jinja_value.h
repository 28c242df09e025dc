// Values of the Jinja engine (internal to common/chat): Python's objects as jinja2 sees them.
// Containers are shared, immutable once built (the sandbox is immutable) except namespaces.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tandem::chat::internal {

// The installed Abseil's string_view is its own type, not std::string_view; absl::StrCat and
// friends need it.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

__extension__ typedef __int128 Int128;

enum class Kind {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kNamespace,
  kFunction,
  kLoop
};

struct Object {
  virtual ~Object() = default;
  int depth = 1;          // containers: 1 + the deepest container inside
  bool holds_ns = false;  // containers: a namespace is inside (or this is one)
};

// Values nest at most this deep (printing, comparing and freeing them recurse).
constexpr int kMaxValueDepth = 100;

struct Value {
  Kind kind = Kind::kUndefined;
  bool tuple = false;      // a kList that is a Python tuple
  bool generator = false;  // a kList that is a Python iterator (select, map, ...): always true,
                           // no len(), not subscriptable
  bool flag = false;       // kBool's value
  int64_t i = 0;
  double f = 0;
  // kString: the text; kUndefined: the message jinja2 raises when it is used (may be null).
  std::shared_ptr<const std::string> str;
  std::shared_ptr<Object> obj;  // kList, kDict, kNamespace, kFunction, kLoop

  static Value Undefined(std::string message) {
    Value v;
    v.str = std::make_shared<const std::string>(std::move(message));
    return v;
  }
  static Value None() {
    Value v;
    v.kind = Kind::kNone;
    return v;
  }
  static Value Bool(bool b) {
    Value v;
    v.kind = Kind::kBool;
    v.flag = b;
    return v;
  }
  static Value Int(int64_t i) {
    Value v;
    v.kind = Kind::kInt;
    v.i = i;
    return v;
  }
  static Value Float(double f) {
    Value v;
    v.kind = Kind::kFloat;
    v.f = f;
    return v;
  }
  static Value String(std::string s) {
    Value v;
    v.kind = Kind::kString;
    v.str = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  static Value List(std::vector<Value> items, bool tuple = false);
  static Value Generator(std::vector<Value> items);
  static Value FailedGenerator(absl::Status error);
  static Value Dict(std::vector<std::pair<Value, Value>> items);
  static Value Namespace(std::vector<std::pair<Value, Value>> items);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  bool is_int_like() const { return kind == Kind::kInt || kind == Kind::kBool; }
  bool is_number() const { return is_int_like() || kind == Kind::kFloat; }
  const std::string& s() const { return *str; }
  int64_t as_int() const { return kind == Kind::kBool ? (flag ? 1 : 0) : i; }
  double as_double() const { return kind == Kind::kFloat ? f : static_cast<double>(as_int()); }
  const std::vector<Value>& items() const;                      // kList
  const std::vector<std::pair<Value, Value>>& entries() const;  // kDict, kNamespace
  std::string undefined_message() const {
    return str != nullptr && !str->empty() ? *str : "value is undefined";
  }
};

struct ListObject : Object {
  std::vector<Value> items;
  absl::Status error;  // a generator's: raised when it is consumed
  std::string repr;    // what Python prints instead of a list (a range's "range(0, 3)")
};

struct DictObject : Object {
  std::vector<std::pair<Value, Value>> entries;
  const Value* Find(const Value& key) const;
  const Value* FindString(std::string_view key) const;
  void Set(const Value& key, Value value);
  void Recompute();  // depth and holds_ns from the entries
};

inline const std::vector<Value>& Value::items() const {
  return static_cast<const ListObject*>(obj.get())->items;
}
inline const std::vector<std::pair<Value, Value>>& Value::entries() const {
  return static_cast<const DictObject*>(obj.get())->entries;
}
inline DictObject* AsDict(const Value& v) { return static_cast<DictObject*>(v.obj.get()); }
inline int DepthOf(const Value& v) { return v.obj != nullptr ? v.obj->depth : 0; }
inline bool HoldsNamespace(const Value& v) { return v.obj != nullptr && v.obj->holds_ns; }

// Python's truthiness.
bool Truthy(const Value& v);
// Python's ==.
bool Equal(const Value& a, const Value& b);
// Python's <, or INVALID_ARGUMENT for types Python does not order.
absl::StatusOr<bool> Less(const Value& a, const Value& b);
// Python's str() and repr() (jinja2 prints str(); undefined prints as "").
std::string Str(const Value& v);
std::string Repr(const Value& v);
void AppendStr(const Value& v, std::string* out);
std::string FloatRepr(double d);
// jinja2's object_type_repr: "dict object", "None", "list object".
std::string TypeRepr(const Value& v);
std::string TypeName(const Value& v);  // Python's type(x).__name__

struct JsonOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  size_t max_bytes = SIZE_MAX;  // longer output is RESOURCE_EXHAUSTED
};
// Python's json.dumps; INVALID_ARGUMENT for values JSON cannot hold.
absl::Status JsonDumps(const Value& v, const JsonOptions& options, std::string* out);

// INVALID_ARGUMENT when nested deeper than kMaxValueDepth.
absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& j, int depth = 0);

// UTF-8 as Python's code points. Invalid bytes decode to 0x110000 + byte and encode back.
std::vector<char32_t> Decode(std::string_view s);
void AppendCodePoint(char32_t c, std::string* out);
std::string Encode(const std::vector<char32_t>& cps);
bool IsAscii(std::string_view s);
size_t CodePointCount(std::string_view s);
bool IsPySpace(char32_t c);
char32_t PyLower(char32_t c);
char32_t PyUpper(char32_t c);
bool IsPyAlpha(char32_t c);
bool IsPyDigit(char32_t c);

}  // namespace tandem::chat::internal
