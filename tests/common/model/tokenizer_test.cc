#include "common/model/tokenizer.h"
#include "tests/testing/stream_decode.h"
#include "tests/testing/utf8.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace tandem::model {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::IsValidUtf8;

std::string ModelPath() {
  const char* root = std::getenv("TANDEM_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/models/tiny-moe/tokenizer.model";
}

// Loads the shipped tokenizer (it is in every checkout: a failure to load it is a failure).
#define LOAD_TOKENIZER(var)                                                           \
  absl::StatusOr<std::unique_ptr<Tokenizer>> var##_or = Tokenizer::Load(ModelPath()); \
  ASSERT_TRUE(var##_or.ok()) << var##_or.status();                                    \
  const Tokenizer& var = **var##_or

// Streams `ids` through a StreamingDetokenizer; checks each piece and the whole against Decode.
void ExpectStreamMatchesDecode(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  absl::StatusOr<testing::StreamedText> streamed = testing::StreamDecode(tok, ids);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_TRUE(streamed->pieces_valid) << "a piece is not valid UTF-8";
  absl::StatusOr<std::string> whole = tok.Decode(ids);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::string id_list;
  for (int32_t id : ids) id_list += std::to_string(id) + " ";
  EXPECT_EQ(streamed->text, *whole) << "ids: " << id_list;
}

// add_bos() comes from tokenizer_config.json beside the model: add_bos_token, true when the
// file or the key is absent (as for Hugging Face's Llama tokenizer).
TEST(TokenizerTest, AddBosFollowsTheConfigAndRejectsMalformedConfigs) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tandem_bos_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(ModelPath(), dir / "tokenizer.model",
                             std::filesystem::copy_options::overwrite_existing);
  auto add_bos = [&]() -> absl::StatusOr<bool> {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Load(dir.string());
    if (!tok.ok()) return tok.status();
    return (*tok)->add_bos();
  };
  EXPECT_TRUE(*add_bos());  // no tokenizer_config.json
  auto write = [&](const std::string& text) {
    std::ofstream(dir / "tokenizer_config.json") << text;
  };
  write(R"({"add_bos_token": false})");
  EXPECT_FALSE(*add_bos());
  write(R"({"tokenizer_class": "LlamaTokenizer"})");
  EXPECT_TRUE(*add_bos());
  write(R"({"add_bos_token": "yes"})");
  EXPECT_THAT(add_bos().status().message(), ::testing::HasSubstr("must be a boolean"));
  write("not json");
  EXPECT_EQ(add_bos().status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

TEST(TokenizerTest, LoadsFromTheModelDirectory) {
  const std::string file = ModelPath();
  const std::string dir = std::filesystem::path(file).parent_path().string();
  absl::StatusOr<std::unique_ptr<Tokenizer>> by_dir = Tokenizer::Load(dir);
  ASSERT_TRUE(by_dir.ok()) << by_dir.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> by_file = Tokenizer::Load(file);
  ASSERT_TRUE(by_file.ok()) << by_file.status();
  EXPECT_EQ((*by_dir)->vocab_size(), (*by_file)->vocab_size());
  EXPECT_EQ(*(*by_dir)->Encode("Hello world"), *(*by_file)->Encode("Hello world"));
  // TokenToId inverts IdToPiece.
  for (int32_t id : {0, 1, 2, 100, (*by_dir)->vocab_size() - 1}) {
    EXPECT_EQ((*by_dir)->TokenToId((*by_dir)->IdToPiece(id)), id);
  }
  EXPECT_EQ((*by_dir)->TokenToId("no such piece, surely"), -1);
  // EncodeWithSpecialTokens frames with BOS when add_bos().
  absl::StatusOr<std::vector<int32_t>> framed = (*by_dir)->EncodeWithSpecialTokens("Hello");
  ASSERT_TRUE(framed.ok());
  if ((*by_dir)->add_bos()) {
    EXPECT_EQ(framed->front(), (*by_dir)->bos_id());
  }

  const std::filesystem::path empty =
      std::filesystem::temp_directory_path() / ("tandem_empty_" + std::to_string(::getpid()));
  std::filesystem::create_directories(empty);
  absl::StatusOr<std::unique_ptr<Tokenizer>> none = Tokenizer::Load(empty.string());
  std::filesystem::remove_all(empty);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("tokenizer.json"));
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("tokenizer.model"));
}

TEST(TokenizerTest, MissingFileIsNotFound) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Load("/nonexistent/tokenizer.model");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenizerTest, GarbageFileIsInvalid) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("tandem_tokenizer_test_" + std::to_string(::getpid()) + ".model");
  std::ofstream(path) << "this is not a sentencepiece model";
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Load(path.string());
  std::filesystem::remove(path);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("not a SentencePiece model"));
}

TEST(TokenizerTest, SpecialIds) {
  LOAD_TOKENIZER(tok);
  EXPECT_GT(tok.vocab_size(), 0);
  ASSERT_GE(tok.bos_id(), 0);
  ASSERT_GE(tok.eos_id(), 0);
  EXPECT_NE(tok.bos_id(), tok.eos_id());
  EXPECT_TRUE(tok.IsControl(tok.bos_id()));
  EXPECT_TRUE(tok.IsControl(tok.eos_id()));
  EXPECT_FALSE(tok.IsControl(-1));
  EXPECT_EQ(tok.IdToPiece(tok.vocab_size()), "");
}

// A chat template writes "<s>": special tokens in a text are read as themselves, and the text
// around them is encoded as it would be alone.
TEST(TokenizerTest, SpecialTokensInTheTextAreReadAsThemselves) {
  LOAD_TOKENIZER(tok);
  auto quote = tok.Encode("\"Where did you go?\" he asked.");
  ASSERT_TRUE(quote.ok()) << quote.status();
  auto with_bos = tok.Encode("<s>\"Where did you go?\" he asked.");
  ASSERT_TRUE(with_bos.ok()) << with_bos.status();
  std::vector<int32_t> expected = {tok.bos_id()};
  expected.insert(expected.end(), quote->begin(), quote->end());
  EXPECT_EQ(*with_bos, expected);
  auto around = tok.Encode("a</s>b<s");
  ASSERT_TRUE(around.ok());
  EXPECT_EQ(std::count(around->begin(), around->end(), tok.eos_id()), 1);
  EXPECT_EQ(std::count(around->begin(), around->end(), tok.bos_id()), 0);  // "<s" is text
}

TEST(TokenizerTest, AsciiRoundTrip) {
  LOAD_TOKENIZER(tok);
  // (No tabs, newlines or runs of spaces: the shipped model's normaliser folds them into one
  // space, so such text does not round-trip.)
  for (const std::string text :
       {"Hello world, this is Tandem.", "a", "The quick brown fox (42)!", "x = y + 1; // ok?"}) {
    absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_FALSE(ids->empty());
    EXPECT_THAT(*ids, Not(Contains(tok.bos_id())));  // callers add BOS/EOS
    EXPECT_THAT(*ids, Not(Contains(tok.eos_id())));
    absl::StatusOr<std::string> back = tok.Decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text);
  }
  absl::StatusOr<std::vector<int32_t>> empty = tok.Encode("");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(TokenizerTest, Utf8RoundTrip) {
  LOAD_TOKENIZER(tok);
  for (const std::string text : {"naïve café — 東京", "Grüße, Zürich", "emoji 🙂 end"}) {
    absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    absl::StatusOr<std::string> back = tok.Decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text);
  }
}

TEST(TokenizerTest, DecodeIgnoresControlTokensAndRejectsBadIds) {
  LOAD_TOKENIZER(tok);
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode("Hello world");
  ASSERT_TRUE(ids.ok());
  std::vector<int32_t> framed = {tok.bos_id()};
  framed.insert(framed.end(), ids->begin(), ids->end());
  framed.push_back(tok.eos_id());
  absl::StatusOr<std::string> text = tok.Decode(framed);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "Hello world");

  for (int32_t bad : {-1, tok.vocab_size(), 1 << 30}) {
    absl::StatusOr<std::string> out = tok.Decode({bad});
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    StreamingDetokenizer stream(&tok);
    EXPECT_FALSE(stream.Add(bad).ok());
  }
}

TEST(TokenizerTest, StreamingMatchesDecodeOnText) {
  LOAD_TOKENIZER(tok);
  for (const std::string text :
       {"Hello world, this is Tandem.", "naïve café — 東京", "emoji 🙂 and 東京 again",
        "two  spaces", "x", "東", "Once upon a time, there was a little girl named Lily."}) {
    absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text);
    ASSERT_TRUE(ids.ok());
    std::vector<int32_t> framed = {tok.bos_id()};
    framed.insert(framed.end(), ids->begin(), ids->end());
    framed.push_back(tok.eos_id());
    ExpectStreamMatchesDecode(tok, *ids);
    ExpectStreamMatchesDecode(tok, framed);
  }
}

// A character spread over byte-fallback tokens is held until its last byte arrives.
TEST(TokenizerTest, StreamingHoldsIncompleteCharacters) {
  LOAD_TOKENIZER(tok);
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode("a東");
  ASSERT_TRUE(ids.ok());
  StreamingDetokenizer stream(&tok);
  std::string out;
  int held = 0;
  for (int32_t id : *ids) {
    absl::StatusOr<std::string> piece = stream.Add(id);
    ASSERT_TRUE(piece.ok());
    EXPECT_TRUE(IsValidUtf8(*piece));
    if (piece->empty()) ++held;
    out += *piece;
  }
  EXPECT_EQ(out, "a東");
  if (tok.IsByte(ids->back())) {
    EXPECT_GE(held, 1);  // the multi-byte character came in pieces
  }

  // An unfinished character is released by Flush as U+FFFD, as Decode renders it.
  StreamingDetokenizer partial(&tok);
  for (size_t i = 0; i + 1 < ids->size(); ++i) ASSERT_TRUE(partial.Add((*ids)[i]).ok());
  absl::StatusOr<std::string> rest = partial.Flush();
  ASSERT_TRUE(rest.ok());
  absl::StatusOr<std::string> expected =
      tok.Decode(std::vector<int32_t>(ids->begin(), ids->end() - 1));
  ASSERT_TRUE(expected.ok());
  EXPECT_TRUE(expected->ends_with(*rest));
}

// Arbitrary id sequences, weighted towards the hard cases: byte pieces, the bare "▁" piece,
// control tokens and invalid byte sequences.
TEST(TokenizerTest, StreamingMatchesDecodeOnRandomIds) {
  LOAD_TOKENIZER(tok);
  std::vector<int32_t> bytes, controls;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.IsByte(id)) bytes.push_back(id);
    if (tok.IsControl(id)) controls.push_back(id);
  }
  std::vector<int32_t> spaces;
  absl::StatusOr<std::vector<int32_t>> space_ids = tok.Encode("a \xE6\x9D\xB1");
  ASSERT_TRUE(space_ids.ok());
  for (int32_t id : *space_ids) spaces.push_back(id);  // includes "▁" before a byte run

  std::mt19937 rng(7);
  // TANDEM_FUZZ_ITERATIONS raises the count for a longer local run.
  const char* env_iterations = std::getenv("TANDEM_FUZZ_ITERATIONS");
  const int iterations = env_iterations != nullptr ? std::atoi(env_iterations) : 300;
  for (int iter = 0; iter < iterations; ++iter) {
    std::vector<int32_t> ids(1 + rng() % 24);
    for (int32_t& id : ids) {
      const unsigned pick = rng() % 10;
      if (pick < 3 && !bytes.empty()) {
        id = bytes[rng() % bytes.size()];
      } else if (pick < 4 && !controls.empty()) {
        id = controls[rng() % controls.size()];
      } else if (pick < 6) {
        id = spaces[rng() % spaces.size()];
      } else {
        id = static_cast<int32_t>(rng() % tok.vocab_size());
      }
    }
    ExpectStreamMatchesDecode(tok, ids);
    if (HasFailure()) break;
  }
}

}  // namespace
}  // namespace tandem::model
