// Hugging Face tokenizer.json, read as the `tokenizers` library reads it: BPE models (with
// byte-level or Metaspace / byte-fallback vocabularies), the common normalizers,
// pre-tokenizers, decoders and post-processors, and added tokens matched in the text before
// pre-tokenization. Anything else is refused at load time, naming the type or key.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/tokenizer.h"

namespace tandem::model {

// What tokenizer_config.json says about special tokens. Token values may be written as a
// string or as an {"content": ...} object.
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::optional<bool> add_bos_token, add_eos_token;
};

// An empty `json` is an absent file (everything unset); INVALID_ARGUMENT naming the key when
// the document is malformed.
absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(std::string_view json);

class HfTokenizer final : public Tokenizer {
 public:
  // `tokenizer_config_json` may be empty (no tokenizer_config.json). INVALID_ARGUMENT naming
  // the key for a malformed or unsupported document.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(
      std::string_view tokenizer_json, std::string_view tokenizer_config_json);

  ~HfTokenizer() override;

  // INVALID_ARGUMENT when `text` is not valid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const override;
  absl::StatusOr<std::vector<int32_t>> EncodeWithSpecialTokens(
      std::string_view text) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override;
  std::optional<std::string> TokenBytes(int32_t id) const override;

  bool add_bos() const override;
  int32_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  int32_t unk_id() const override;
  int32_t pad_id() const override;
  std::string IdToPiece(int32_t id) const override;
  int32_t TokenToId(std::string_view piece) const override;
  bool IsControl(int32_t id) const override;
  bool IsByte(int32_t id) const override;

  // The ids of the special added tokens, ascending.
  std::vector<int32_t> SpecialTokenIds() const;

  struct Impl;

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::model
