// Per-sequence token sampling and stop conditions.
//
// Sampler turns one row of logits into a token. It first adjusts the logits as vLLM does, in
// vLLM's order: logit_bias is added; then the repetition penalty (tokens of the prompt or the
// output: a positive logit divided by it, a negative one multiplied), the frequency penalty
// (times each token's count in the output) and the presence penalty (once for each token in
// the output) are applied. Then it picks greedily at temperature 0, otherwise draws from the
// temperature-scaled softmax restricted by top-k then top-p. Its PRNG is seeded per sequence,
// so the same seed and the same logits give the same tokens on every run.
//
// Log-probabilities (ComputeLogprobs) are always those of the model's own distribution: the
// log-softmax of the raw logits, before bias, penalties, temperature, top-k and top-p (vLLM's
// default, "raw_logprobs").
//
// StopChecker decides after each token whether generation ends and which text may be shown.
// Stop strings are matched across token boundaries, and text that could still turn out to be
// the start of a stop string is held back, so a streaming caller never shows text it would
// have to retract. The stop string and anything after it are never emitted (as in OpenAI and
// vLLM); neither is the text of an EOS or stop token.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/structured/constraint.h"

namespace tandem::engine {

struct SamplingParams {
  static constexpr float kMaxTemperature = 2.0f;
  static constexpr int kMaxStopStrings = 4;
  static constexpr size_t kMaxStopStringBytes = 64;
  static constexpr int kMaxLogprobs = 20;  // alternatives per token, as vLLM's default limit
  static constexpr size_t kMaxLogitBias = 1024;
  static constexpr float kMaxPenalty = 2.0f;  // |presence|, |frequency|; repetition's upper end
  static constexpr float kMaxBias = 100.0f;

  float temperature = 0.0f;      // 0 = greedy; else in (0, 2]
  float top_p = 1.0f;            // nucleus mass, in (0, 1]; 1 = off
  int top_k = 0;                 // 0 = off
  std::optional<uint64_t> seed;  // none: drawn from std::random_device
  int max_tokens = 16;           // generated tokens, EOS included
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;
  float presence_penalty = 0.0f;                      // [-2, 2]; 0 = off
  float frequency_penalty = 0.0f;                     // [-2, 2]; 0 = off
  float repetition_penalty = 1.0f;                    // (0, 2]; 1 = off
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, bias in [-100, 100])
  // -1: none. k in [0, 20]: each sampled token's log-probability and the k most likely.
  int logprobs = -1;
  // -1: none. k in [0, 20]: the same for every prompt token after the first. With it,
  // max_tokens may be 0: the prompt is only scored.
  int prompt_logprobs = -1;
  // The output must be of this form (docs/structured-outputs.md): each token is drawn from
  // those the constraint allows next, and the sequence ends when it is complete. Unset: free.
  std::optional<structured::OutputConstraint> constraint;

  bool penalized() const {
    return !logit_bias.empty() || presence_penalty != 0.0f || frequency_penalty != 0.0f ||
           repetition_penalty != 1.0f;
  }

  // INVALID_ARGUMENT naming the first bad field.
  absl::Status Validate(int vocab_size) const;
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

// One position's log-probabilities: the chosen token's, and the most likely tokens'.
struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // most likely first, the lower id first on ties
};

// The log-softmax of `logits` (float32, accumulated in double) at `token`, and the `top` most
// likely tokens (at most the vocabulary). NaN logits count as -inf.
TokenLogprobs ComputeLogprobs(absl::Span<const float> logits, int32_t token, int top);

// Scoring a prompt chunk by chunk: `rows` are the (len, vocab) logits of prompt positions
// [begin, begin + len); row r predicts prompt[begin + r + 1]. Appends the log-probabilities of
// each such token that is in the prompt, with `top` alternatives each.
void AppendPromptLogprobs(absl::Span<const float> rows, int begin, int len,
                          absl::Span<const int32_t> prompt, int top,
                          std::vector<TokenLogprobs>* out);

// Samples one sequence's tokens. Not thread-safe; the params should have passed Validate.
class Sampler {
 public:
  // `prompt`: the tokens the repetition penalty counts besides the output.
  explicit Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt = {});

  // logits: (vocab,), non-empty. Greedy returns the argmax of the adjusted logits, the lowest
  // index on ties; NaN logits count as -inf. The token counts as output for the penalties.
  int32_t Sample(absl::Span<const float> logits);

  // Takes `token`, which another process sampled with the same params and seed, as this
  // sampler's: advances the random stream past the draw one random Sample makes (none for
  // greedy) and counts the token for the penalties, so that a decoder continuing the sequence
  // draws what a single process would have. (A degenerate distribution, all logits
  // non-finite, draws nothing; its sequence then diverges from the single-process one.)
  void SkipDraw(int32_t token);

  // The seed in use (params.seed or the drawn one); log it to reproduce a run.
  uint64_t seed() const { return seed_; }

 private:
  struct Candidate {
    double weight;  // unnormalised probability
    int32_t token;
  };

  // Picks from already adjusted logits.
  int32_t Draw(absl::Span<const float> logits);
  // Counts `token` as output, for the penalties.
  void Record(int32_t token);

  const float temperature_;
  const float top_p_;
  const int top_k_;
  const uint64_t seed_;
  const SamplingParams penalties_;  // when params.penalized(), else unused
  const bool penalized_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;  // scratch, (vocab,)
  std::vector<float> adjusted_;        // scratch, (vocab,)
  absl::flat_hash_map<int32_t, int> output_counts_;
  absl::flat_hash_set<int32_t> seen_;  // prompt or output tokens (repetition penalty)
};

enum class FinishReason { kNone, kStop, kLength };

struct StopResult {
  FinishReason reason = FinishReason::kNone;
  // Text that may be shown now, in order; over a whole sequence the pieces concatenate to
  // the output text.
  std::string text;
  std::optional<int32_t> stop_token;       // EOS or stop token that ended the sequence
  std::optional<std::string> stop_string;  // stop string that ended the sequence
};

// Decides when one sequence stops. Feed every generated token with the text it added to the
// detokenized output (possibly empty); stop after a result whose reason is not kNone.
class StopChecker {
 public:
  StopChecker(const SamplingParams& params, int32_t eos_token_id);

  // Checks, in order: EOS (unless ignore_eos), stop tokens, stop strings, max_tokens.
  // CHECK-fails when called after the sequence finished.
  StopResult Add(int32_t token, absl::string_view new_text);

  // Returns the held-back text, for a caller that ends the sequence for its own reason
  // (cancelled, context full).
  std::string Flush();

  int num_tokens() const { return num_tokens_; }
  bool finished() const { return finished_; }

 private:
  // Length of the longest suffix of held_ that is a proper prefix of some stop string.
  size_t HeldBackLength() const;

  const int32_t eos_token_id_;
  const bool ignore_eos_;
  const int max_tokens_;
  const std::vector<int32_t> stop_token_ids_;
  const std::vector<std::string> stop_strings_;
  std::string held_;  // text not yet emitted; it is shorter than the longest stop string
  int num_tokens_ = 0;
  bool finished_ = false;
};

}  // namespace tandem::engine
