// Text <-> token ids, behind one interface with two implementations: SentencePiece
// (tokenizer.model, SpmTokenizer in tokenizer.cc) and Hugging Face tokenizer.json
// (HfTokenizer, hf_tokenizer.h). Also incremental detokenization for streamed generation.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem::model {

// A loaded tokenizer. Immutable after loading, so thread-safe.
class Tokenizer {
 public:
  // `path` is a model directory (its tokenizer.json if present, else its tokenizer.model;
  // NOT_FOUND naming both when neither exists) or a file (`*.json` is read as tokenizer.json,
  // anything else as a SentencePiece model). tokenizer_config.json beside it, when present,
  // supplies the special tokens and add_bos_token / add_eos_token. NOT_FOUND when `path` does
  // not exist; INVALID_ARGUMENT when a file is malformed or uses an unsupported feature.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  // The tokenizer in `file` (`*.json`: tokenizer.json; else a SentencePiece model) with
  // tokenizer_config.json's text (empty: no such file). What Load and ModelDir call.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFile(
      const std::string& file, std::string_view tokenizer_config_json);

  virtual ~Tokenizer() = default;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`, without the BOS / EOS a post-processor adds (callers add those).
  // Added tokens written in the text (e.g. "<|im_start|>") are matched as themselves.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const = 0;
  // Encode(text) framed as a single sequence with special tokens (BOS when add_bos(), ...).
  virtual absl::StatusOr<std::vector<int32_t>> EncodeWithSpecialTokens(
      std::string_view text) const = 0;
  // The text of `ids`. Special / control tokens (BOS, EOS) decode to nothing; bytes that do
  // not form valid UTF-8 decode to U+FFFD. INVALID_ARGUMENT for an id outside
  // [0, vocab_size).
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const = 0;

  // The bytes token `id` adds inside a text (a "▁" is a space even at the start, a byte piece
  // is its byte, a byte-level piece its raw bytes, possibly part of a character); nullopt for
  // special, control and unknown tokens and ids outside the vocabulary. Constrained decoding
  // matches these against its grammar.
  virtual std::optional<std::string> TokenBytes(int32_t id) const = 0;

  // Whether a single-sequence encode with special tokens starts with BOS.
  virtual bool add_bos() const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when the model has none
  virtual int32_t eos_id() const = 0;  // -1 when the model has none
  virtual int32_t unk_id() const = 0;  // -1 when the model has none
  virtual int32_t pad_id() const = 0;  // -1 when the model has none
  // The piece's surface form (e.g. with "▁" or "Ġ" for a leading space), for debugging
  // output; empty for an id outside the vocabulary.
  virtual std::string IdToPiece(int32_t id) const = 0;
  // The id of the piece `piece` (as IdToPiece spells it); -1 when absent.
  virtual int32_t TokenToId(std::string_view piece) const = 0;
  virtual bool IsControl(int32_t id) const = 0;  // BOS, EOS and other special tokens
  virtual bool IsByte(int32_t id) const = 0;     // byte-fallback pieces such as <0xE6>

 protected:
  Tokenizer() = default;
};

// The tokenizer file of the model directory `dir`: tokenizer.json, else tokenizer.model;
// NOT_FOUND naming both when neither is there.
absl::StatusOr<std::string> TokenizerFileIn(const std::string& dir);

// Turns a stream of generated ids into text pieces as soon as they are final. Each piece is
// valid UTF-8: bytes of a character split across byte-fallback or byte-level tokens are held
// until the character is complete, and a leading "▁" becomes a space exactly where Decode
// would put one. The concatenation of all pieces (Add results, then Flush) equals
// Decode(all ids). Text whose decoding ends in U+FFFD is held until the next id or Flush,
// since more bytes may complete it (and, for tokenizer.json's ByteFallback decoder, a run of
// byte pieces until it ends). One instance per sequence; not thread-safe. The tokenizer
// must outlive it.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer* tokenizer);

  // Appends one id; returns the text it completes (often empty while bytes are pending).
  absl::StatusOr<std::string> Add(int32_t id);
  // Ends the stream: returns whatever is still held (an incomplete character as U+FFFD).
  absl::StatusOr<std::string> Flush();
  // Starts a new stream.
  void Reset();

 private:
  // Whether decoding may restart at `id` without changing the text that follows it.
  bool IsAnchor(int32_t id) const;

  const Tokenizer* tokenizer_;
  // Whether a run of byte pieces decodes as a whole (Hugging Face's ByteFallback decoder
  // turns every byte of a run into U+FFFD when any of it is not valid UTF-8, so a later byte
  // can change the text of earlier ones): such runs are held until they end.
  bool hold_byte_runs_ = false;
  // The ids from the stream start or the latest anchor on: the text of ids_[0, read_) has
  // been emitted, ids_[read_, end) are pending. Emitted text is recomputed as Decode(ids_[0,
  // read_)) so that the first piece's leading-space handling cancels out of each delta.
  std::vector<int32_t> ids_;
  size_t read_ = 0;
};

}  // namespace tandem::model
