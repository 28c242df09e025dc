#include "common/model/npy.h"

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status.h"

namespace tandem::model {
namespace {

static_assert(std::endian::native == std::endian::little,
              "NpyArray holds little-endian data; big-endian hosts are not supported");

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kMaxHeaderBytes = 1 << 20;  // numpy itself refuses far smaller headers
constexpr size_t kAlign = 64;                // numpy's ARRAY_ALIGN
constexpr size_t kGrowthAxisMaxDigits = 21;  // numpy's spare space for growing axis 0

absl::Status NpyError(absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("npy: ", problem));
}

// Element size of a supported descr, or 0.
size_t ItemSize(absl::string_view descr) {
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f8" || descr == "<i8") return 8;
  return 0;
}

absl::Status CheckDescr(absl::string_view descr) {
  if (ItemSize(descr) != 0) return absl::OkStatus();
  if (!descr.empty() && descr.front() == '>') {
    return NpyError(absl::StrCat("big-endian dtype '", descr, "' is not supported"));
  }
  return NpyError(absl::StrCat("unsupported dtype '", descr, "' (supported: <f4, <f8, <i4, <i8)"));
}

// product(shape) with overflow and sign checks. Every partial product must fit in int64_t,
// as NpyArray::num_elements() computes them: a zero after huge dimensions does not excuse them.
absl::StatusOr<uint64_t> CountElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return NpyError(absl::StrCat("negative dimension ", d, " in shape"));
    if (__builtin_mul_overflow(n, d, &n)) return NpyError("shape overflows the element count");
  }
  return static_cast<uint64_t>(n);
}

std::string ShapeRepr(const std::vector<int64_t>& shape) {  // Python's repr of a tuple
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Parses the header: a Python dict literal with exactly the keys 'descr', 'fortran_order'
// and 'shape', as np.save writes it (any whitespace, trailing commas, either quote style).
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  absl::StatusOr<Header> Parse() {
    Header header;
    bool have_descr = false, have_order = false, have_shape = false;
    SkipSpace();
    if (!Consume('{')) return Error("header must start with '{'");
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      ASSIGN_OR_RETURN(std::string key, ParseString());
      SkipSpace();
      if (!Consume(':')) return Error(absl::StrCat("expected ':' after key '", key, "'"));
      SkipSpace();
      bool* seen;
      if (key == "descr") {
        seen = &have_descr;
        ASSIGN_OR_RETURN(header.descr, ParseString());
      } else if (key == "fortran_order") {
        seen = &have_order;
        ASSIGN_OR_RETURN(header.fortran_order, ParseBool());
      } else if (key == "shape") {
        seen = &have_shape;
        ASSIGN_OR_RETURN(header.shape, ParseShape());
      } else {
        return Error(absl::StrCat("unexpected header key '", key, "'"));
      }
      if (*seen) return Error(absl::StrCat("duplicate header key '", key, "'"));
      *seen = true;
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume('}')) break;
      return Error("expected ',' or '}' in header");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("trailing characters after the header dict");
    if (!have_descr || !have_order || !have_shape) {
      return Error("header must have the keys 'descr', 'fortran_order' and 'shape'");
    }
    return header;
  }

 private:
  absl::Status Error(absl::string_view problem) const {
    return NpyError(absl::StrCat(problem, " (at header offset ", pos_, ")"));
  }
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(std::string_view word) {
    if (text_.substr(pos_, word.size()) == word) {
      pos_ += word.size();
      return true;
    }
    return false;
  }
  absl::StatusOr<std::string> ParseString() {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Error("expected a quoted string");
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) return Error("unterminated string");
    std::string value(text_.substr(pos_, end - pos_));
    if (value.find('\\') != std::string::npos) return Error("escapes in strings are not supported");
    pos_ = end + 1;
    return value;
  }
  absl::StatusOr<bool> ParseBool() {
    if (ConsumeWord("True")) return true;
    if (ConsumeWord("False")) return false;
    return Error("expected True or False");
  }
  absl::StatusOr<int64_t> ParseInt() {
    const bool negative = Consume('-');
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') {
      return Error("expected an integer");
    }
    int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (__builtin_mul_overflow(value, 10, &value) ||
          __builtin_add_overflow(value, text_[pos_] - '0', &value)) {
        return Error("integer out of range");
      }
      ++pos_;
    }
    Consume('L');  // Python 2 long suffix
    if (negative) return Error(absl::StrCat("negative dimension -", value, " in shape"));
    return value;
  }
  absl::StatusOr<std::vector<int64_t>> ParseShape() {
    if (!Consume('(')) return Error("shape must be a tuple");
    std::vector<int64_t> shape;
    while (true) {
      SkipSpace();
      if (Consume(')')) break;
      ASSIGN_OR_RETURN(int64_t dim, ParseInt());
      shape.push_back(dim);
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume(')')) break;
      return Error("expected ',' or ')' in shape");
    }
    return shape;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

template <typename T>
T LoadLE(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename To, typename From>
absl::StatusOr<To> ConvertOne(From v, int64_t index) {
  if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(v);
  } else if constexpr (std::is_integral_v<From>) {
    if (!std::in_range<To>(v)) {
      return NpyError(absl::StrCat("element ", index, " (", v, ") is out of range"));
    }
    return static_cast<To>(v);
  } else {
    // Float to integer: exact values only. 2^(bits-1) is exactly representable as a double.
    const double d = static_cast<double>(v);
    const double limit = std::ldexp(1.0, std::numeric_limits<To>::digits);
    if (!std::isfinite(d) || std::trunc(d) != d || d < -limit || d >= limit) {
      return NpyError(absl::StrCat("element ", index, " (", d, ") is not an integer in range"));
    }
    return static_cast<To>(d);
  }
}

template <typename To, typename From>
absl::StatusOr<std::vector<To>> ConvertAll(const NpyArray& a) {
  const int64_t n = a.num_elements();
  if (static_cast<uint64_t>(n) * sizeof(From) != a.data.size()) {
    return NpyError(absl::StrCat("array holds ", a.data.size(), " bytes, its shape needs ",
                                 static_cast<uint64_t>(n) * sizeof(From)));
  }
  std::vector<To> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(To v,
                     (ConvertOne<To, From>(LoadLE<From>(a.data.data() + i * sizeof(From)), i)));
    out.push_back(v);
  }
  return out;
}

template <typename To>
absl::StatusOr<std::vector<To>> Convert(const NpyArray& a) {
  if (a.dtype == "<f4") return ConvertAll<To, float>(a);
  if (a.dtype == "<f8") return ConvertAll<To, double>(a);
  if (a.dtype == "<i4") return ConvertAll<To, int32_t>(a);
  if (a.dtype == "<i8") return ConvertAll<To, int64_t>(a);
  return CheckDescr(a.dtype);
}

template <typename T>
absl::StatusOr<NpyArray> MakeTyped(std::string_view descr, std::vector<int64_t> shape,
                                   absl::Span<const T> values) {
  ASSIGN_OR_RETURN(uint64_t n, CountElements(shape));
  if (n != values.size()) {
    return NpyError(
        absl::StrCat("shape ", ShapeRepr(shape), " holds ", n, " elements, got ", values.size()));
  }
  NpyArray a;
  a.dtype = std::string(descr);
  a.shape = std::move(shape);
  a.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(a.data.data(), values.data(), a.data.size());
  return a;
}

}  // namespace

int64_t NpyArray::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::vector<float>> NpyArray::AsFloat32() const { return Convert<float>(*this); }
absl::StatusOr<std::vector<double>> NpyArray::AsFloat64() const { return Convert<double>(*this); }
absl::StatusOr<std::vector<int32_t>> NpyArray::AsInt32() const { return Convert<int32_t>(*this); }
absl::StatusOr<std::vector<int64_t>> NpyArray::AsInt64() const { return Convert<int64_t>(*this); }

absl::StatusOr<NpyArray> MakeNpy(std::vector<int64_t> shape, absl::Span<const float> values) {
  return MakeTyped("<f4", std::move(shape), values);
}
absl::StatusOr<NpyArray> MakeNpy(std::vector<int64_t> shape, absl::Span<const double> values) {
  return MakeTyped("<f8", std::move(shape), values);
}
absl::StatusOr<NpyArray> MakeNpy(std::vector<int64_t> shape, absl::Span<const int32_t> values) {
  return MakeTyped("<i4", std::move(shape), values);
}
absl::StatusOr<NpyArray> MakeNpy(std::vector<int64_t> shape, absl::Span<const int64_t> values) {
  return MakeTyped("<i8", std::move(shape), values);
}

absl::StatusOr<NpyArray> ParseNpy(std::string_view bytes) {
  if (bytes.size() < kMagic.size() + 2 || bytes.substr(0, kMagic.size()) != kMagic) {
    return NpyError("not a .npy file (bad magic)");
  }
  const uint8_t major = static_cast<uint8_t>(bytes[6]);
  const uint8_t minor = static_cast<uint8_t>(bytes[7]);
  size_t len_bytes;
  if (major == 1 && minor == 0) {
    len_bytes = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    len_bytes = 4;
  } else {
    return NpyError(absl::StrCat("unsupported format version ", major, ".", minor));
  }
  const size_t prefix = kMagic.size() + 2 + len_bytes;
  if (bytes.size() < prefix) return NpyError("file truncated inside the header length");
  uint32_t header_len = 0;
  std::memcpy(&header_len, bytes.data() + 8, len_bytes);
  if (header_len > kMaxHeaderBytes) {
    return NpyError(absl::StrCat("header length ", header_len, " is absurd"));
  }
  if (bytes.size() - prefix < header_len) {
    return NpyError(absl::StrCat("header length ", header_len, " exceeds the file (", bytes.size(),
                                 " bytes); the file may be truncated"));
  }
  ASSIGN_OR_RETURN(Header header, HeaderParser(bytes.substr(prefix, header_len)).Parse());
  RETURN_IF_ERROR(CheckDescr(header.descr));
  if (header.fortran_order) {
    return NpyError("fortran_order arrays are not supported (save a C-contiguous array)");
  }
  ASSIGN_OR_RETURN(uint64_t n, CountElements(header.shape));
  const uint64_t item = ItemSize(header.descr);
  uint64_t data_bytes;
  if (__builtin_mul_overflow(n, item, &data_bytes)) {
    return NpyError("shape overflows the data size");
  }
  const uint64_t available = bytes.size() - prefix - header_len;
  if (available != data_bytes) {
    return NpyError(absl::StrCat("data is ", available, " bytes, but shape ",
                                 ShapeRepr(header.shape), " of ", header.descr, " needs ",
                                 data_bytes, available < data_bytes ? " (truncated)" : ""));
  }
  NpyArray a;
  a.dtype = std::move(header.descr);
  a.shape = std::move(header.shape);
  a.data.resize(data_bytes);
  if (data_bytes > 0) std::memcpy(a.data.data(), bytes.data() + prefix + header_len, data_bytes);
  return a;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("failed reading ", path));
  absl::StatusOr<NpyArray> array = ParseNpy(bytes.str());
  if (!array.ok()) {
    return absl::Status(array.status().code(), absl::StrCat(path, ": ", array.status().message()));
  }
  return array;
}

absl::StatusOr<std::string> SerializeNpy(const NpyArray& a) {
  RETURN_IF_ERROR(CheckDescr(a.dtype));
  ASSIGN_OR_RETURN(uint64_t n, CountElements(a.shape));
  if (n * ItemSize(a.dtype) != a.data.size()) {
    return NpyError(absl::StrCat("array holds ", a.data.size(), " bytes, shape ",
                                 ShapeRepr(a.shape), " of ", a.dtype, " needs ",
                                 n * ItemSize(a.dtype)));
  }
  // Byte-for-byte what numpy's format.write_array produces.
  std::string dict = absl::StrCat(
      "{'descr': '", a.dtype, "', 'fortran_order': False, 'shape': ", ShapeRepr(a.shape), ", }");
  if (!a.shape.empty()) {
    const size_t digits = absl::StrCat(a.shape[0]).size();
    if (digits < kGrowthAxisMaxDigits) dict.append(kGrowthAxisMaxDigits - digits, ' ');
  }
  std::string out;
  for (size_t len_bytes : {2, 4}) {
    const size_t hlen = dict.size() + 1;  // + '\n'
    const size_t pad = kAlign - (kMagic.size() + 2 + len_bytes + hlen) % kAlign;
    const size_t total = hlen + pad;
    if (len_bytes == 2 && total > 0xffff) continue;  // needs format 2.0
    out = std::string(kMagic);
    out.push_back(static_cast<char>(len_bytes == 2 ? 1 : 2));
    out.push_back('\0');
    const uint32_t total32 = static_cast<uint32_t>(total);
    out.append(reinterpret_cast<const char*>(&total32), len_bytes);
    out.append(dict);
    out.append(pad, ' ');
    out.push_back('\n');
    break;
  }
  out.append(reinterpret_cast<const char*>(a.data.data()), a.data.size());
  return out;
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  ASSIGN_OR_RETURN(std::string bytes, SerializeNpy(array));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("failed writing ", path));
  return absl::OkStatus();
}

}  // namespace tandem::model
