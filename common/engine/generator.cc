#include "common/engine/generator.h"

#include "absl/strings/str_cat.h"
#include "common/engine/synthetic_router.h"
#include "common/util/clock.h"
#include "common/util/status.h"

namespace tandem::engine {
namespace {

constexpr int kBlockSize = 16;

}  // namespace

absl::Status LoadOptions::Validate() const {
  if (format == LoadFormat::kDummy && routing.empty()) {
    return absl::InvalidArgumentError(
        "dummy weights need a stated routing (uniform or zipf:S): their random router says "
        "nothing about how a trained one spreads tokens");
  }
  return absl::OkStatus();
}

absl::Status ApplyRouting(const LoadOptions& options, ForwardPass* forward) {
  if (options.routing.empty()) return absl::OkStatus();
  const model::ModelConfig& c = forward->weights().config;
  ASSIGN_OR_RETURN(std::unique_ptr<ZipfRouter> router,
                   ZipfRouter::FromSpec(options.routing, static_cast<int>(c.num_hidden_layers),
                                        static_cast<int>(c.num_local_experts), options.seed));
  forward->SetRouterOverride(std::move(router));
  return absl::OkStatus();
}

absl::StatusOr<LoadedModel> LoadModelDir(const model::ModelDir& dir, const LoadOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  LoadedModel loaded;
  ASSIGN_OR_RETURN(loaded.weights,
                   LoadModelWeights(dir, options.format, options.seed, options.only_experts));
  ASSIGN_OR_RETURN(loaded.tokenizer, dir.tokenizer());
  if (loaded.tokenizer->vocab_size() > loaded.weights->config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir.path(), ": the tokenizer has ", loaded.tokenizer->vocab_size(),
        " pieces, more than the config's vocab_size ", loaded.weights->config.vocab_size));
  }
  return loaded;
}

absl::StatusOr<std::unique_ptr<Generator>> Generator::Load(const model::ModelDir& dir,
                                                           int prefill_chunk,
                                                           const LoadOptions& options) {
  if (prefill_chunk < 1) return absl::InvalidArgumentError("prefill_chunk must be >= 1");
  std::unique_ptr<Generator> g(new Generator());
  g->prefill_chunk_ = prefill_chunk;
  ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelDir(dir, options));
  g->weights_ = std::move(loaded.weights);
  g->tokenizer_ = std::move(loaded.tokenizer);
  const model::ModelConfig& config = g->weights_->config;
  const int context = static_cast<int>(config.max_position_embeddings);
  const KvCacheConfig kv =
      KvCacheConfigFor(config, kBlockSize, (context + kBlockSize - 1) / kBlockSize,
                       kernels::KvDtype::kF32, /*max_sequences=*/1);
  ASSIGN_OR_RETURN(g->pool_, KvBlockPool::Create(kv));
  ASSIGN_OR_RETURN(g->forward_, ForwardPass::Create(g->weights_.get(), g->pool_.get()));
  RETURN_IF_ERROR(ApplyRouting(options, g->forward_.get()));
  return g;
}

absl::StatusOr<GenerationResult> Generator::Generate(
    const std::string& prompt, const SamplingParams& params,
    const std::function<void(const std::string&)>& on_text) {
  const model::ModelConfig& c = weights_->config;
  RETURN_IF_ERROR(params.Validate(static_cast<int>(c.vocab_size)));
  if (params.constraint.has_value()) {
    return absl::UnimplementedError(
        "output constraints run in the serving engine (Scheduler), not in Generator");
  }
  if (params.max_tokens < 1) {
    return absl::InvalidArgumentError("max_tokens must be at least 1 to generate");
  }
  GenerationResult result;
  if (tokenizer_->add_bos()) result.prompt_ids.push_back(tokenizer_->bos_id());
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer_->Encode(prompt));
  result.prompt_ids.insert(result.prompt_ids.end(), ids.begin(), ids.end());
  const int n = static_cast<int>(result.prompt_ids.size());
  const int context = static_cast<int>(c.max_position_embeddings);
  if (n >= context) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", n, " tokens; the context length is ", context));
  }
  const int max_new = std::min(params.max_tokens, context - n);

  BlockTable table;
  RETURN_IF_ERROR(table.Reserve(pool_.get(), n + max_new));
  Sampler sampler(params, result.prompt_ids);
  StopChecker stop(params, tokenizer_->eos_id());
  model::StreamingDetokenizer detok(tokenizer_.get());
  auto emit = [&](const std::string& text) {
    result.text += text;
    if (on_text && !text.empty()) on_text(text);
  };

  std::vector<std::vector<float>> logits;
  absl::Status status;
  const util::Instant start = util::Instant::Now();
  for (int begin = 0; begin < n && status.ok(); begin += prefill_chunk_) {
    const int len = std::min(prefill_chunk_, n - begin);
    StepInput in{absl::MakeConstSpan(result.prompt_ids).subspan(begin, len), begin, &table,
                 begin + len < n ? LogitRows::kNone : LogitRows::kLast};
    status = forward_->Step({&in, 1}, {}, &logits);
  }
  const util::Instant first = util::Instant::Now();
  result.prefill_seconds = absl::ToDoubleSeconds(first - start);
  while (status.ok()) {
    const int32_t token = sampler.Sample(logits[0]);
    result.output_ids.push_back(token);
    absl::StatusOr<std::string> piece = detok.Add(token);
    if (!piece.ok()) {
      status = piece.status();
      break;
    }
    StopResult r = stop.Add(token, *piece);
    emit(r.text);
    if (r.reason != FinishReason::kNone) {
      result.finish_reason = r.reason;
      break;
    }
    if (static_cast<int>(result.output_ids.size()) >= max_new) {
      // The context is full before max_tokens: a length finish, as vLLM reports it.
      emit(stop.Flush());
      absl::StatusOr<std::string> rest = detok.Flush();  // an incomplete character, if any
      if (rest.ok()) emit(*rest);
      result.finish_reason = FinishReason::kLength;
      break;
    }
    StepInput in{absl::MakeConstSpan(&result.output_ids.back(), 1),
                 n + static_cast<int>(result.output_ids.size()) - 1, &table};
    status = forward_->Step({&in, 1}, {}, &logits);
  }
  result.decode_seconds = absl::ToDoubleSeconds(util::Since(first));
  table.ReleaseAll(pool_.get());
  if (!status.ok()) return status;
  return result;
}

}  // namespace tandem::engine
