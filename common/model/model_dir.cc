#include "common/model/model_dir.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/file.h"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;

// Configs, templates and tokenizer configs are small; anything larger is not one.
constexpr size_t kMaxSmallFileBytes = 64 << 20;

// The file's text; nullopt when it does not exist.
absl::StatusOr<std::optional<std::string>> ReadIfPresent(const fs::path& path) {
  absl::StatusOr<std::string> text = util::ReadFile(path.string(), kMaxSmallFileBytes);
  if (absl::IsNotFound(text.status())) return std::nullopt;
  if (!text.ok()) return text.status();
  return std::optional<std::string>(*std::move(text));
}

absl::Status InFile(const fs::path& path, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(path.string(), ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelDir>> ModelDir::Open(const std::string& path) {
  std::unique_ptr<ModelDir> dir(new ModelDir(path));
  const fs::path root(path);
  dir->name_ = ModelNameFromDir(path);

  const fs::path config_path = root / "config.json";
  absl::StatusOr<std::string> config_text =
      util::ReadFile(config_path.string(), kMaxSmallFileBytes);
  if (!config_text.ok()) {
    return absl::Status(config_text.status().code(),
                        absl::StrCat("model config: ", config_text.status().message()));
  }
  absl::StatusOr<ModelConfig> config = ParseModelConfig(*config_text);
  if (!config.ok()) return InFile(config_path, config.status());
  dir->config_ = *std::move(config);

  const fs::path tokenizer_config_path = root / "tokenizer_config.json";
  absl::StatusOr<std::optional<std::string>> tokenizer_config =
      ReadIfPresent(tokenizer_config_path);
  if (!tokenizer_config.ok()) return tokenizer_config.status();
  if (tokenizer_config->has_value()) {
    dir->tokenizer_config_json_ = **std::move(tokenizer_config);
    const auto doc = nlohmann::ordered_json::parse(dir->tokenizer_config_json_, nullptr,
                                                   /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(tokenizer_config_path.string(), " is not a JSON object"));
    }
    absl::StatusOr<TokenizerConfig> parsed = ParseTokenizerConfig(dir->tokenizer_config_json_);
    if (!parsed.ok()) return InFile(tokenizer_config_path, parsed.status());
    dir->tokenizer_config_ = *std::move(parsed);
    if (const auto it = doc.find("chat_template"); it != doc.end()) {
      dir->chat_template_config_ = *it;
    }
  }

  const fs::path generation_path = root / "generation_config.json";
  absl::StatusOr<std::optional<std::string>> generation = ReadIfPresent(generation_path);
  if (!generation.ok()) return generation.status();
  if (generation->has_value()) {
    absl::StatusOr<GenerationDefaults> parsed = ParseGenerationConfig(**generation);
    if (!parsed.ok()) return InFile(generation_path, parsed.status());
    dir->generation_ = *std::move(parsed);
  }

  absl::StatusOr<std::optional<std::string>> jinja = ReadIfPresent(root / "chat_template.jinja");
  if (!jinja.ok()) return jinja.status();
  dir->chat_template_file_ = *std::move(jinja);
  return dir;
}

std::string ModelDir::tokenizer_config_path() const {
  return (fs::path(path_) / "tokenizer_config.json").string();
}

std::string ModelDir::chat_template_origin() const {
  if (chat_template_file_.has_value()) return (fs::path(path_) / "chat_template.jinja").string();
  return tokenizer_config_path();
}

absl::StatusOr<std::shared_ptr<const Tokenizer>> ModelDir::tokenizer() const {
  absl::MutexLock lock(&mu_);
  if (!tokenizer_.has_value()) {
    absl::StatusOr<std::string> file = TokenizerFileIn(path_);
    absl::StatusOr<std::unique_ptr<Tokenizer>> loaded =
        file.ok() ? Tokenizer::LoadFile(*file, tokenizer_config_json_) : file.status();
    if (loaded.ok()) {
      tokenizer_.emplace(std::shared_ptr<const Tokenizer>(*std::move(loaded)));
    } else {
      tokenizer_.emplace(loaded.status());
    }
  }
  return *tokenizer_;
}

absl::StatusOr<const SafetensorsModel*> ModelDir::checkpoint() const {
  absl::MutexLock lock(&mu_);
  if (!checkpoint_.has_value()) checkpoint_.emplace(SafetensorsModel::Open(path_));
  if (!checkpoint_->ok()) return checkpoint_->status();
  return checkpoint_->value().get();
}

void ModelDir::ReleaseCheckpoint() {
  absl::MutexLock lock(&mu_);
  checkpoint_.reset();
}

}  // namespace tandem::model
