// `tandem eval`: the full model against a pruning plan, run three ways (see docs/design.md,
// "Phase-decoupled pruning"):
//   full          every expert, prompt and continuation
//   conventional  the plan's experts for prompt and continuation (pruning as usually deployed)
//   handoff       the full pool for the prompt, the plan's experts for the continuation, on
//                 the prompt's KV cache (what the disaggregated cluster serves)
// Scoring: the protocol's windows (engine/perplexity.h) split into a prompt of `context` tokens
// and a teacher-forced continuation; perplexity and top-1 accuracy of the continuation.
// Generation: greedy continuations of prompts through the continuous-batching scheduler, with
// the mode's prefill and decode options, as a server runs them; their length distribution and
// agreement with the full model's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/forward.h"
#include "common/engine/model_weights.h"
#include "common/engine/perplexity.h"
#include "common/model/tokenizer.h"

namespace tandem::moe {

enum class EvalMode { kFull, kConventional, kHandoff };

// "full", "conventional" or "handoff"; INVALID_ARGUMENT otherwise.
absl::StatusOr<EvalMode> ParseEvalMode(const std::string& name);
std::string_view EvalModeName(EvalMode mode);

// What prompts and continuations run in `mode`: the pruned model is `plan`'s mask and, for a
// plan with tiers, `widths` (mixed width), and with a distilled decoder `overlay`'s always-on
// tensors; all unused for kFull and outliving the result.
struct PhaseOptions {
  engine::MoeOptions prefill;
  engine::MoeOptions decode;
};
PhaseOptions PhaseOptionsFor(EvalMode mode, const engine::ExpertMask* plan,
                             const engine::ExpertWidthPolicy* widths = nullptr,
                             const engine::DecoderOverlay* overlay = nullptr);

// Perplexity and top-1 accuracy over the scored tokens of `result` whose offset in their
// continuation is below `max_offset` (the tokens nearest the prompt, where a full prefill's
// KV cache matters most). Zero tokens give perplexity and accuracy 0.
struct ScoreSummary {
  int64_t tokens = 0;
  double perplexity = 0;
  double accuracy = 0;
};
ScoreSummary ScoreNearPrompt(const engine::PerplexityResult& result, int max_offset);

struct GenerationOptions {
  // The serving budget: a continuation not ended within it would have been cut there. Every
  // continuation still runs to its end or the context's, to tell a long answer from one that
  // never ends.
  int max_tokens = 128;
  int max_running = 32;  // sequences batched together
  // Strings that end a continuation as EOS does (at most 4, as a request's).
  std::vector<std::string> stop;
};

struct Continuation {
  std::vector<int32_t> tokens;  // the ending token (EOS, or the one completing a stop) included
  bool ended = false;           // by EOS or a stop string, rather than the context's end
};

// Greedy continuations of `prompts` (token ids, BOS included where the model wants it), in
// order. INVALID_ARGUMENT for bad options or a prompt that leaves no room in the context.
absl::StatusOr<std::vector<Continuation>> GenerateGreedy(
    const engine::ModelWeights& weights, const model::Tokenizer& tokenizer,
    const std::vector<std::vector<int32_t>>& prompts, const PhaseOptions& phases,
    const GenerationOptions& options);

struct GenerationStats {
  int64_t prompts = 0;
  double mean_length = 0;  // tokens to the end (or the context's end)
  double p50_length = 0;   // nearest-rank percentiles
  double p90_length = 0;
  double hit_max_share = 0;      // not ended within max_tokens
  double never_ended_share = 0;  // not ended before the context ran out
  // Against reference continuations (the full model's), each cut at max_tokens: the share
  // identical, and the mean share of the reference's tokens before the first difference.
  double exact_agreement = 1;
  double prefix_agreement = 1;
};

// Statistics of `continuations`; `reference`, when given, must be as many.
GenerationStats Summarize(const std::vector<Continuation>& continuations,
                          const std::vector<Continuation>* reference, int max_tokens);

// The non-blank lines of `path`, each tokenized as a prompt (BOS first when `add_bos`).
// NOT_FOUND for a missing file, INVALID_ARGUMENT for a file without prompts.
absl::StatusOr<std::vector<std::vector<int32_t>>> ReadPrompts(const model::Tokenizer& tokenizer,
                                                              const std::string& path,
                                                              bool add_bos);

}  // namespace tandem::moe
