// Loading a model directory: each broken piece (truncated weights, shapes that disagree with
// the config, malformed config.json, missing tokenizer) is a clear error naming the file and
// the problem, and generation from a good directory works end to end.
#include "common/engine/generator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

class LoadModelDirTest : public ::testing::Test {
 protected:
  // A copy of the shipped model that a test may break.
  std::string CopyModel() {
    const fs::path dir = fs::path(temp_.path()) / "model";
    fs::copy(testing::SourceDir() + "/models/tiny-moe", dir, fs::copy_options::recursive);
    return dir.string();
  }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
  }
  // What opening and loading `path` says (the model directory is read as services read it).
  static absl::Status Load(const std::string& path, const LoadOptions& options = {}) {
    auto dir = model::ModelDir::Open(path);
    if (!dir.ok()) return dir.status();
    return LoadModelDir(**dir, options).status();
  }
  static std::string Message(const std::string& dir, const LoadOptions& options = {}) {
    const absl::Status status = Load(dir, options);
    EXPECT_FALSE(status.ok());
    return std::string(status.message());
  }

  testing::TempDir temp_;
};

TEST_F(LoadModelDirTest, GoodDirectoryGenerates) {
  auto generator =
      Generator::Load(*testing::OpenModelDir(testing::SourceDir() + "/models/tiny-moe"));
  ASSERT_TRUE(generator.ok()) << generator.status();
  SamplingParams params;
  params.max_tokens = 8;
  auto result = (*generator)->Generate("The jury said", params);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->output_ids.size(), 8u);
  EXPECT_FALSE(result->text.empty());
}

TEST_F(LoadModelDirTest, TruncatedWeightsNameTheFile) {
  const std::string dir = CopyModel();
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") / 2);
  EXPECT_THAT(Message(dir), HasSubstr("model.safetensors"));
}

TEST_F(LoadModelDirTest, ShapesThatDisagreeWithTheConfigNameTheTensor) {
  const std::string dir = CopyModel();
  std::ifstream in(dir + "/config.json");
  std::string config((std::istreambuf_iterator<char>(in)), {});
  const std::string from = "\"intermediate_size\": 384";
  ASSERT_NE(config.find(from), std::string::npos);
  config.replace(config.find(from), from.size(), "\"intermediate_size\": 320");
  Write(dir + "/config.json", config);
  EXPECT_THAT(Message(dir), AllOf(HasSubstr("experts"), HasSubstr("shape")));
}

TEST_F(LoadModelDirTest, MalformedConfigNamesTheFile) {
  const std::string dir = CopyModel();
  Write(dir + "/config.json", "{\"model_type\": \"mixtral\", ");
  EXPECT_THAT(Message(dir), HasSubstr("config.json"));
}

TEST_F(LoadModelDirTest, MissingTokenizerNamesTheFile) {
  const std::string dir = CopyModel();
  fs::remove(dir + "/tokenizer.model");
  const absl::Status status = Load(dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("tokenizer.model"));
}

TEST_F(LoadModelDirTest, DummyWeightsNeedAStatedRouting) {
  const std::string dir = testing::SourceDir() + "/models/tiny-moe";
  EXPECT_THAT(Message(dir, {.format = LoadFormat::kDummy}), HasSubstr("routing"));
  auto generator = Generator::Load(*testing::OpenModelDir(dir), 64,
                                   {.format = LoadFormat::kDummy, .routing = "zipf:1"});
  ASSERT_TRUE(generator.ok()) << generator.status();
  SamplingParams params;
  params.max_tokens = 4;
  auto result = (*generator)->Generate("The jury said", params);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->output_ids.size(), 4u);
  auto bad = Generator::Load(*testing::OpenModelDir(dir), 64,
                             {.format = LoadFormat::kDummy, .routing = "zipf"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("zipf:S"));
}

}  // namespace
}  // namespace tandem::engine
