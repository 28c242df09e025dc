#include "common/engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/kernels.h"
#include "common/util/logging.h"

namespace tandem::engine {
namespace {

uint64_t DrawSeed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// Lowest index of the largest logit; NaN never wins.
int32_t Argmax(absl::Span<const float> logits) {
  int32_t best = 0;
  float best_value = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > best_value) {
      best_value = logits[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

}  // namespace

absl::Status SamplingParams::Validate(int vocab_size) const {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size ", vocab_size, " is not positive"));
  }
  if (!(temperature >= 0.0f && temperature <= kMaxTemperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature ", temperature, " is outside [0, ", kMaxTemperature, "]"));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p ", top_p, " is outside (0, 1]"));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k ", top_k, " is negative"));
  }
  if (max_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens ", max_tokens, " is negative"));
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop_token_ids entry ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  if (stop_strings.size() > static_cast<size_t>(kMaxStopStrings)) {
    return absl::InvalidArgumentError(absl::StrCat("stop_strings has ", stop_strings.size(),
                                                   " entries; at most ", kMaxStopStrings));
  }
  for (const std::string& stop : stop_strings) {
    if (stop.empty() || stop.size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop_strings entry of ", stop.size(),
                                                     " bytes; each must be 1 to ",
                                                     kMaxStopStringBytes));
    }
  }
  for (const auto& [name, value] : {std::pair{"presence_penalty", presence_penalty},
                                    std::pair{"frequency_penalty", frequency_penalty}}) {
    if (!(value >= -kMaxPenalty && value <= kMaxPenalty)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " ", value, " is outside [-", kMaxPenalty, ", ", kMaxPenalty, "]"));
    }
  }
  if (!(repetition_penalty > 0.0f && repetition_penalty <= kMaxPenalty)) {
    return absl::InvalidArgumentError(absl::StrCat("repetition_penalty ", repetition_penalty,
                                                   " is outside (0, ", kMaxPenalty, "]"));
  }
  if (logit_bias.size() > kMaxLogitBias) {
    return absl::InvalidArgumentError(
        absl::StrCat("logit_bias has ", logit_bias.size(), " entries; at most ", kMaxLogitBias));
  }
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0 || token >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias token id ", token, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    if (!(bias >= -kMaxBias && bias <= kMaxBias)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias for token ", token, " is ", bias,
                                                     "; it must be in [-", kMaxBias, ", ", kMaxBias,
                                                     "]"));
    }
  }
  for (const auto& [name, value] :
       {std::pair{"logprobs", logprobs}, std::pair{"prompt_logprobs", prompt_logprobs}}) {
    if (value < -1 || value > kMaxLogprobs) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " ", value, " is outside [0, ", kMaxLogprobs, "] (or -1 for none)"));
    }
  }
  if (max_tokens == 0 && prompt_logprobs < 0) {
    return absl::InvalidArgumentError(
        "max_tokens 0 generates nothing; it is only for scoring a prompt (prompt_logprobs)");
  }
  return absl::OkStatus();
}

TokenLogprobs ComputeLogprobs(absl::Span<const float> logits, int32_t token, int top) {
  TANDEM_CHECK(!logits.empty()) << "ComputeLogprobs needs at least one logit";
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  const int n = static_cast<int>(logits.size());
  // The normaliser, vectorised; on logits that are not all finite (a NaN, an infinity) the
  // slow path, where NaN counts as -inf and nothing finite leaves every token at -inf.
  double log_z = kernels::cpu::LogSumExp(logits.data(), n);
  const bool finite = std::isfinite(log_z);  // then no logit is NaN or +inf
  bool degenerate = false;
  if (!finite) {
    float max_logit = kMinusInf;
    for (float x : logits) max_logit = std::max(max_logit, x);  // NaN never wins
    double sum = 0.0;
    if (std::isfinite(max_logit)) {
      for (float x : logits) {
        if (x == x) sum += std::exp(static_cast<double>(x) - max_logit);
      }
      log_z = max_logit + std::log(sum);
    } else {
      degenerate = true;
    }
  }
  auto logprob = [&](int32_t t) -> float {
    const float x = logits[t];
    if (degenerate || !(x == x)) return kMinusInf;
    return static_cast<float>(static_cast<double>(x) - log_z);
  };
  TokenLogprobs out;
  out.token = token;
  out.logprob = token >= 0 && token < n ? logprob(token) : kMinusInf;
  const int k = std::min(std::max(top, 0), n);
  if (k == 0) return out;
  std::vector<int32_t> best(k);
  if (finite) {
    kernels::cpu::TopK(logits.data(), n, k, best.data());
  } else {
    // NaN counts as -inf (and so, among equals, the lower id first).
    std::vector<float> cleaned(logits.begin(), logits.end());
    for (float& x : cleaned) {
      if (!(x == x)) x = kMinusInf;
    }
    kernels::cpu::reference::TopK(cleaned.data(), n, k, best.data());
  }
  out.top.reserve(k);
  for (int32_t t : best) out.top.push_back({t, logprob(t)});
  return out;
}

void AppendPromptLogprobs(absl::Span<const float> rows, int begin, int len,
                          absl::Span<const int32_t> prompt, int top,
                          std::vector<TokenLogprobs>* out) {
  TANDEM_CHECK(len > 0 && rows.size() % len == 0) << "rows are not (len, vocab)";
  const size_t vocab = rows.size() / len;
  for (int r = 0; r < len && static_cast<size_t>(begin + r + 1) < prompt.size(); ++r) {
    out->push_back(ComputeLogprobs(rows.subspan(r * vocab, vocab), prompt[begin + r + 1], top));
  }
}

Sampler::Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt)
    : temperature_(params.temperature),
      top_p_(params.top_p),
      top_k_(params.top_k),
      seed_(params.seed.has_value() ? *params.seed : DrawSeed()),
      penalties_(params.penalized() ? params : SamplingParams()),
      penalized_(params.penalized()),
      rng_(seed_) {
  if (penalized_ && penalties_.repetition_penalty != 1.0f)
    seen_.insert(prompt.begin(), prompt.end());
}

void Sampler::Record(int32_t token) {
  if (!penalized_) return;
  ++output_counts_[token];
  if (penalties_.repetition_penalty != 1.0f) seen_.insert(token);
}

void Sampler::SkipDraw(int32_t token) {
  if (temperature_ != 0.0f && top_k_ != 1) rng_();
  Record(token);
}

int32_t Sampler::Sample(absl::Span<const float> raw) {
  TANDEM_CHECK(!raw.empty()) << "Sample needs at least one logit";
  absl::Span<const float> logits = raw;
  if (penalized_) {
    adjusted_.assign(raw.begin(), raw.end());
    const int64_t vocab = static_cast<int64_t>(adjusted_.size());
    for (const auto& [token, bias] : penalties_.logit_bias) {
      if (token < vocab) adjusted_[token] += bias;
    }
    const float repetition = penalties_.repetition_penalty;
    if (repetition != 1.0f) {
      for (int32_t token : seen_) {
        if (token < 0 || token >= vocab) continue;
        float& x = adjusted_[token];
        x = x > 0.0f ? x / repetition : x * repetition;
      }
    }
    for (const auto& [token, count] : output_counts_) {
      if (token < 0 || token >= vocab) continue;
      adjusted_[token] -=
          penalties_.frequency_penalty * static_cast<float>(count) + penalties_.presence_penalty;
    }
    logits = adjusted_;
  }
  const int32_t token = Draw(logits);
  Record(token);
  return token;
}

int32_t Sampler::Draw(absl::Span<const float> logits) {
  const int32_t argmax = Argmax(logits);
  if (temperature_ == 0.0f || top_k_ == 1) return argmax;
  const float max_logit = logits[argmax];
  // All -inf / NaN, or a +inf logit: the distribution degenerates to the argmax.
  if (!std::isfinite(max_logit)) return argmax;

  // Weights relative to the max logit cannot overflow; the argmax has weight 1, so at least
  // one candidate survives.
  const double inv_temperature = 1.0 / temperature_;
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    const double weight = std::exp((static_cast<double>(logits[i]) - max_logit) * inv_temperature);
    if (weight > 0.0) candidates_.push_back({weight, static_cast<int32_t>(i)});
  }
  // A total order, so that ties are cut the same way on every run.
  const auto more_likely = [](const Candidate& a, const Candidate& b) {
    return a.weight > b.weight || (a.weight == b.weight && a.token < b.token);
  };
  if (top_k_ > 0 && static_cast<size_t>(top_k_) < candidates_.size()) {
    std::nth_element(candidates_.begin(), candidates_.begin() + top_k_, candidates_.end(),
                     more_likely);
    candidates_.resize(top_k_);
  }
  if (top_p_ < 1.0f) {
    std::sort(candidates_.begin(), candidates_.end(), more_likely);
    double total = 0.0;
    for (const Candidate& c : candidates_) total += c.weight;
    const double threshold = top_p_ * total;
    double mass = 0.0;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      mass += candidates_[i].weight;
      if (mass >= threshold) {
        candidates_.resize(i + 1);
        break;
      }
    }
  }

  double total = 0.0;
  for (const Candidate& c : candidates_) total += c.weight;
  // 53 random bits -> [0, 1), the same on every standard library (unlike
  // std::uniform_real_distribution).
  const double target = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double mass = 0.0;
  for (const Candidate& c : candidates_) {
    mass += c.weight;
    if (target < mass) return c.token;
  }
  return candidates_.back().token;  // rounding left target at the very top
}

StopChecker::StopChecker(const SamplingParams& params, int32_t eos_token_id)
    : eos_token_id_(eos_token_id),
      ignore_eos_(params.ignore_eos),
      max_tokens_(params.max_tokens),
      stop_token_ids_(params.stop_token_ids),
      stop_strings_(params.stop_strings) {}

StopResult StopChecker::Add(int32_t token, absl::string_view new_text) {
  TANDEM_CHECK(!finished_) << "StopChecker::Add after the sequence finished";
  ++num_tokens_;
  StopResult result;
  const bool is_eos = !ignore_eos_ && token == eos_token_id_;
  if (is_eos ||
      std::find(stop_token_ids_.begin(), stop_token_ids_.end(), token) != stop_token_ids_.end()) {
    // Held text precedes the stop; with generation over it can no longer become a stop string.
    result.reason = FinishReason::kStop;
    result.stop_token = token;
    result.text = std::exchange(held_, {});
    finished_ = true;
    return result;
  }

  held_.append(new_text.data(), new_text.size());
  // Text before held_ was emitted only because no stop string could start there, so searching
  // held_ finds every possible match; the earliest one wins.
  size_t match_pos = std::string::npos;
  const std::string* match = nullptr;
  for (const std::string& stop : stop_strings_) {
    const size_t pos = held_.find(stop);
    if (pos < match_pos) {
      match_pos = pos;
      match = &stop;
    }
  }
  if (match != nullptr) {
    result.reason = FinishReason::kStop;
    result.stop_string = *match;
    result.text = held_.substr(0, match_pos);
    held_.clear();
    finished_ = true;
  } else if (num_tokens_ >= max_tokens_) {
    result.reason = FinishReason::kLength;
    result.text = std::exchange(held_, {});
    finished_ = true;
  } else {
    const size_t emit = held_.size() - HeldBackLength();
    result.text = held_.substr(0, emit);
    held_.erase(0, emit);
  }
  return result;
}

std::string StopChecker::Flush() { return std::exchange(held_, {}); }

size_t StopChecker::HeldBackLength() const {
  size_t longest = 0;
  for (const std::string& stop : stop_strings_) {
    for (size_t len = std::min(stop.size() - 1, held_.size()); len > longest; --len) {
      if (held_.compare(held_.size() - len, len, stop, 0, len) == 0) {
        longest = len;
        break;
      }
    }
  }
  return longest;
}

}  // namespace tandem::engine
