// HfTokenizer (tokenizer.json) on arbitrary bytes: read as a tokenizer.json document (refused
// with INVALID_ARGUMENT or loaded, never a crash or a hang; a loaded one must then encode and
// decode), encoded as text by two small valid tokenizers (byte-level, and Metaspace with byte
// fallback), and read as token ids decoded whole and streamed through StreamingDetokenizer,
// whose pieces must be valid UTF-8 and add up to Decode of the same ids (tokenizer.h).
#include <memory>
#include <string>
#include <vector>

#include "common/model/hf_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/testing/stream_decode.h"
#include "tests/testing/utf8.h"

namespace tandem::model {
namespace {

using testing::IsValidUtf8;

// `exact`: the streamed pieces must add up to Decode. That holds for decoders that work per
// token or per byte run, as every published one does, but not for any chain a fuzzed document
// can write (Fuse before ByteLevel makes each byte's decoding depend on the whole text), so
// for those only the pieces' validity is checked.
void CheckDecode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool exact = true) {
  absl::StatusOr<std::string> whole = tok.Decode(ids);
  FUZZ_CHECK(whole.ok());
  FUZZ_CHECK(IsValidUtf8(*whole));
  absl::StatusOr<testing::StreamedText> streamed = testing::StreamDecode(tok, ids);
  FUZZ_CHECK(streamed.ok());
  FUZZ_CHECK(streamed->pieces_valid);
  FUZZ_CHECK(!exact || streamed->text == *whole);
}

// Encodes `text` (refused exactly when it is not valid UTF-8), checks the ids, decodes them.
std::vector<int32_t> CheckEncode(const Tokenizer& tok, std::string_view text, bool exact = true) {
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text);
  if (!IsValidUtf8(text)) {
    FUZZ_CHECK(ids.status().code() == absl::StatusCode::kInvalidArgument);
    return {};
  }
  // A pathological regex may exhaust PCRE2's match limit; nothing else may fail.
  if (!ids.ok()) {
    FUZZ_CHECK(ids.status().code() == absl::StatusCode::kResourceExhausted);
    return {};
  }
  for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  CheckDecode(tok, *ids, exact);
  return *ids;
}

// The byte-level alphabet (GPT-2's table) as JSON vocabulary entries from id 0.
std::string ByteLevelVocab() {
  std::string out;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int cp = printable ? b : next++;
    char escaped[32];
    std::snprintf(escaped, sizeof(escaped), "\"\\u%04x\": %d,", cp, b);
    out += escaped;
  }
  return out;
}

const HfTokenizer& ByteLevel() {
  static const HfTokenizer* tok = [] {
    const std::string json = R"({"added_tokens": [
        {"id": 262, "content": "<|end|>", "special": true, "normalized": false},
        {"id": 263, "content": "<think>", "special": false, "normalized": false,
         "lstrip": true, "rstrip": true}],
      "normalizer": {"type": "NFC"},
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex":
          "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
      "decoder": {"type": "ByteLevel"},
      "model": {"type": "BPE", "ignore_merges": true, "vocab": {)" +
                             ByteLevelVocab() + R"("Ġt": 256, "he": 257, "Ġthe": 258,
        "ĠĠ": 259, "in": 260, "ing": 261},
        "merges": ["Ġ t", "h e", "Ġt he", "Ġ Ġ", "i n", "in g"]}})";
    absl::StatusOr<std::unique_ptr<HfTokenizer>> loaded = HfTokenizer::FromJson(json, "");
    FUZZ_CHECK(loaded.ok());
    return loaded->release();
  }();
  return *tok;
}

const HfTokenizer& Metaspace() {
  static const HfTokenizer* tok = [] {
    std::string bytes;
    for (int b = 0; b < 256; ++b) {
      char entry[48];
      std::snprintf(entry, sizeof(entry), "\"<0x%02X>\": %d,", b, b + 3);
      bytes += entry;
    }
    const std::string json = R"({"added_tokens": [
        {"id": 0, "content": "<unk>", "special": true},
        {"id": 1, "content": "<s>", "special": true},
        {"id": 2, "content": "</s>", "special": true}],
      "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
      "pre_tokenizer": {"type": "Split", "pattern": {"String": "▁"},
                        "behavior": "MergedWithPrevious", "invert": false},
      "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
      "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ",
         "start": 1, "stop": 0}]},
      "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
        "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, )" +
                             bytes + R"("▁": 259, "a": 260, "b": 261, "▁a": 262, "ab": 263},
        "merges": ["▁ a", "a b"]}})";
    absl::StatusOr<std::unique_ptr<HfTokenizer>> loaded = HfTokenizer::FromJson(json, "");
    FUZZ_CHECK(loaded.ok());
    return loaded->release();
  }();
  return *tok;
}

}  // namespace
}  // namespace tandem::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::model;
  const std::string_view text = tandem::fuzz::AsText(data, size);

  // As a tokenizer.json document.
  absl::StatusOr<std::unique_ptr<HfTokenizer>> loaded = HfTokenizer::FromJson(text, "");
  if (loaded.ok()) {
    for (std::string_view sample : {"Hello, world! 123", " \t\n東京🙂", "é\xCC\x81 <s>"}) {
      CheckEncode(**loaded, sample, /*exact=*/false);
    }
    CheckEncode(**loaded, text.substr(0, 256), /*exact=*/false);
  } else {
    FUZZ_CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
  }

  // As text, and as ids, for the two valid tokenizers.
  for (const HfTokenizer* tok : {&ByteLevel(), &Metaspace()}) {
    const std::vector<int32_t> ids = CheckEncode(*tok, text);
    if (tok == &ByteLevel() && IsValidUtf8(text) && text.find("<|end|>") == std::string::npos &&
        text.find("<think>") == std::string::npos) {
      // Byte-level BPE is lossless, up to NFC.
      absl::StatusOr<std::vector<int32_t>> again = tok->Encode(*tok->Decode(ids));
      FUZZ_CHECK(again.ok());
    }
    const int32_t vocab = tok->vocab_size();
    std::vector<int32_t> valid;
    for (size_t i = 0; i + 1 < size; i += 2) {
      const int32_t id = static_cast<int32_t>((data[i] | data[i + 1] << 8) % (vocab + 8)) - 4;
      if (id >= 0 && id < vocab) {
        valid.push_back(id);
      } else {
        FUZZ_CHECK(tok->Decode({id}).status().code() == absl::StatusCode::kInvalidArgument);
        FUZZ_CHECK(tok->IdToPiece(id).empty() && !tok->IsControl(id) && !tok->IsByte(id));
      }
    }
    CheckDecode(*tok, valid);
  }
  return 0;
}
