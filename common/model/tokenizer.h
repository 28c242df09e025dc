// Text <-> token ids with a SentencePiece model (tokenizer.model in a Hugging Face model
// directory), and incremental detokenization for streamed generation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem::model {

class SpmBackend;

// A loaded SentencePiece model. Immutable after Load, so thread-safe. SentencePiece itself
// runs in libtandem_spm.so, loaded on first use (see spm_backend.h for why).
class Tokenizer {
 public:
  // NOT_FOUND when `path` does not exist; INVALID_ARGUMENT when it is not a SentencePiece model.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`, without BOS or EOS (callers add those).
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;
  // The text of `ids`. Control tokens (BOS, EOS) decode to nothing; byte pieces that do not
  // form valid UTF-8 decode to U+FFFD. INVALID_ARGUMENT for an id outside [0, vocab_size).
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the model has none
  int32_t eos_id() const;  // -1 when the model has none
  int32_t unk_id() const;
  int32_t pad_id() const;  // -1 when the model has none
  // The piece's surface form (with "▁" for a leading space), e.g. for debugging output.
  std::string IdToPiece(int32_t id) const;
  bool IsControl(int32_t id) const;  // BOS, EOS and other invisible tokens
  bool IsByte(int32_t id) const;     // byte-fallback pieces such as <0xE6>

 private:
  explicit Tokenizer(std::unique_ptr<SpmBackend> backend);

  std::unique_ptr<SpmBackend> backend_;  // in libtandem_spm.so, see spm_backend.h
};

// tokenizer_config.json's add_bos_token in `model_dir` (true when the file or the key is
// absent, as for Hugging Face's Llama tokenizer); INVALID_ARGUMENT when the file is malformed.
absl::StatusOr<bool> ReadAddBosToken(const std::string& model_dir);

// Turns a stream of generated ids into text pieces as soon as they are final. Each piece is
// valid UTF-8: bytes of a character split across byte-fallback tokens are held until the
// character is complete, and SentencePiece's word-leading "▁" becomes a space exactly where
// Decode would put one. The concatenation of all pieces (Add results, then Flush) equals
// Decode(all ids). Text whose decoding ends in U+FFFD is held until the next id or Flush, since
// more bytes may complete it. One instance per sequence; not thread-safe. The tokenizer must
// outlive it.
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
  // The ids from the stream start or the latest anchor on: the text of ids_[0, read_) has
  // been emitted, ids_[read_, end) are pending. Emitted text is recomputed as Decode(ids_[0,
  // read_)) so that the first piece's leading-space handling cancels out of each delta.
  std::vector<int32_t> ids_;
  size_t read_ = 0;
};

}  // namespace tandem::model
