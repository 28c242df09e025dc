// Per-sequence token sampling and stop conditions.
//
// Sampler turns one row of logits into a token: greedy at temperature 0, otherwise a draw from
// the temperature-scaled softmax restricted by top-k then top-p. Its PRNG is seeded per
// sequence, so the same seed and the same logits give the same tokens on every run.
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
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem::engine {

struct SamplingParams {
  static constexpr float kMaxTemperature = 2.0f;
  static constexpr int kMaxStopStrings = 4;
  static constexpr size_t kMaxStopStringBytes = 64;

  float temperature = 0.0f;      // 0 = greedy; else in (0, 2]
  float top_p = 1.0f;            // nucleus mass, in (0, 1]; 1 = off
  int top_k = 0;                 // 0 = off
  std::optional<uint64_t> seed;  // none: drawn from std::random_device
  int max_tokens = 16;           // generated tokens, EOS included
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;

  // INVALID_ARGUMENT naming the first bad field.
  absl::Status Validate(int vocab_size) const;
};

// Samples one sequence's tokens. Not thread-safe; the params should have passed Validate.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // logits: (vocab,), non-empty. Greedy returns the argmax, the lowest index on ties; NaN
  // logits count as -inf.
  int32_t Sample(absl::Span<const float> logits);

  // Advances the random stream past the draw one random Sample makes (none for greedy), so
  // that a decoder continuing a sequence whose first token another process sampled with the
  // same seed draws what a single process would have. (A degenerate distribution, all logits
  // non-finite, draws nothing; its sequence then diverges from the single-process one.)
  void SkipDraw();

  // The seed in use (params.seed or the drawn one); log it to reproduce a run.
  uint64_t seed() const { return seed_; }

 private:
  struct Candidate {
    double weight;  // unnormalised probability
    int32_t token;
  };

  const float temperature_;
  const float top_p_;
  const int top_k_;
  const uint64_t seed_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;  // scratch, (vocab,)
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
