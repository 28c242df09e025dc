// Equal-bytes baselines for mixed-width plans (docs/mixed-width.md): a tier plan only counts as
// a win if it beats both at the same expert bytes.
//   uniform         every routed expert narrowed to the same width
//   adaptive top-k  per token, its routed experts in descending router weight until they carry
//                   `mass` of the token's routed weight; the rest skipped, what runs scaled back
//                   to the routed total (the lowest-weighted experts dropped)
// Both count what they run as the tier policy does, so byte shares compare directly; a
// recorder keeps the routed weights a run saw, from which the adaptive mass that reads a given
// byte share is solved.
#pragma once

#include <cstdint>
#include <vector>

#include "common/engine/forward.h"
#include "common/moe/tiers.h"

namespace tandem::moe {

class UniformWidthPolicy : public engine::ExpertWidthPolicy {
 public:
  // width in [1, intermediate] (clamped).
  UniformWidthPolicy(int width, int intermediate);
  void Widths(int layer, absl::Span<const int32_t> experts, absl::Span<float> weights,
              absl::Span<int> widths) const override;
  WidthCounts counts() const { return counts_; }
  void ResetCounts() { counts_ = {}; }
  int width() const { return width_; }

 private:
  const int width_;
  mutable WidthCounts counts_;
};

class AdaptiveTopKPolicy : public engine::ExpertWidthPolicy {
 public:
  // mass in [0, 1]: the share of the routed weight the kept experts carry at least; the first
  // expert always runs.
  AdaptiveTopKPolicy(double mass, int intermediate, bool normalised);
  void Widths(int layer, absl::Span<const int32_t> experts, absl::Span<float> weights,
              absl::Span<int> widths) const override;
  WidthCounts counts() const { return counts_; }
  void ResetCounts() { counts_ = {}; }
  double mass() const { return mass_; }

 private:
  const double mass_;
  const int intermediate_;
  const bool normalised_;
  mutable WidthCounts counts_;
};

// Experts kept by the adaptive rule for one token's routed weights (descending).
int AdaptiveKept(absl::Span<const float> weights, double mass);

// Runs `inner` (null: every expert at full width) and records each decision's routed weights as
// given, before `inner` rewrites them.
class RoutingRecorder : public engine::ExpertWidthPolicy {
 public:
  RoutingRecorder(const engine::ExpertWidthPolicy* inner, int intermediate)
      : inner_(inner), intermediate_(intermediate) {}
  void Widths(int layer, absl::Span<const int32_t> experts, absl::Span<float> weights,
              absl::Span<int> widths) const override;
  // Every decision's top_k weights, back to back.
  const std::vector<float>& weights() const { return weights_; }
  void Clear() { weights_.clear(); }

 private:
  const engine::ExpertWidthPolicy* const inner_;
  const int intermediate_;
  mutable std::vector<float> weights_;
};

// The adaptive mass whose kept experts over `recorded` (RoutingRecorder::weights, `top_k` per
// decision) are closest to `byte_share` of them: the smallest mass reaching it, or 1. Mean kept
// experts grow with the mass, so it is found by bisection.
double AdaptiveMassForShare(const std::vector<float>& recorded, int top_k, double byte_share);

}  // namespace tandem::moe
