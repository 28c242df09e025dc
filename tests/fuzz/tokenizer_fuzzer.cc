// The SentencePiece tokenizer (model::Tokenizer, the shipped models/tiny-moe/tokenizer.model) on
// arbitrary bytes: the input encoded as text, and read as token ids (two bytes each, some out
// of the vocabulary) decoded whole and streamed through StreamingDetokenizer, whose pieces must
// be valid UTF-8 and add up to Decode of the same ids (tokenizer.h).
#include <memory>
#include <string>
#include <vector>

#include "common/model/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/testing/stream_decode.h"
#include "tests/testing/utf8.h"

namespace tandem::model {
namespace {

using testing::IsValidUtf8;

// Decodes `ids` whole and streamed, and checks that the two agree.
void CheckDecode(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  absl::StatusOr<std::string> whole = tok.Decode(ids);
  FUZZ_CHECK(whole.ok());
  FUZZ_CHECK(IsValidUtf8(*whole));
  absl::StatusOr<testing::StreamedText> streamed = testing::StreamDecode(tok, ids);
  FUZZ_CHECK(streamed.ok());
  FUZZ_CHECK(streamed->pieces_valid);
  FUZZ_CHECK(streamed->text == *whole);
}

const Tokenizer& Tiny() {
  static const Tokenizer* tok = [] {
    absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = Tokenizer::Load(fuzz::TinyModelDir());
    FUZZ_CHECK(loaded.ok());
    return loaded->release();
  }();
  return *tok;
}

}  // namespace
}  // namespace tandem::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::model;
  const Tokenizer& tok = Tiny();
  const int32_t vocab = tok.vocab_size();

  absl::StatusOr<std::vector<int32_t>> encoded = tok.Encode(tandem::fuzz::AsText(data, size));
  FUZZ_CHECK(encoded.ok());
  for (int32_t id : *encoded) FUZZ_CHECK(id >= 0 && id < vocab);
  CheckDecode(tok, *encoded);

  // Ids in [-4, vocab + 4): the few outside the vocabulary must be refused, not crash.
  std::vector<int32_t> ids, valid;
  bool all_valid = true;
  for (size_t i = 0; i + 1 < size; i += 2) {
    const int32_t id = static_cast<int32_t>((data[i] | data[i + 1] << 8) % (vocab + 8)) - 4;
    ids.push_back(id);
    if (id >= 0 && id < vocab) {
      valid.push_back(id);
    } else {
      all_valid = false;
      FUZZ_CHECK(tok.IdToPiece(id).empty() && !tok.IsControl(id) && !tok.IsByte(id));
      StreamingDetokenizer stream(&tok);
      FUZZ_CHECK(stream.Add(id).status().code() == absl::StatusCode::kInvalidArgument);
    }
  }
  absl::StatusOr<std::string> decoded = tok.Decode(ids);
  if (all_valid) {
    FUZZ_CHECK(decoded.ok());
  } else {
    FUZZ_CHECK(decoded.status().code() == absl::StatusCode::kInvalidArgument);
  }
  for (int32_t id : valid) {
    tok.IdToPiece(id);
    if (tok.IsByte(id)) FUZZ_CHECK(!tok.IsControl(id));
  }
  CheckDecode(tok, valid);
  return 0;
}
