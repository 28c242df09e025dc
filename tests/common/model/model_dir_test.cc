#include "common/model/model_dir.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TinyMoe() { return testing::SourceDir() + "/models/tiny-moe"; }

void Write(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

// A model directory of links to the shipped model's files (so a test may remove or replace one).
fs::path LinkTinyMoe(const testing::TempDir& temp) {
  const fs::path dir = fs::path(temp.path()) / "tiny-moe";
  fs::create_directories(dir);
  for (const char* file : {"config.json", "model.safetensors", "tokenizer.model",
                           "tokenizer_config.json", "generation_config.json"}) {
    fs::create_symlink(fs::path(TinyMoe()) / file, dir / file);
  }
  return dir;
}

TEST(ModelDirTest, ReadsThePublishedFilesOnce) {
  testing::TempDir temp;
  const fs::path dir = fs::path(temp.path()) / "qwen-like";
  fs::create_directories(dir);
  fs::copy_file(fs::path(TinyMoe()) / "config.json", dir / "config.json");
  Write(dir / "tokenizer_config.json", R"({"add_bos_token": false, "bos_token": null,
      "eos_token": {"content": "<|im_end|>", "special": true},
      "chat_template": [{"name": "default", "template": "a"}, {"name": "tool_use", "template": "b"}]})");
  Write(dir / "generation_config.json", R"({"eos_token_id": [7, 9], "top_k": 20})");

  auto opened = ModelDir::Open(dir.string() + "/");
  ASSERT_TRUE(opened.ok()) << opened.status();
  const ModelDir& model = **opened;
  EXPECT_EQ(model.name(), "qwen-like");
  EXPECT_EQ(model.config().model_type(), "mixtral");
  EXPECT_EQ(model.tokenizer_config().eos_token, "<|im_end|>");
  EXPECT_EQ(model.tokenizer_config().add_bos_token, false);
  EXPECT_FALSE(model.tokenizer_config().bos_token.has_value());
  EXPECT_THAT(model.generation().eos_token_ids, ElementsAre(7, 9));
  EXPECT_EQ(model.generation().top_k, 20);
  EXPECT_FALSE(model.chat_template_file().has_value());
  ASSERT_TRUE(model.chat_template_config().is_array());
  EXPECT_EQ(model.chat_template_config()[1]["name"], "tool_use");
  EXPECT_THAT(model.chat_template_origin(), HasSubstr("tokenizer_config.json"));

  // chat_template.jinja, when there, is the template (read at open: removing it changes nothing).
  Write(dir / "chat_template.jinja", "{{ messages[0]['content'] }}");
  auto with_jinja = ModelDir::Open(dir.string());
  ASSERT_TRUE(with_jinja.ok()) << with_jinja.status();
  fs::remove(dir / "chat_template.jinja");
  EXPECT_EQ((*with_jinja)->chat_template_file(), "{{ messages[0]['content'] }}");
  EXPECT_THAT((*with_jinja)->chat_template_origin(), HasSubstr("chat_template.jinja"));
}

TEST(ModelDirTest, OptionalFilesMayBeAbsentButConfigMayNot) {
  testing::TempDir temp;
  const fs::path dir = fs::path(temp.path()) / "bare";
  fs::create_directories(dir);
  auto none = ModelDir::Open(dir.string());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("config.json"));

  fs::copy_file(fs::path(TinyMoe()) / "config.json", dir / "config.json");
  auto bare = ModelDir::Open(dir.string());
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_TRUE((*bare)->generation().eos_token_ids.empty());
  EXPECT_TRUE((*bare)->chat_template_config().is_null());
  EXPECT_FALSE((*bare)->tokenizer_config().add_bos_token.has_value());
  // The missing tokenizer and checkpoint are errors when asked for, the same each time.
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ((*bare)->tokenizer().status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(std::string((*bare)->tokenizer().status().message()), HasSubstr("tokenizer.json"));
    EXPECT_FALSE((*bare)->checkpoint().ok());
  }
}

TEST(ModelDirTest, MalformedFilesNameTheFileAndTheKey) {
  testing::TempDir temp;
  const fs::path dir = fs::path(temp.path()) / "bad";
  fs::create_directories(dir);
  auto message = [&] {
    auto opened = ModelDir::Open(dir.string());
    EXPECT_FALSE(opened.ok());
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(opened.status().message());
  };
  Write(dir / "config.json", R"({"model_type": "mixtral"})");
  EXPECT_THAT(message(), AllOf(HasSubstr("config.json"), HasSubstr("vocab_size")));
  fs::copy_file(fs::path(TinyMoe()) / "config.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  Write(dir / "tokenizer_config.json", "[1, 2]");
  EXPECT_THAT(message(), HasSubstr("tokenizer_config.json is not a JSON object"));
  Write(dir / "tokenizer_config.json", R"({"eos_token": 5})");
  EXPECT_THAT(message(), AllOf(HasSubstr("tokenizer_config.json"), HasSubstr("eos_token")));
  Write(dir / "tokenizer_config.json", "{}");
  Write(dir / "generation_config.json", R"({"top_k": "many"})");
  EXPECT_THAT(message(), AllOf(HasSubstr("generation_config.json"), HasSubstr("top_k")));
  fs::remove(dir / "generation_config.json");
  fs::create_directories(dir / "chat_template.jinja");  // not a file
  EXPECT_THAT(message(), HasSubstr("chat_template.jinja"));
}

TEST(ModelDirTest, TheTokenizerAndTheCheckpointAreReadOnceAndShared) {
  testing::TempDir temp;
  const fs::path dir = LinkTinyMoe(temp);
  auto opened = ModelDir::Open(dir.string());
  ASSERT_TRUE(opened.ok()) << opened.status();
  ModelDir& model = **opened;
  auto tokenizer = model.tokenizer();
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto checkpoint = model.checkpoint();
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  // Later calls return the same objects without reading the files again.
  fs::remove(dir / "tokenizer.model");
  fs::remove(dir / "model.safetensors");
  EXPECT_EQ(model.tokenizer()->get(), tokenizer->get());
  EXPECT_EQ(*model.checkpoint(), *checkpoint);
  EXPECT_EQ((*tokenizer)->vocab_size(), model.config().vocab_size);
  // Released, the checkpoint is opened again when asked for (here: gone).
  model.ReleaseCheckpoint();
  EXPECT_EQ(model.checkpoint().status().code(), absl::StatusCode::kNotFound);
  // The tokenizer outlives the directory object.
  std::shared_ptr<const Tokenizer> kept = *tokenizer;
  opened->reset();
  EXPECT_TRUE(kept->Encode("The jury said").ok());
}

TEST(ModelDirTest, ShippedTinyMoe) {
  auto opened = ModelDir::Open(TinyMoe());
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->config().model_type(), "mixtral");
  EXPECT_FALSE(ExpectedTensors((*opened)->config()).empty());
  EXPECT_EQ((*opened)->name(), "tiny-moe");
  EXPECT_THAT((*opened)->generation().stop_strings, ElementsAre("\""));
  EXPECT_TRUE((*opened)->chat_template_config().is_string());
}

}  // namespace
}  // namespace tandem::model
