#include "common/engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
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
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens ", max_tokens, " is below 1"));
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
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params)
    : temperature_(params.temperature),
      top_p_(params.top_p),
      top_k_(params.top_k),
      seed_(params.seed.has_value() ? *params.seed : DrawSeed()),
      rng_(seed_) {}

void Sampler::SkipDraw() {
  if (temperature_ != 0.0f && top_k_ != 1) rng_();
}

int32_t Sampler::Sample(absl::Span<const float> logits) {
  TANDEM_CHECK(!logits.empty()) << "Sample needs at least one logit";
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
