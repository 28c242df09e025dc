// Single-process generation for one prompt at a time: tokenizer + weights + paged KV cache +
// forward pass + sampling. This is what `tandem generate --model` runs; the services batch
// many sequences with a scheduler instead (issue #5).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/forward.h"
#include "common/engine/kv_cache.h"
#include "common/engine/model_weights.h"
#include "common/engine/sampling.h"
#include "common/model/model_dir.h"
#include "common/model/tokenizer.h"

namespace tandem::engine {

struct GenerationResult {
  std::vector<int32_t> prompt_ids;  // BOS included when the tokenizer config says so
  std::vector<int32_t> output_ids;
  std::string text;
  FinishReason finish_reason = FinishReason::kNone;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // after the first token
};

// A model directory loaded for the engine: config.json, model.safetensors (random weights for
// LoadFormat::kDummy) and the tokenizer (tokenizer.json or tokenizer.model; its add_bos() says
// whether text prompts start with BOS).
struct LoadedModel {
  std::unique_ptr<ModelWeights> weights;
  std::shared_ptr<const model::Tokenizer> tokenizer;  // the model directory's
};

struct LoadOptions {
  LoadFormat format = LoadFormat::kSafetensors;
  uint64_t seed = 0;  // of dummy weights and synthetic routing
  // The routing of a dummy model ("uniform" or "zipf:S", see synthetic_router.h): required
  // with dummy weights, whose random router says nothing; optional otherwise.
  std::string routing = {};
  // Load only these experts' weights (a pruned decoder's); empty: all. Steps on such a model
  // need a mask that retains no others.
  ExpertMask only_experts = {};

  // INVALID_ARGUMENT for dummy weights without a routing.
  absl::Status Validate() const;
};

absl::StatusOr<LoadedModel> LoadModelDir(const model::ModelDir& dir,
                                         const LoadOptions& options = {});

// Replaces `forward`'s router by `options.routing` (seeded by options.seed) when one is stated;
// nothing otherwise. INVALID_ARGUMENT for a spec that is not "uniform" or "zipf:S".
absl::Status ApplyRouting(const LoadOptions& options, ForwardPass* forward);

class Generator {
 public:
  // Loads `dir`'s weights and tokenizer. `prefill_chunk` bounds the tokens of one prefill step.
  static absl::StatusOr<std::unique_ptr<Generator>> Load(const model::ModelDir& dir,
                                                         int prefill_chunk = 256,
                                                         const LoadOptions& options = {});

  // Generates from `prompt` (tokenized here). `on_text`, when set, gets each piece of final
  // text as soon as it is known (stop strings already removed).
  absl::StatusOr<GenerationResult> Generate(
      const std::string& prompt, const SamplingParams& params,
      const std::function<void(const std::string&)>& on_text = nullptr);

  const model::ModelConfig& config() const { return weights_->config; }

 private:
  Generator() = default;

  std::unique_ptr<ModelWeights> weights_;
  std::shared_ptr<const model::Tokenizer> tokenizer_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<ForwardPass> forward_;
  int prefill_chunk_ = 256;
};

}  // namespace tandem::engine
