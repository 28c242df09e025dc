// A model directory as Hugging Face publishes one (docs/models.md), read once and handed to
// every loader: the engine's weights, the tokenizer, the chat template, the generation defaults,
// pruning plans, KV geometry. Opening reads the small files (config.json, tokenizer_config.json,
// generation_config.json, chat_template.jinja) and refuses a malformed one naming the file and
// the key; the checkpoint and the tokenizer are read when first asked for, once, and kept.
//
// Thread-safe: every accessor may be called from any thread.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/model/config.h"
#include "common/model/generation_config.h"
#include "common/model/hf_tokenizer.h"
#include "common/model/safetensors.h"
#include "common/model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace tandem::model {

class ModelDir {
 public:
  // Reads DIR/config.json (NOT_FOUND when absent) and, where present, tokenizer_config.json,
  // generation_config.json and chat_template.jinja. INVALID_ARGUMENT naming the file for a
  // malformed one.
  static absl::StatusOr<std::unique_ptr<ModelDir>> Open(const std::string& path);

  ModelDir(const ModelDir&) = delete;
  ModelDir& operator=(const ModelDir&) = delete;

  const std::string& path() const { return path_; }
  // The name the model is served under: the directory's last path component.
  const std::string& name() const { return name_; }
  const ModelConfig& config() const { return config_; }
  // tokenizer_config.json's special tokens and flags (all unset without the file).
  const TokenizerConfig& tokenizer_config() const { return tokenizer_config_; }
  // generation_config.json's defaults (none without the file).
  const GenerationDefaults& generation() const { return generation_; }

  // The chat template as published, uninterpreted (common/chat/chat_template.h reads it):
  // chat_template.jinja's text when that file exists, else tokenizer_config.json's
  // "chat_template" value (a string or a list of {"name", "template"}; null when absent),
  // and the file it came from.
  const std::optional<std::string>& chat_template_file() const { return chat_template_file_; }
  const nlohmann::ordered_json& chat_template_config() const { return chat_template_config_; }
  std::string chat_template_origin() const;
  std::string tokenizer_config_path() const;

  // The tokenizer (tokenizer.json, else tokenizer.model; NOT_FOUND naming both when neither is
  // there), loaded on the first call; later calls return the same one, or the same error.
  absl::StatusOr<std::shared_ptr<const Tokenizer>> tokenizer() const;
  // The safetensors checkpoint (model.safetensors or the sharded index), opened and its headers
  // validated on the first call, mapped as long as this object lives.
  absl::StatusOr<const SafetensorsModel*> checkpoint() const;
  // Unmaps the checkpoint once whatever read it holds its own copies (the engine's weights); a
  // later checkpoint() opens it again.
  void ReleaseCheckpoint();

 private:
  explicit ModelDir(std::string path) : path_(std::move(path)) {}

  std::string path_;
  std::string name_;
  ModelConfig config_;
  std::string tokenizer_config_json_;  // empty without the file
  TokenizerConfig tokenizer_config_;
  GenerationDefaults generation_;
  std::optional<std::string> chat_template_file_;
  nlohmann::ordered_json chat_template_config_;

  mutable absl::Mutex mu_;
  mutable std::optional<absl::StatusOr<std::shared_ptr<const Tokenizer>>> tokenizer_
      ABSL_GUARDED_BY(mu_);
  mutable std::optional<absl::StatusOr<std::unique_ptr<SafetensorsModel>>> checkpoint_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::model
