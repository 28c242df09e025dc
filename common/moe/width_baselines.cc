#include "common/moe/width_baselines.h"

#include <algorithm>
#include <cmath>

namespace tandem::moe {

UniformWidthPolicy::UniformWidthPolicy(int width, int intermediate)
    : width_(std::clamp(width, 1, intermediate)) {}

void UniformWidthPolicy::Widths(int, absl::Span<const int32_t>, absl::Span<float>,
                                absl::Span<int> widths) const {
  for (int& w : widths) w = width_;
  ++counts_.decisions;
  counts_.neurons += static_cast<int64_t>(width_) * static_cast<int64_t>(widths.size());
}

AdaptiveTopKPolicy::AdaptiveTopKPolicy(double mass, int intermediate, bool normalised)
    : mass_(std::clamp(mass, 0.0, 1.0)), intermediate_(intermediate), normalised_(normalised) {}

int AdaptiveKept(absl::Span<const float> weights, double mass) {
  double total = 0;
  for (float w : weights) total += w;
  const double target = mass * total * (1 - 1e-6);  // a mass of 1 keeps every expert exactly
  double kept = 0;
  int n = 0;
  while (n < static_cast<int>(weights.size())) {
    kept += weights[n++];
    if (kept >= target) break;
  }
  return std::max(n, 1);
}

void AdaptiveTopKPolicy::Widths(int, absl::Span<const int32_t>, absl::Span<float> weights,
                                absl::Span<int> widths) const {
  const int kept = AdaptiveKept(weights, mass_);
  for (size_t j = 0; j < widths.size(); ++j) {
    widths[j] = static_cast<int>(j) < kept ? intermediate_ : 0;
  }
  KeepRoutedWeight(widths, weights, normalised_);
  ++counts_.decisions;
  counts_.neurons += static_cast<int64_t>(kept) * intermediate_;
}

void RoutingRecorder::Widths(int layer, absl::Span<const int32_t> experts,
                             absl::Span<float> weights, absl::Span<int> widths) const {
  weights_.insert(weights_.end(), weights.begin(), weights.end());
  if (inner_ != nullptr) {
    inner_->Widths(layer, experts, weights, widths);
  } else {
    for (int& w : widths) w = intermediate_;
  }
}

double AdaptiveMassForShare(const std::vector<float>& recorded, int top_k, double byte_share) {
  if (top_k < 1 || recorded.size() < static_cast<size_t>(top_k)) return 1.0;
  const size_t decisions = recorded.size() / top_k;
  const auto share_at = [&](double mass) {
    int64_t kept = 0;
    for (size_t d = 0; d < decisions; ++d) {
      kept += AdaptiveKept(absl::MakeConstSpan(recorded.data() + d * top_k, top_k), mass);
    }
    return static_cast<double>(kept) / static_cast<double>(decisions * top_k);
  };
  double lo = 0, hi = 1;
  if (share_at(lo) >= byte_share) return lo;
  for (int i = 0; i < 40; ++i) {  // share_at(lo) < byte_share <= share_at(hi)
    const double mid = (lo + hi) / 2;
    (share_at(mid) < byte_share ? lo : hi) = mid;
  }
  // The two masses around the target: the one whose share is nearer.
  return std::abs(share_at(lo) - byte_share) < std::abs(share_at(hi) - byte_share) ? lo : hi;
}

}  // namespace tandem::moe
