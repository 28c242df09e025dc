#include "common/model/tokenizer.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/model/hf_tokenizer.h"
#include "common/model/spm_backend.h"
#include "common/util/file.h"

namespace tandem::model {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// The part of `full` after `emitted`. When `emitted` is not a prefix of `full` (not expected
// from SentencePiece), the part after their common prefix, backed up to a character boundary
// so that the result stays valid UTF-8.
std::string NewText(std::string_view full, std::string_view emitted) {
  if (full.starts_with(emitted)) return std::string(full.substr(emitted.size()));
  size_t start = static_cast<size_t>(
      std::mismatch(full.begin(), full.end(), emitted.begin(), emitted.end()).first - full.begin());
  while (start > 0 && (static_cast<unsigned char>(full[start]) & 0xC0) == 0x80) --start;
  return std::string(full.substr(start));
}

// Where libtandem_spm.so may be: $TANDEM_SPM_LIBRARY, beside or below the running binary
// (bin/../lib), the build tree it was built in, then the dynamic loader's own search path.
std::vector<std::string> BackendCandidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("TANDEM_SPM_LIBRARY"); env != nullptr && *env != 0) {
    out.emplace_back(env);
  }
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path().parent_path() / "lib" / kSpmBackendLibrary).string());
    out.push_back((exe.parent_path() / kSpmBackendLibrary).string());
  }
#ifdef TANDEM_SPM_BUILD_PATH
  out.emplace_back(TANDEM_SPM_BUILD_PATH);
#endif
  out.emplace_back(kSpmBackendLibrary);
  return out;
}

// What a backend call produced, copied into this side's memory (see SpmSink).
class Collector final : public SpmSink {
 public:
  void Ids(const int* ids, size_t count) override { ids_.assign(ids, ids + count); }
  void Text(std::string_view text) override { text_.assign(text); }

  std::vector<int32_t>& ids() { return ids_; }
  std::string& text() { return text_; }

 private:
  std::vector<int32_t> ids_;
  std::string text_;
};

// The backend library with its own protobuf bound to itself (spm_backend.h).
void* OpenBackend(const std::string& path) {
#ifdef TANDEM_SPM_DLMOPEN
  return dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
#else
  return dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
#endif
}

// Loads the backend library once per process and keeps it loaded.
absl::StatusOr<SpmBackendFactory> BackendFactory() {
  static std::once_flag once;
  static absl::StatusOr<SpmBackendFactory> factory = absl::InternalError("not loaded");
  std::call_once(once, [] {
    std::vector<std::string> errors;
    for (const std::string& candidate : BackendCandidates()) {
      if (candidate.find('/') != std::string::npos && !std::filesystem::exists(candidate)) {
        continue;
      }
      void* handle = OpenBackend(candidate);
      if (handle == nullptr) {
        errors.push_back(dlerror());
        continue;
      }
      void* symbol = dlsym(handle, kSpmBackendFactorySymbol);
      if (symbol == nullptr) {
        errors.push_back(absl::StrCat(candidate, ": no ", kSpmBackendFactorySymbol));
        continue;
      }
      factory = reinterpret_cast<SpmBackendFactory>(symbol);
      return;
    }
    factory = absl::FailedPreconditionError(
        absl::StrCat("cannot load ", kSpmBackendLibrary, " (set TANDEM_SPM_LIBRARY to its path): ",
                     errors.empty() ? "not found" : absl::StrJoin(errors, "; ")));
  });
  return factory;
}

// A SentencePiece model. SentencePiece itself runs in libtandem_spm.so, loaded on first use
// (see spm_backend.h for why).
class SpmTokenizer final : public Tokenizer {
 public:
  SpmTokenizer(std::unique_ptr<SpmBackend> backend, const TokenizerConfig& config)
      : backend_(std::move(backend)),
        add_bos_(config.add_bos_token.value_or(true)),
        add_eos_(config.add_eos_token.value_or(false)) {
    const int32_t size = backend_->PieceSize();
    pieces_.reserve(static_cast<size_t>(size));
    for (int32_t id = 0; id < size; ++id) {
      pieces_.emplace(IdToPiece(id), id);
      // Special tokens written in a text are read as themselves (Hugging Face's slow
      // tokenizers keep them from being split): a chat template writes "<s>".
      if (backend_->IsControl(id) || id == backend_->UnkId()) specials_.push_back(IdToPiece(id));
    }
    std::erase_if(specials_, [](const std::string& s) { return s.empty(); });
    // Longest first, so that one special token that begins another does not cut it.
    std::sort(specials_.begin(), specials_.end(),
              [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  }

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    size_t start = 0;
    for (size_t at = 0; at < text.size();) {
      const std::string* special = nullptr;
      if (text[at] == '<') {
        for (const std::string& s : specials_) {
          if (text.substr(at).starts_with(s)) {
            special = &s;
            break;
          }
        }
      }
      if (special == nullptr) {
        ++at;
        continue;
      }
      if (absl::Status s = EncodePlain(text.substr(start, at - start), &ids); !s.ok()) return s;
      ids.push_back(pieces_.at(*special));
      at += special->size();
      start = at;
    }
    if (absl::Status s = EncodePlain(text.substr(start), &ids); !s.ok()) return s;
    return ids;
  }

  absl::StatusOr<std::vector<int32_t>> EncodeWithSpecialTokens(
      std::string_view text) const override {
    absl::StatusOr<std::vector<int32_t>> ids = Encode(text);
    if (!ids.ok()) return ids.status();
    std::vector<int32_t> out;
    if (add_bos_ && bos_id() >= 0) out.push_back(bos_id());
    out.insert(out.end(), ids->begin(), ids->end());
    if (add_eos_ && eos_id() >= 0) out.push_back(eos_id());
    return out;
  }

  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override {
    const int32_t size = vocab_size();
    for (int32_t id : ids) {
      if (id < 0 || id >= size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is outside the vocabulary [0, ", size, ")"));
      }
    }
    Collector out;
    if (!backend_->Decode(ids.data(), ids.size(), &out)) {
      return absl::InternalError(absl::StrCat("Decode: ", out.text()));
    }
    return std::move(out.text());
  }

  std::optional<std::string> TokenBytes(int32_t id) const override {
    if (id < 0 || id >= vocab_size() || IsControl(id) || id == unk_id()) return std::nullopt;
    const std::string piece = IdToPiece(id);
    if (IsByte(id)) {  // "<0xAB>"
      unsigned value = 0;
      if (piece.size() != 6 || std::sscanf(piece.c_str(), "<0x%2X>", &value) != 1) {
        return std::nullopt;
      }
      return std::string(1, static_cast<char>(value));
    }
    return absl::StrReplaceAll(piece, {{"\u2581", " "}});
  }

  bool add_bos() const override { return add_bos_; }
  int32_t vocab_size() const override { return backend_->PieceSize(); }
  int32_t bos_id() const override { return backend_->BosId(); }
  int32_t eos_id() const override { return backend_->EosId(); }
  int32_t unk_id() const override { return backend_->UnkId(); }
  int32_t pad_id() const override { return backend_->PadId(); }

  std::string IdToPiece(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return "";
    Collector out;
    backend_->IdToPiece(id, &out);
    return std::move(out.text());
  }

  int32_t TokenToId(std::string_view piece) const override {
    auto it = pieces_.find(std::string(piece));
    return it == pieces_.end() ? -1 : it->second;
  }

  bool IsControl(int32_t id) const override {
    return id >= 0 && id < vocab_size() && backend_->IsControl(id);
  }

  bool IsByte(int32_t id) const override {
    return id >= 0 && id < vocab_size() && backend_->IsByte(id);
  }

 private:
  // SentencePiece's ids of text that holds no special token, appended to `ids`.
  absl::Status EncodePlain(std::string_view text, std::vector<int32_t>* ids) const {
    if (text.empty()) return absl::OkStatus();
    Collector out;
    if (!backend_->Encode(text, &out)) {
      return absl::InternalError(absl::StrCat("Encode: ", out.text()));
    }
    ids->insert(ids->end(), out.ids().begin(), out.ids().end());
    return absl::OkStatus();
  }

  std::unique_ptr<SpmBackend> backend_;  // in libtandem_spm.so, see spm_backend.h
  bool add_bos_;
  bool add_eos_;
  absl::flat_hash_map<std::string, int32_t> pieces_;
  std::vector<std::string> specials_;  // control and unknown pieces, longest first
};

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePiece(const std::string& path,
                                                             const TokenizerConfig& config) {
  absl::StatusOr<SpmBackendFactory> factory = BackendFactory();
  if (!factory.ok()) return factory.status();
  Collector error;
  std::unique_ptr<SpmBackend> backend((*factory)(path.c_str(), &error));
  if (backend == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a SentencePiece model: ", error.text()));
  }
  return std::make_unique<SpmTokenizer>(std::move(backend), config);
}

}  // namespace

absl::StatusOr<std::string> TokenizerFileIn(const std::string& dir) {
  for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
    const std::filesystem::path file = std::filesystem::path(dir) / name;
    if (std::filesystem::exists(file)) return file.string();
  }
  return absl::NotFoundError(
      absl::StrCat(dir, ": neither tokenizer.json nor tokenizer.model is there"));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
  }
  std::string file = path;
  if (S_ISDIR(st.st_mode)) {
    absl::StatusOr<std::string> in_dir = TokenizerFileIn(path);
    if (!in_dir.ok()) return in_dir.status();
    file = *std::move(in_dir);
  }
  const std::filesystem::path config_path =
      std::filesystem::path(file).parent_path() / "tokenizer_config.json";
  std::string config_text;
  if (std::filesystem::exists(config_path)) {
    absl::StatusOr<std::string> text = util::ReadFile(config_path.string());
    if (!text.ok()) return text.status();
    config_text = std::move(*text);
  }
  return LoadFile(file, config_text);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::LoadFile(
    const std::string& file, std::string_view tokenizer_config_json) {
  absl::StatusOr<TokenizerConfig> config = ParseTokenizerConfig(tokenizer_config_json);
  if (!config.ok()) return config.status();
  if (std::filesystem::path(file).extension() == ".json") {
    absl::StatusOr<std::string> json = util::ReadFile(file);
    if (!json.ok()) return json.status();
    absl::StatusOr<std::unique_ptr<HfTokenizer>> hf =
        HfTokenizer::FromJson(*json, tokenizer_config_json);
    if (!hf.ok()) {
      return absl::Status(hf.status().code(), absl::StrCat(file, ": ", hf.status().message()));
    }
    return std::unique_ptr<Tokenizer>(std::move(*hf));
  }
  return LoadSentencePiece(file, *config);
}

// ---------------------------------------------------------------------------------------------
// StreamingDetokenizer
//
// Decoding is not piece-local: the first visible piece of a sequence loses its leading space,
// and consecutive byte pieces combine into characters. So each step decodes a short window
// twice, with and without the pending ids, and emits the difference; the window starts at an
// "anchor" id whose own text shields what follows from start-of-sequence handling.

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {
  // "A" followed by an invalid byte: a per-byte decoder keeps the "A".
  const int32_t a = tokenizer_->TokenToId("<0x41>");
  const int32_t ff = tokenizer_->TokenToId("<0xFF>");
  if (a >= 0 && ff >= 0 && tokenizer_->IsByte(a) && tokenizer_->IsByte(ff)) {
    absl::StatusOr<std::string> text = tokenizer_->Decode({a, ff});
    hold_byte_runs_ = text.ok() && !text->starts_with("A");
  }
}

void StreamingDetokenizer::Reset() {
  ids_.clear();
  read_ = 0;
}

bool StreamingDetokenizer::IsAnchor(int32_t id) const {
  // A visible, non-byte piece: after it SentencePiece no longer strips a leading space, and no
  // byte run can span it. (A lone "▁" decodes to nothing at a sequence start, so it is not.)
  // A byte-level piece qualifies only when it holds whole characters: its text has no U+FFFD
  // and does not start with a continuation byte, so no character spans it.
  if (tokenizer_->IsControl(id) || tokenizer_->IsByte(id)) return false;
  absl::StatusOr<std::string> text = tokenizer_->Decode({id});
  return text.ok() && !text->empty() && text->find(kReplacementChar) == std::string::npos &&
         (static_cast<unsigned char>((*text)[0]) & 0xC0) != 0x80;
}

absl::StatusOr<std::string> StreamingDetokenizer::Add(int32_t id) {
  if (id < 0 || id >= tokenizer_->vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token id ", id, " is outside the vocabulary [0, ", tokenizer_->vocab_size(), ")"));
  }
  ids_.push_back(id);
  if (hold_byte_runs_) {
    // Special tokens decode to nothing, so a byte run continues past them.
    size_t last = ids_.size();
    while (last > 0 && tokenizer_->IsControl(ids_[last - 1])) --last;
    if (last > 0 && tokenizer_->IsByte(ids_[last - 1])) return "";
  }
  absl::StatusOr<std::string> emitted = tokenizer_->Decode(absl::MakeConstSpan(ids_).first(read_));
  if (!emitted.ok()) return emitted.status();
  absl::StatusOr<std::string> full = tokenizer_->Decode(ids_);
  if (!full.ok()) return full.status();

  // Nothing new yet, or the text ends inside a character whose remaining bytes may follow.
  if (full->size() <= emitted->size() || full->ends_with(kReplacementChar)) return "";

  std::string delta = NewText(*full, *emitted);

  // Everything is emitted now; restart the window at the newest anchor to keep it short.
  for (size_t j = ids_.size(); j-- > 1;) {
    if (IsAnchor(ids_[j])) {
      ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(j));
      break;
    }
  }
  read_ = ids_.size();
  return delta;
}

absl::StatusOr<std::string> StreamingDetokenizer::Flush() {
  absl::StatusOr<std::string> emitted = tokenizer_->Decode(absl::MakeConstSpan(ids_).first(read_));
  if (!emitted.ok()) return emitted.status();
  absl::StatusOr<std::string> full = tokenizer_->Decode(ids_);
  if (!full.ok()) return full.status();
  Reset();
  if (full->size() <= emitted->size()) return "";
  return NewText(*full, *emitted);
}

}  // namespace tandem::model
