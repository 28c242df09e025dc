// Streams token ids through a StreamingDetokenizer as a served reply is: what the tokenizer
// tests and fuzzers compare with Decode of the same ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/tokenizer.h"
#include "tests/testing/utf8.h"

namespace tandem::testing {

struct StreamedText {
  std::string text;          // every piece, then the flush, concatenated
  bool pieces_valid = true;  // every piece was valid UTF-8
};

inline absl::StatusOr<StreamedText> StreamDecode(const model::Tokenizer& tokenizer,
                                                 const std::vector<int32_t>& ids) {
  model::StreamingDetokenizer stream(&tokenizer);
  StreamedText out;
  for (int32_t id : ids) {
    absl::StatusOr<std::string> piece = stream.Add(id);
    if (!piece.ok()) return piece.status();
    out.pieces_valid &= IsValidUtf8(*piece);
    out.text += *piece;
  }
  absl::StatusOr<std::string> rest = stream.Flush();
  if (!rest.ok()) return rest.status();
  out.pieces_valid &= IsValidUtf8(*rest);
  out.text += *rest;
  return out;
}

}  // namespace tandem::testing
