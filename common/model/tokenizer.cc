#include "common/model/tokenizer.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/spm_backend.h"
#include "nlohmann/json.hpp"

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

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<SpmBackend> backend) : backend_(std::move(backend)) {}

Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
  }
  absl::StatusOr<SpmBackendFactory> factory = BackendFactory();
  if (!factory.ok()) return factory.status();
  Collector error;
  std::unique_ptr<SpmBackend> backend((*factory)(path.c_str(), &error));
  if (backend == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a SentencePiece model: ", error.text()));
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(backend)));
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  Collector out;
  if (!backend_->Encode(text, &out))
    return absl::InternalError(absl::StrCat("Encode: ", out.text()));
  return std::move(out.ids());
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids) const {
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

absl::StatusOr<bool> ReadAddBosToken(const std::string& model_dir) {
  std::ifstream in(std::filesystem::path(model_dir) / "tokenizer_config.json");
  if (!in) return true;
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config.json is not a JSON object");
  }
  if (!doc.contains("add_bos_token")) return true;
  if (!doc["add_bos_token"].is_boolean()) {
    return absl::InvalidArgumentError("tokenizer_config.json: add_bos_token must be a boolean");
  }
  return doc["add_bos_token"].get<bool>();
}

int32_t Tokenizer::vocab_size() const { return backend_->PieceSize(); }
int32_t Tokenizer::bos_id() const { return backend_->BosId(); }
int32_t Tokenizer::eos_id() const { return backend_->EosId(); }
int32_t Tokenizer::unk_id() const { return backend_->UnkId(); }
int32_t Tokenizer::pad_id() const { return backend_->PadId(); }

std::string Tokenizer::IdToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  Collector out;
  backend_->IdToPiece(id, &out);
  return std::move(out.text());
}

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && backend_->IsControl(id);
}

bool Tokenizer::IsByte(int32_t id) const {
  return id >= 0 && id < vocab_size() && backend_->IsByte(id);
}

// ---------------------------------------------------------------------------------------------
// StreamingDetokenizer
//
// Decoding is not piece-local: the first visible piece of a sequence loses its leading space,
// and consecutive byte pieces combine into characters. So each step decodes a short window
// twice, with and without the pending ids, and emits the difference; the window starts at an
// "anchor" id whose own text shields what follows from start-of-sequence handling.

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}

void StreamingDetokenizer::Reset() {
  ids_.clear();
  read_ = 0;
}

bool StreamingDetokenizer::IsAnchor(int32_t id) const {
  // A visible, non-byte piece: after it SentencePiece no longer strips a leading space, and no
  // byte run can span it. (A lone "▁" decodes to nothing at a sequence start, so it is not.)
  if (tokenizer_->IsControl(id) || tokenizer_->IsByte(id)) return false;
  absl::StatusOr<std::string> text = tokenizer_->Decode({id});
  return text.ok() && !text->empty();
}

absl::StatusOr<std::string> StreamingDetokenizer::Add(int32_t id) {
  if (id < 0 || id >= tokenizer_->vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token id ", id, " is outside the vocabulary [0, ", tokenizer_->vocab_size(), ")"));
  }
  ids_.push_back(id);
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
