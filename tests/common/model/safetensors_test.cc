#include "common/model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() /
           ("tandem_safetensors_test_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  std::string WriteBytes(const std::string& name, const std::string& bytes) const {
    const std::string path = Path(name);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return path;
  }

  // Opens raw bytes as a safetensors file and expects INVALID_ARGUMENT mentioning every needle.
  void ExpectInvalid(const std::string& bytes, const std::vector<std::string>& needles) {
    const std::string path = WriteBytes("bad.safetensors", bytes);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << "accepted a malformed file";
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
    for (const std::string& needle : needles) {
      EXPECT_THAT(std::string(file.status().message()), HasSubstr(needle));
    }
  }

  fs::path dir_;
};

// The raw file: 8-byte little-endian header length, header, data.
std::string RawFileBytes(const std::string& header, const std::string& data,
                         uint64_t header_len_override = UINT64_MAX) {
  const uint64_t n = header_len_override == UINT64_MAX ? header.size() : header_len_override;
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

std::string FileBytes(const Json& header, const std::string& data) {
  return RawFileBytes(header.dump(), data);
}

Json Entry(const std::string& dtype, const Json& shape, uint64_t begin, uint64_t end) {
  return Json{{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
}

// Owns bytes for a TensorView to point at.
struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;

  TensorView view() const { return TensorView{name, dtype, shape, bytes.data(), bytes.size()}; }
};

OwnedTensor Filled(std::string name, DType dtype, std::vector<int64_t> shape, uint8_t seed) {
  size_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  OwnedTensor t{std::move(name), dtype, std::move(shape), std::vector<std::byte>(n)};
  for (size_t i = 0; i < n; ++i) t.bytes[i] = static_cast<std::byte>(seed + i * 7);
  return t;
}

absl::Status Write(const std::string& path, const std::vector<OwnedTensor>& tensors,
                   const std::map<std::string, std::string>& metadata = {}) {
  std::vector<TensorView> views;
  for (const OwnedTensor& t : tensors) views.push_back(t.view());
  return WriteSafetensors(path, views, metadata);
}

TEST_F(SafetensorsTest, RoundTrip) {
  const std::vector<OwnedTensor> tensors = {
      Filled("b.weight", DType::kF32, {2, 3}, 1),  Filled("a.bias", DType::kBF16, {4}, 2),
      Filled("c.half", DType::kF16, {1, 2, 1}, 3), Filled("d.empty", DType::kF32, {0, 5}, 4),
      Filled("e.scalar", DType::kF32, {}, 5),      Filled("f.levels", DType::kI8, {3, 4}, 6),
      Filled("g.nibbles", DType::kU8, {3, 2}, 7),
  };
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(Write(path, tensors, {{"format", "pt"}}).ok());

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT((*file)->Names(), ElementsAre("a.bias", "b.weight", "c.half", "d.empty", "e.scalar",
                                            "f.levels", "g.nibbles"));
  EXPECT_EQ((*file)->num_tensors(), 7u);
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  for (const OwnedTensor& want : tensors) {
    absl::StatusOr<TensorView> got = (*file)->Get(want.name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->name, want.name);
    EXPECT_EQ(got->dtype, want.dtype);
    EXPECT_EQ(got->shape, want.shape);
    ASSERT_EQ(got->size_bytes, want.bytes.size());
    EXPECT_TRUE(std::equal(want.bytes.begin(), want.bytes.end(), got->data)) << want.name;
  }
  EXPECT_EQ((*file)->Get("b.weight")->num_elements(), 6);
  EXPECT_EQ((*file)->Get("e.scalar")->num_elements(), 1);

  // The header is padded to a multiple of 8 so that the data section is aligned.
  std::ifstream in(path, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ(header_len % 8, 0u);

  absl::StatusOr<TensorView> missing = (*file)->Get("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("nope"));
  EXPECT_FALSE((*file)->Contains("nope"));
  EXPECT_TRUE((*file)->Contains("a.bias"));
}

TEST_F(SafetensorsTest, ReadsHandWrittenFile) {
  // Two F32 tensors in reverse offset order, header with trailing space padding.
  const float a[2] = {1.5f, -2.0f};
  const float b[1] = {42.0f};
  std::string data(reinterpret_cast<const char*>(b), 4);
  data.append(reinterpret_cast<const char*>(a), 8);
  const Json header = {{"a", Entry("F32", {2}, 4, 12)}, {"b", Entry("F32", {1}, 0, 4)}};
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(WriteBytes("x.safetensors", RawFileBytes(header.dump() + "   ", data)));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<TensorView> t = (*file)->Get("a");
  ASSERT_TRUE(t.ok());
  float out[2];
  std::memcpy(out, t->data, 8);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_TRUE((*file)->metadata().empty());
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(Path("absent"));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, DirectoryIsInvalid) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(dir_.string());
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("not a regular file"));
}

TEST_F(SafetensorsTest, RejectsShortFiles) {
  ExpectInvalid("", {"0 bytes", "shorter than the 8-byte"});
  ExpectInvalid("12345", {"5 bytes", "shorter than the 8-byte"});
}

TEST_F(SafetensorsTest, RejectsBadHeaderLength) {
  const Json header = {{"w", Entry("F32", {1}, 0, 4)}};
  ExpectInvalid(RawFileBytes(header.dump(), "abcd", header.dump().size() + 100),
                {"header length", "larger than the file"});
  ExpectInvalid(RawFileBytes(header.dump(), "abcd", uint64_t{1} << 40),
                {"header length", "exceeds the limit"});
  ExpectInvalid(RawFileBytes(header.dump(), "abcd", UINT64_MAX - 1), {"exceeds the limit"});
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotAJsonObject) {
  ExpectInvalid(RawFileBytes("", ""), {"not a JSON object"});
  ExpectInvalid(RawFileBytes("[1, 2]", ""), {"not a JSON object"});
  ExpectInvalid(RawFileBytes("{\"w\": {\"dtype\": \"F32\",", ""), {"not valid JSON"});
  ExpectInvalid(RawFileBytes("{\"w\": 1} trailing", ""), {"not valid JSON"});
  ExpectInvalid(FileBytes(Json{{"w", 5}}, ""), {"tensor 'w'", "must be an object"});
}

TEST_F(SafetensorsTest, RejectsBadDtype) {
  ExpectInvalid(FileBytes(Json{{"w", Entry("F64", {1}, 0, 8)}}, std::string(8, '\0')),
                {"tensor 'w'", "unsupported dtype \"F64\""});
  ExpectInvalid(FileBytes(Json{{"w", Entry("Q4_K", {1}, 0, 8)}}, std::string(8, '\0')),
                {"tensor 'w'", "dtype"});
  Json no_dtype = {{"w", {{"shape", {1}}, {"data_offsets", {0, 4}}}}};
  ExpectInvalid(FileBytes(no_dtype, "abcd"), {"tensor 'w'", "dtype"});
}

TEST_F(SafetensorsTest, RejectsBadShape) {
  const std::string data(4, '\0');
  ExpectInvalid(FileBytes(Json{{"w", Entry("F32", {-1}, 0, 4)}}, data),
                {"tensor 'w'", "shape", "non-negative integers"});
  ExpectInvalid(FileBytes(Json{{"w", Entry("F32", {1.5}, 0, 4)}}, data), {"tensor 'w'", "shape"});
  ExpectInvalid(FileBytes(Json{{"w", Entry("F32", 1, 0, 4)}}, data), {"tensor 'w'", "shape"});
  ExpectInvalid(FileBytes(Json{{"w", Entry("F32", {"1"}, 0, 4)}}, data), {"tensor 'w'", "shape"});
  ExpectInvalid(
      FileBytes(Json{{"w", Entry("F32", {uint64_t{1} << 62, uint64_t{1} << 62}, 0, 4)}}, data),
      {"tensor 'w'", "overflows"});
  // No elements, but num_elements() would overflow int64 before reaching the zero (UBSan,
  // safetensors fuzzer; tests/fuzz/corpus/safetensors/regression-partial-product-overflow).
  ExpectInvalid(
      FileBytes(Json{{"w", Entry("F32", {uint64_t{1} << 40, uint64_t{1} << 23, 0}, 0, 0)}}, ""),
      {"tensor 'w'", "overflows"});
  ExpectInvalid(FileBytes(Json{{"w", Entry("BF16", {uint64_t{1} << 63}, 0, 4)}}, data),
                {"tensor 'w'", "shape"});
}

TEST_F(SafetensorsTest, RejectsBadDataOffsets) {
  const std::string data(8, '\0');
  Json three = {{"w", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4, 8}}}}};
  ExpectInvalid(FileBytes(three, data), {"tensor 'w'", "data_offsets"});
  Json missing = {{"w", {{"dtype", "F32"}, {"shape", {1}}}}};
  ExpectInvalid(FileBytes(missing, data), {"tensor 'w'", "data_offsets"});
  Json negative = {{"w", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {-4, 0}}}}};
  ExpectInvalid(FileBytes(negative, data), {"tensor 'w'", "data_offsets"});
  ExpectInvalid(FileBytes(Json{{"w", Entry("F32", {1}, 8, 4)}}, data),
                {"tensor 'w'", "begin 8 is after end 4"});
  ExpectInvalid(FileBytes(Json{{"w", Entry("F32", {3}, 0, 12)}}, data),
                {"tensor 'w'", "beyond the data section"});
  ExpectInvalid(FileBytes(Json{{"w", Entry("F32", {1}, 0, 8)}}, data),
                {"tensor 'w'", "byte size 8 does not match", "expected 4"});
}

TEST_F(SafetensorsTest, RejectsOverlapsGapsAndTrailingBytes) {
  const std::string data(8, '\0');
  ExpectInvalid(
      FileBytes(Json{{"a", Entry("F32", {1}, 0, 4)}, {"b", Entry("F16", {2}, 2, 6)}}, data),
      {"tensor 'b' overlaps tensor 'a'"});
  ExpectInvalid(FileBytes(Json{{"a", Entry("F32", {1}, 0, 4)},
                               {"b", Entry("F32", {1}, 0, 4)},
                               {"c", Entry("F32", {1}, 4, 8)}},
                          data),
                {"tensor 'b' overlaps tensor 'a'"});
  ExpectInvalid(
      FileBytes(Json{{"a", Entry("F16", {1}, 0, 2)}, {"b", Entry("F32", {1}, 4, 8)}}, data),
      {"tensor 'b'", "gap"});
  ExpectInvalid(FileBytes(Json{{"a", Entry("F32", {1}, 0, 4)}}, data),
                {"4 trailing bytes not covered"});
}

TEST_F(SafetensorsTest, RejectsDuplicateNames) {
  const std::string header = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                             R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  ExpectInvalid(RawFileBytes(header, std::string(8, '\0')), {"duplicate tensor name 'w'"});
  const std::string inner =
      R"({"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})";
  ExpectInvalid(RawFileBytes(inner, std::string(4, '\0')), {"duplicate key 'dtype'"});
}

TEST_F(SafetensorsTest, ValidatesMetadata) {
  const std::string data(4, '\0');
  Json ok = {{"__metadata__", {{"format", "pt"}}}, {"w", Entry("F32", {1}, 0, 4)}};
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(WriteBytes("m.safetensors", FileBytes(ok, data)));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT((*file)->Names(), ElementsAre("w"));  // __metadata__ is not a tensor

  ExpectInvalid(FileBytes(Json{{"__metadata__", {{"n", 1}}}, {"w", Entry("F32", {1}, 0, 4)}}, data),
                {"__metadata__", "'n'", "string"});
  ExpectInvalid(FileBytes(Json{{"__metadata__", "pt"}, {"w", Entry("F32", {1}, 0, 4)}}, data),
                {"__metadata__", "object"});
}

TEST_F(SafetensorsTest, RejectsTruncatedFiles) {
  const std::string path = Path("full.safetensors");
  ASSERT_TRUE(
      Write(path, {Filled("a", DType::kF32, {4, 4}, 1), Filled("b", DType::kBF16, {8}, 2)}).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ExpectInvalid(bytes.substr(0, bytes.size() - 1), {"beyond the data section", "truncated"});
  ExpectInvalid(bytes.substr(0, 20), {"larger than the file", "truncated"});
  ExpectInvalid(bytes.substr(0, 7), {"shorter than the 8-byte"});
}

// A few hundred random corruptions of a valid file: each opens cleanly or fails cleanly, and
// every tensor of a file that opens can be read end to end.
TEST_F(SafetensorsTest, FuzzedFilesNeverCrash) {
  const std::string valid_path = Path("valid.safetensors");
  ASSERT_TRUE(Write(valid_path,
                    {Filled("model.embed_tokens.weight", DType::kBF16, {8, 4}, 1),
                     Filled("model.norm.weight", DType::kF32, {4}, 2),
                     Filled("lm_head.weight", DType::kF16, {8, 4}, 3)},
                    {{"format", "pt"}})
                  .ok());
  std::ifstream in(valid_path, std::ios::binary);
  const std::string valid((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len;
  std::memcpy(&header_len, valid.data(), 8);

  std::mt19937 rng(20240601);
  int opened = 0;
  for (int iter = 0; iter < 600; ++iter) {
    std::string bytes = valid;
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations && !bytes.empty(); ++m) {
      // Aim most mutations at the header, where the parser's decisions are made.
      const size_t span = (rng() % 4 == 0) ? bytes.size() : std::min(bytes.size(), 8 + header_len);
      const size_t pos = rng() % span;
      switch (rng() % 6) {
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
          bytes.insert(pos, 1, static_cast<char>("0123456789[]{},:\"-. "[rng() % 20]));
          break;
        case 4:
          bytes.erase(pos, 1);
          break;
        case 5: {  // a digit in the header replaced by another, e.g. offsets and shapes
          const size_t digit = bytes.find_first_of("0123456789", 8 + rng() % (header_len + 1));
          if (digit < 8 + header_len) bytes[digit] = static_cast<char>('0' + rng() % 10);
          break;
        }
      }
    }
    const std::string path = WriteBytes("fuzz.safetensors", bytes);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      EXPECT_TRUE(file.status().code() == absl::StatusCode::kInvalidArgument) << file.status();
      continue;
    }
    ++opened;
    for (const std::string& name : (*file)->Names()) {
      absl::StatusOr<TensorView> t = (*file)->Get(name);
      ASSERT_TRUE(t.ok()) << t.status();
      unsigned sum = 0;
      for (size_t i = 0; i < t->size_bytes; ++i) sum += static_cast<unsigned>(t->data[i]);
      (void)sum;
    }
  }
  // Mutations of tensor data leave the file valid, so some must open.
  EXPECT_GT(opened, 0);

  // Pure garbage, of assorted sizes, with a plausible header length.
  for (int iter = 0; iter < 200; ++iter) {
    std::string bytes(rng() % 256, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    if (bytes.size() >= 8 && iter % 2 == 0) {
      const uint64_t n = rng() % (bytes.size() - 7);
      std::memcpy(bytes.data(), &n, 8);
      if (bytes.size() > 8) bytes[8] = '{';
    }
    const std::string path = WriteBytes("garbage.safetensors", bytes);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    EXPECT_FALSE(file.ok() && (*file)->num_tensors() > 0);
  }
}

TEST_F(SafetensorsTest, WriterRejectsInconsistentTensors) {
  OwnedTensor t = Filled("w", DType::kF32, {2, 2}, 0);
  t.bytes.pop_back();
  absl::Status status = Write(Path("w.safetensors"), {t});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("'w'"));
  status = Write(Path("w.safetensors"),
                 {Filled("w", DType::kF32, {1}, 0), Filled("w", DType::kF32, {1}, 0)});
  EXPECT_THAT(std::string(status.message()), HasSubstr("duplicate"));
}

// ---------------------------------------------------------------------------------------------
// SafetensorsModel and ValidateAgainstConfig

ModelConfig TinyConfig() {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(R"({
      "model_type": "mixtral", "vocab_size": 32, "hidden_size": 8, "intermediate_size": 12,
      "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
      "num_local_experts": 3, "num_experts_per_tok": 2})");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::vector<OwnedTensor> TensorsFor(const ModelConfig& config) {
  std::vector<OwnedTensor> out;
  uint8_t seed = 0;
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    out.push_back(Filled(spec.name, DType::kBF16, spec.shape, seed++));
  }
  return out;
}

TEST_F(SafetensorsTest, ModelFromSingleFile) {
  const ModelConfig config = TinyConfig();
  const std::vector<OwnedTensor> tensors = TensorsFor(config);
  ASSERT_TRUE(Write(Path("model.safetensors"), tensors).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> model = SafetensorsModel::Open(dir_.string());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->num_shards(), 1u);
  EXPECT_EQ((*model)->Names().size(), tensors.size());
  EXPECT_TRUE(ValidateAgainstConfig(**model, config).ok());
  absl::StatusOr<TensorView> t = (*model)->Get(tensors[5].name);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(std::memcmp(t->data, tensors[5].bytes.data(), t->size_bytes), 0);
  EXPECT_EQ((*model)->Get("nope").status().code(), absl::StatusCode::kNotFound);
}

// Writes the tensors round-robin over `num_shards` files plus an index.
void WriteSharded(const fs::path& dir, const std::vector<OwnedTensor>& tensors, int num_shards) {
  std::vector<std::vector<OwnedTensor>> shards(num_shards);
  Json weight_map = Json::object();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int s = static_cast<int>(i % num_shards);
    shards[s].push_back(tensors[i]);
    weight_map[tensors[i].name] = "model-0000" + std::to_string(s + 1) + "-of-0000" +
                                  std::to_string(num_shards) + ".safetensors";
  }
  for (int s = 0; s < num_shards; ++s) {
    ASSERT_TRUE(Write((dir / ("model-0000" + std::to_string(s + 1) + "-of-0000" +
                              std::to_string(num_shards) + ".safetensors"))
                          .string(),
                      shards[s])
                    .ok());
  }
  std::ofstream(dir / "model.safetensors.index.json")
      << Json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2);
}

TEST_F(SafetensorsTest, ModelFromShards) {
  const ModelConfig config = TinyConfig();
  const std::vector<OwnedTensor> tensors = TensorsFor(config);
  WriteSharded(dir_, tensors, 3);
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> model = SafetensorsModel::Open(dir_.string());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->num_shards(), 3u);
  EXPECT_EQ((*model)->Names().size(), tensors.size());
  for (const OwnedTensor& want : tensors) {
    absl::StatusOr<TensorView> got = (*model)->Get(want.name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->shape, want.shape);
    EXPECT_EQ(std::memcmp(got->data, want.bytes.data(), got->size_bytes), 0) << want.name;
  }
  absl::Status valid = ValidateAgainstConfig(**model, config);
  EXPECT_TRUE(valid.ok()) << valid;
}

TEST_F(SafetensorsTest, ModelRejectsInconsistentIndex) {
  const std::vector<OwnedTensor> tensors = {Filled("a", DType::kF32, {1}, 0),
                                            Filled("b", DType::kF32, {1}, 0)};
  ASSERT_TRUE(Write(Path("s1.safetensors"), tensors).ok());
  auto write_index = [&](const Json& index) {
    std::ofstream(Path("model.safetensors.index.json"), std::ios::trunc) << index.dump();
  };
  auto expect_invalid = [&](const std::string& needle) {
    absl::StatusOr<std::unique_ptr<SafetensorsModel>> model = SafetensorsModel::Open(dir_.string());
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
    EXPECT_THAT(std::string(model.status().message()), HasSubstr(needle));
  };

  write_index({{"weight_map", {{"a", "s1.safetensors"}}}});  // b is not listed
  expect_invalid("holds tensor 'b'");
  write_index({{"weight_map",
                {{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "s1.safetensors"}}}});
  expect_invalid("tensor 'c'");
  write_index({{"weight_map", {{"a", "../s1.safetensors"}}}});
  expect_invalid("not a plain file name");
  write_index({{"weight_map", {{"a", 3}}}});
  expect_invalid("file name string");
  write_index({{"metadata", {}}});
  expect_invalid("weight_map");
  // Found by the safetensors_index fuzzer: an empty map opened as a model of no tensors.
  write_index({{"weight_map", Json::object()}});
  expect_invalid("\"weight_map\" is empty");
  std::ofstream(Path("model.safetensors.index.json"), std::ios::trunc) << "{not json";
  expect_invalid("not a JSON object");

  write_index({{"weight_map", {{"a", "absent.safetensors"}}}});
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> model = SafetensorsModel::Open(dir_.string());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, ModelMissingFilesIsNotFound) {
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> model = SafetensorsModel::Open(dir_.string());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("model.safetensors"));
}

TEST_F(SafetensorsTest, ValidateAgainstConfigReportsProblems) {
  const ModelConfig config = TinyConfig();
  std::vector<OwnedTensor> tensors = TensorsFor(config);
  // Drop a tensor, give one a wrong shape, add a stray one.
  const std::string dropped = tensors[3].name;
  tensors.erase(tensors.begin() + 3);
  for (OwnedTensor& t : tensors) {
    if (t.name == "model.layers.1.block_sparse_moe.experts.2.w2.weight") {
      t = Filled(t.name, DType::kBF16, {12, 8}, 0);  // transposed
    }
  }
  tensors.push_back(Filled("model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {2}, 0));
  ASSERT_TRUE(Write(Path("model.safetensors"), tensors).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> model = SafetensorsModel::Open(dir_.string());
  ASSERT_TRUE(model.ok()) << model.status();
  absl::Status status = ValidateAgainstConfig(**model, config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
  EXPECT_THAT(message, HasSubstr("3 problem(s)"));
  EXPECT_THAT(message, HasSubstr("missing tensor '" + dropped + "'"));
  EXPECT_THAT(message, HasSubstr("tensor 'model.layers.1.block_sparse_moe.experts.2.w2.weight' "
                                 "has shape [12, 8], expected [8, 12]"));
  EXPECT_THAT(message,
              HasSubstr("unexpected tensor 'model.layers.0.self_attn.rotary_emb.inv_freq'"));

  // A tied model must not carry lm_head.
  ModelConfig tied = config;
  tied.tie_word_embeddings = true;
  ASSERT_TRUE(Write(Path("model.safetensors"), TensorsFor(config)).ok());
  model = SafetensorsModel::Open(dir_.string());
  ASSERT_TRUE(model.ok());
  status = ValidateAgainstConfig(**model, tied);
  EXPECT_THAT(std::string(status.message()), HasSubstr("unexpected tensor 'lm_head.weight'"));
}

// A quantized checkpoint: levels and scales where the config says, floats elsewhere; a dtype
// the config does not expect is named.
TEST_F(SafetensorsTest, ValidateAgainstAQuantizedConfig) {
  ModelConfig config = TinyConfig();
  config.hidden_size = 8;
  config.quantization = {.bits = 4, .group_size = 32, .experts = true};
  // (Widths need not divide the group here: ValidateAgainstConfig checks only what is stored.)
  std::vector<OwnedTensor> tensors;
  uint8_t seed = 0;
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    const DType dtype = spec.storage == TensorStorage::kInt4    ? DType::kU8
                        : spec.storage == TensorStorage::kScale ? DType::kF16
                                                                : DType::kBF16;
    tensors.push_back(Filled(spec.name, dtype, spec.shape, seed++));
  }
  ASSERT_TRUE(Write(Path("model.safetensors"), tensors).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> model = SafetensorsModel::Open(dir_.string());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(ValidateAgainstConfig(**model, config), absl::OkStatus());
  for (OwnedTensor& t : tensors) {
    if (t.name == "model.layers.0.block_sparse_moe.experts.1.w3.weight") {
      t = Filled(t.name, DType::kI8, t.shape, 0);  // int8 levels where int4 were expected
    }
    if (t.name == "model.layers.0.self_attn.k_proj.weight") {
      t = Filled(t.name, DType::kU8, t.shape, 0);  // bytes where a float matrix belongs
    }
  }
  ASSERT_TRUE(Write(Path("model.safetensors"), tensors).ok());
  model = SafetensorsModel::Open(dir_.string());
  ASSERT_TRUE(model.ok());
  const absl::Status status = ValidateAgainstConfig(**model, config);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("'model.layers.0.block_sparse_moe.experts.1.w3.weight' has dtype I8, "
                        "expected U8"));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("'model.layers.0.self_attn.k_proj.weight' has dtype U8, expected BF16"));
}

}  // namespace
}  // namespace tandem::model
