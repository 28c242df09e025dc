#include "common/moe/evaluation.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/engine/kv_cache.h"
#include "common/engine/scheduler.h"
#include "common/util/status.h"

namespace tandem::moe {
namespace {

constexpr int kBlockSize = 16;

// Nearest-rank percentile of sorted values.
double Percentile(const std::vector<int>& sorted, double q) {
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::max<size_t>(rank, 1) - 1];
}

}  // namespace

absl::StatusOr<EvalMode> ParseEvalMode(const std::string& name) {
  if (name == "full") return EvalMode::kFull;
  if (name == "conventional") return EvalMode::kConventional;
  if (name == "handoff") return EvalMode::kHandoff;
  return absl::InvalidArgumentError(
      absl::StrCat("mode \"", name, "\" is not full, conventional or handoff"));
}

std::string_view EvalModeName(EvalMode mode) {
  switch (mode) {
    case EvalMode::kFull:
      return "full";
    case EvalMode::kConventional:
      return "conventional";
    case EvalMode::kHandoff:
      return "handoff";
  }
  return "?";
}

PhaseOptions PhaseOptionsFor(EvalMode mode, const engine::ExpertMask* plan,
                             const engine::ExpertWidthPolicy* widths,
                             const engine::DecoderOverlay* overlay) {
  PhaseOptions phases;
  const engine::MoeOptions pruned{.mask = plan, .widths = widths, .overlay = overlay};
  if (mode == EvalMode::kConventional) phases.prefill = pruned;
  if (mode != EvalMode::kFull) phases.decode = pruned;
  return phases;
}

ScoreSummary ScoreNearPrompt(const engine::PerplexityResult& result, int max_offset) {
  ScoreSummary summary;
  double nll = 0, correct = 0;
  for (size_t t = 0; t < result.logprobs.size(); ++t) {
    if (result.offsets[t] >= max_offset) continue;
    ++summary.tokens;
    nll -= result.logprobs[t];
    correct += result.top1[t];
  }
  if (summary.tokens > 0) {
    summary.perplexity = std::exp(nll / static_cast<double>(summary.tokens));
    summary.accuracy = correct / static_cast<double>(summary.tokens);
  }
  return summary;
}

absl::StatusOr<std::vector<Continuation>> GenerateGreedy(
    const engine::ModelWeights& weights, const model::Tokenizer& tokenizer,
    const std::vector<std::vector<int32_t>>& prompts, const PhaseOptions& phases,
    const GenerationOptions& options) {
  if (options.max_tokens < 1 || options.max_running < 1) {
    return absl::InvalidArgumentError("max_tokens and max_running must be >= 1");
  }
  const model::ModelConfig& c = weights.config;
  const int context = static_cast<int>(c.max_position_embeddings);
  const int blocks_per_sequence = (context + kBlockSize - 1) / kBlockSize;
  ASSIGN_OR_RETURN(std::unique_ptr<engine::KvBlockPool> pool,
                   engine::KvBlockPool::Create(engine::KvCacheConfigFor(
                       c, kBlockSize, options.max_running * blocks_per_sequence,
                       kernels::KvDtype::kF32, options.max_running)));
  ASSIGN_OR_RETURN(std::unique_ptr<engine::ForwardPass> forward,
                   engine::ForwardPass::Create(&weights, pool.get()));
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Scheduler> scheduler,
                   engine::Scheduler::Create(forward.get(), &tokenizer, tokenizer.eos_id(),
                                             {.max_running = options.max_running,
                                              .max_step_tokens = std::max(512, options.max_running),
                                              .prefill = phases.prefill,
                                              .decode = phases.decode}));
  std::vector<Continuation> out(prompts.size());
  absl::flat_hash_map<engine::SequenceId, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::SequenceRequest request{prompts[i], {}};
    request.params.temperature = 0;
    request.params.max_tokens = context;  // the scheduler ends a sequence at the context's end
    request.params.stop_strings = options.stop;
    absl::StatusOr<engine::SequenceId> id = scheduler->Add(std::move(request));
    if (!id.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt ", i + 1, ": ", id.status().message()));
    }
    index[*id] = i;
  }
  std::vector<engine::SequenceOutput> outputs;
  while (!scheduler->idle()) {
    outputs.clear();
    RETURN_IF_ERROR(scheduler->Step(&outputs));
    for (const engine::SequenceOutput& o : outputs) {
      RETURN_IF_ERROR(o.status);
      Continuation& cont = out[index.at(o.id)];
      if (o.token.has_value()) cont.tokens.push_back(*o.token);
      if (o.finish == engine::FinishReason::kStop) cont.ended = true;
    }
  }
  return out;
}

GenerationStats Summarize(const std::vector<Continuation>& continuations,
                          const std::vector<Continuation>* reference, int max_tokens) {
  GenerationStats stats;
  stats.prompts = static_cast<int64_t>(continuations.size());
  if (continuations.empty()) return stats;
  std::vector<int> lengths;
  double exact = 0, prefix = 0;
  for (size_t i = 0; i < continuations.size(); ++i) {
    const Continuation& cont = continuations[i];
    lengths.push_back(static_cast<int>(cont.tokens.size()));
    stats.hit_max_share += !cont.ended || static_cast<int>(cont.tokens.size()) > max_tokens;
    stats.never_ended_share += !cont.ended;
    if (reference == nullptr) continue;
    const std::vector<int32_t>& ref = (*reference)[i].tokens;
    const size_t ref_len = std::min<size_t>(ref.size(), max_tokens);
    const size_t our_len = std::min<size_t>(cont.tokens.size(), max_tokens);
    size_t common = 0;
    while (common < ref_len && common < our_len && ref[common] == cont.tokens[common]) ++common;
    exact += common == ref_len && common == our_len;
    prefix += ref_len == 0 ? 1.0 : static_cast<double>(common) / static_cast<double>(ref_len);
  }
  const double n = static_cast<double>(continuations.size());
  std::sort(lengths.begin(), lengths.end());
  double total = 0;
  for (int len : lengths) total += len;
  stats.mean_length = total / n;
  stats.p50_length = Percentile(lengths, 0.5);
  stats.p90_length = Percentile(lengths, 0.9);
  stats.hit_max_share /= n;
  stats.never_ended_share /= n;
  if (reference != nullptr) {
    stats.exact_agreement = exact / n;
    stats.prefix_agreement = prefix / n;
  }
  return stats;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> ReadPrompts(const model::Tokenizer& tokenizer,
                                                              const std::string& path,
                                                              bool add_bos) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) return absl::NotFoundError(absl::StrCat("cannot read prompts file ", path));
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(line));
    if (add_bos) ids.insert(ids.begin(), tokenizer.bos_id());
    prompts.push_back(std::move(ids));
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("prompts file ", path, " has no prompt"));
  }
  return prompts;
}

}  // namespace tandem::moe
