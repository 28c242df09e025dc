#include "common/model/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// .npy files exactly as numpy wrote them (octal escapes; the header is readable text).
// Generated once with numpy 1.24.2 (np.save into an io.BytesIO).
// np.save(f, (np.arange(6, dtype='<f4') * 0.5 - 1).reshape(2, 3))
constexpr char kF4x2x3[] =
    "\223NUMPY\001\000v\000{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), "
    "}                                                          \012\000\000\200\277\000"
    "\000\000\277\000\000\000\000\000\000\000\077\000\000\200\077\000\000\300\077";

// np.save(f, np.array([[-3, 7], [1 << 40, 5]], dtype='<i8'))
constexpr char kI8x2x2[] =
    "\223NUMPY\001\000v\000{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2), "
    "}                                                          \012\375\377\377\377\377"
    "\377\377\377\007\000\000\000\000\000\000\000\000\000\000\000\000\001\000\000\005"
    "\000\000\000\000\000\000\000";

// np.save(f, np.array(2.5, dtype='<f8'))
constexpr char kF8Scalar[] =
    "\223NUMPY\001\000v\000{'descr': '<f8', 'fortran_order': False, 'shape': (), }   "
    "                                                           \012\000\000\000\000\000"
    "\000\004@";

// np.lib.format.write_array(f, np.array([1, -2, 2**31 - 1], dtype='<i4'), version=(2, 0))
constexpr char kI4V2[] =
    "\223NUMPY\002\000t\000\000\000{'descr': '<i4', 'fortran_order': False, 'shape': "
    "(3,), }                                                          \012\001\000\000"
    "\000\376\377\377\377\377\377\377\177";

// np.save(f, np.zeros((0, 4), dtype='<f4'))
constexpr char kF4Empty[] =
    "\223NUMPY\001\000v\000{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), "
    "}                                                          \012";

// np.save(f, np.asfortranarray(np.arange(6, dtype='<f4').reshape(2, 3)))
constexpr char kF4Fortran[] =
    "\223NUMPY\001\000v\000{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }"
    "                                                           \012\000\000\000\000\000"
    "\000@@\000\000\200\077\000\000\200@\000\000\000@\000\000\240@";

// np.save(f, np.arange(3, dtype='>f4'))
constexpr char kF4BigEndian[] =
    "\223NUMPY\001\000v\000{'descr': '>f4', 'fortran_order': False, 'shape': (3,), } "
    "                                                           \012\000\000\000\000\077"
    "\200\000\000@\000\000\000";

// np.save(f, np.arange(3, dtype='<f2'))
constexpr char kF2[] =
    "\223NUMPY\001\000v\000{'descr': '<f2', 'fortran_order': False, 'shape': (3,), } "
    "                                                           \012\000\000\000<\000"
    "@";

template <size_t N>
std::string_view Bytes(const char (&literal)[N]) {
  return std::string_view(literal, N - 1);  // drop the literal's terminating NUL
}

void ExpectInvalid(std::string_view bytes, std::string_view needle) {
  absl::StatusOr<NpyArray> a = ParseNpy(bytes);
  ASSERT_FALSE(a.ok()) << "expected an error containing: " << needle;
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_THAT(std::string(a.status().message()), HasSubstr(std::string(needle)));
}

std::string TempPath(std::string_view name) {
  static std::random_device rd;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tandem_npy_test_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

TEST(NpyTest, ReadsNumpyFloat32) {
  absl::StatusOr<NpyArray> a = ParseNpy(Bytes(kF4x2x3));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, "<f4");
  EXPECT_THAT(a->shape, ElementsAre(2, 3));
  EXPECT_EQ(a->num_elements(), 6);
  absl::StatusOr<std::vector<float>> v = a->AsFloat32();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(*v, ElementsAre(-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f));
  absl::StatusOr<std::vector<double>> d = a->AsFloat64();
  ASSERT_TRUE(d.ok());
  EXPECT_THAT(*d, ElementsAre(-1.0, -0.5, 0.0, 0.5, 1.0, 1.5));
}

TEST(NpyTest, ReadsNumpyInt64) {
  absl::StatusOr<NpyArray> a = ParseNpy(Bytes(kI8x2x2));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, "<i8");
  EXPECT_THAT(a->shape, ElementsAre(2, 2));
  absl::StatusOr<std::vector<int64_t>> v = a->AsInt64();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(*v, ElementsAre(-3, 7, int64_t{1} << 40, 5));
  // 2^40 does not fit in int32.
  absl::StatusOr<std::vector<int32_t>> narrow = a->AsInt32();
  ASSERT_FALSE(narrow.ok());
  EXPECT_THAT(std::string(narrow.status().message()), HasSubstr("out of range"));
  absl::StatusOr<std::vector<float>> f = a->AsFloat32();
  ASSERT_TRUE(f.ok());
  EXPECT_THAT(*f, ElementsAre(-3.0f, 7.0f, 1099511627776.0f, 5.0f));
}

TEST(NpyTest, ReadsNumpyScalar) {
  absl::StatusOr<NpyArray> a = ParseNpy(Bytes(kF8Scalar));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->shape.empty());
  EXPECT_EQ(a->num_elements(), 1);
  absl::StatusOr<std::vector<double>> v = a->AsFloat64();
  ASSERT_TRUE(v.ok());
  EXPECT_THAT(*v, ElementsAre(2.5));
  EXPECT_FALSE(a->AsInt64().ok());  // 2.5 is not an integer
}

TEST(NpyTest, ReadsNumpyVersion2) {
  absl::StatusOr<NpyArray> a = ParseNpy(Bytes(kI4V2));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->shape, ElementsAre(3));
  absl::StatusOr<std::vector<int32_t>> v = a->AsInt32();
  ASSERT_TRUE(v.ok());
  EXPECT_THAT(*v, ElementsAre(1, -2, 2147483647));
  absl::StatusOr<std::vector<int64_t>> wide = a->AsInt64();
  ASSERT_TRUE(wide.ok());
  EXPECT_THAT(*wide, ElementsAre(1, -2, 2147483647));
}

TEST(NpyTest, ReadsNumpyEmptyArray) {
  absl::StatusOr<NpyArray> a = ParseNpy(Bytes(kF4Empty));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->shape, ElementsAre(0, 4));
  EXPECT_EQ(a->num_elements(), 0);
  EXPECT_TRUE(a->data.empty());
}

TEST(NpyTest, FloatToIntegerConversionIsExactOnly) {
  absl::StatusOr<NpyArray> a = MakeNpy({3}, std::vector<float>{1.0f, -4.0f, 3e9f});
  ASSERT_TRUE(a.ok());
  absl::StatusOr<std::vector<int64_t>> wide = a->AsInt64();
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_THAT(*wide, ElementsAre(1, -4, 3000000000));
  absl::StatusOr<std::vector<int32_t>> narrow = a->AsInt32();  // 3e9 > INT32_MAX
  ASSERT_FALSE(narrow.ok());
  EXPECT_THAT(std::string(narrow.status().message()), HasSubstr("element 2"));
  absl::StatusOr<NpyArray> nan = MakeNpy({1}, std::vector<double>{std::nan("")});
  ASSERT_TRUE(nan.ok());
  EXPECT_FALSE(nan->AsInt64().ok());
}

// The writer reproduces numpy's bytes exactly, so golden files round-trip byte for byte.
TEST(NpyTest, SerializeMatchesNumpyBytes) {
  for (std::string_view bytes :
       {Bytes(kF4x2x3), Bytes(kI8x2x2), Bytes(kF8Scalar), Bytes(kF4Empty)}) {
    absl::StatusOr<NpyArray> a = ParseNpy(bytes);
    ASSERT_TRUE(a.ok()) << a.status();
    absl::StatusOr<std::string> out = SerializeNpy(*a);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, bytes) << "dtype " << a->dtype;
  }
}

TEST(NpyTest, FileRoundTripAllDtypes) {
  const std::vector<float> f32 = {1.5f, -2.25f, 3e-8f, 0.0f, 1e30f, -7.0f};
  const std::vector<double> f64 = {1e-300, -2.5, 3.0};
  const std::vector<int32_t> i32 = {INT32_MIN, -1, 0, INT32_MAX};
  const std::vector<int64_t> i64 = {INT64_MIN, 42, INT64_MAX};
  const std::string path = TempPath("round_trip.npy");

  absl::StatusOr<NpyArray> a = MakeNpy({2, 3}, f32);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(WriteNpy(path, *a).ok());
  absl::StatusOr<NpyArray> back = ReadNpy(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dtype, "<f4");
  EXPECT_THAT(back->shape, ElementsAre(2, 3));
  EXPECT_EQ(*back->AsFloat32(), f32);

  a = MakeNpy({3}, f64);
  ASSERT_TRUE(a.ok() && WriteNpy(path, *a).ok());
  back = ReadNpy(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back->AsFloat64(), f64);

  a = MakeNpy({2, 1, 2}, i32);
  ASSERT_TRUE(a.ok() && WriteNpy(path, *a).ok());
  back = ReadNpy(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_THAT(back->shape, ElementsAre(2, 1, 2));
  EXPECT_EQ(*back->AsInt32(), i32);

  a = MakeNpy({3}, i64);
  ASSERT_TRUE(a.ok() && WriteNpy(path, *a).ok());
  back = ReadNpy(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back->AsInt64(), i64);

  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

TEST(NpyTest, MakeNpyChecksShape) {
  EXPECT_FALSE(MakeNpy({2, 2}, std::vector<float>{1, 2, 3}).ok());
  EXPECT_FALSE(MakeNpy({-1}, std::vector<float>{}).ok());
  EXPECT_TRUE(MakeNpy({}, std::vector<float>{7}).ok());  // scalar
}

TEST(NpyTest, MissingFileIsNotFound) {
  absl::StatusOr<NpyArray> a = ReadNpy("/nonexistent/tandem/golden.npy");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
}

TEST(NpyTest, RejectsUnsupportedLayoutsAndTypes) {
  ExpectInvalid(Bytes(kF4Fortran), "fortran_order");
  ExpectInvalid(Bytes(kF4BigEndian), "big-endian");
  ExpectInvalid(Bytes(kF2), "unsupported dtype '<f2'");
}

// Rebuilds a v1.0 file around an arbitrary header text and data.
std::string WithHeader(std::string_view header, std::string_view data = "") {
  std::string out("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.append(reinterpret_cast<const char*>(&len), 2);
  out.append(header);
  out.append(data);
  return out;
}

TEST(NpyTest, RejectsMalformedFiles) {
  const std::string_view good = Bytes(kF4x2x3);
  ExpectInvalid("", "bad magic");
  ExpectInvalid("\x93NUMPX\x01\x00", "bad magic");
  ExpectInvalid(std::string("\x93NUMPY\x04\x00\x10\x00", 10), "version 4.0");
  ExpectInvalid(good.substr(0, 9), "truncated");
  ExpectInvalid(good.substr(0, 60), "exceeds the file");
  ExpectInvalid(good.substr(0, good.size() - 1), "truncated");
  ExpectInvalid(std::string(good) + "x", "data is 25 bytes");

  const std::string data(24, '\0');
  ExpectInvalid(WithHeader("{'descr': '<f4', 'shape': (2, 3), }\n", data), "keys");
  ExpectInvalid(WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), "
                           "'extra': 1}\n",
                           data),
                "unexpected header key 'extra'");
  ExpectInvalid(WithHeader("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
                           "'shape': (2, 3)}\n",
                           data),
                "duplicate header key");
  ExpectInvalid(WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }\n", data),
                "negative dimension");
  ExpectInvalid(WithHeader("{'descr': '<f4', 'fortran_order': false, 'shape': (2, 3), }\n", data),
                "True or False");
  ExpectInvalid(WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }\n", data),
                "tuple");
  ExpectInvalid(WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3) \n", data),
                "expected ',' or '}'");
  ExpectInvalid(WithHeader("{'descr: '<f4', 'fortran_order': False, 'shape': (2, 3) }\n", data),
                "npy:");
  ExpectInvalid(WithHeader("{'descr': '<f4', 'fortran_order': False, "
                           "'shape': (99999999999999999999,), }\n"),
                "out of range");
  ExpectInvalid(WithHeader("{'descr': '<f4', 'fortran_order': False, "
                           "'shape': (4294967296, 4294967296, 4294967296), }\n"),
                "overflows");
  // 2^40 x 2^23 x 0 holds no elements, but num_elements() would overflow int64 on the way
  // (UBSan, npy fuzzer; tests/fuzz/corpus/npy/regression-partial-product-overflow.npy).
  ExpectInvalid(WithHeader("{'descr': '<f4', 'fortran_order': False, "
                           "'shape': (1099511627776, 8388608, 0), }\n"),
                "overflows");
  // Python 2 style long suffixes and double quotes are accepted.
  absl::StatusOr<NpyArray> py2 = ParseNpy(
      WithHeader("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2L, 3L)}", data));
  EXPECT_TRUE(py2.ok()) << py2.status();
}

// Random corruptions of valid files must produce errors or arrays, never crashes.
TEST(NpyTest, FuzzedFilesNeverCrash) {
  std::mt19937 rng(1234);
  const std::vector<std::string_view> seeds = {Bytes(kF4x2x3), Bytes(kI8x2x2), Bytes(kI4V2),
                                               Bytes(kF8Scalar)};
  int parsed = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes(seeds[iter % seeds.size()]);
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations && !bytes.empty(); ++m) {
      const size_t pos = rng() % bytes.size();
      switch (rng() % 4) {
        case 0:
          bytes[pos] = static_cast<char>(rng());
          break;
        case 1:
          bytes[pos] ^= static_cast<char>(1u << (rng() % 8));
          break;
        case 2:
          bytes.resize(pos);
          break;
        case 3:
          bytes.insert(pos, 1, static_cast<char>(rng()));
          break;
      }
    }
    absl::StatusOr<NpyArray> a = ParseNpy(bytes);
    if (a.ok()) {
      ++parsed;
      (void)a->AsFloat64();
      (void)a->AsInt64();
    }
  }
  // Some mutations only touch data or header padding, so some files still parse.
  EXPECT_GT(parsed, 0);
}

}  // namespace
}  // namespace tandem::model
