// Comparing the engine's logits with a reference's (the PyTorch model code in tools/train,
// stored as golden files): one tolerance for every model and checkpoint.
#pragma once

#include <algorithm>
#include <cmath>

namespace tandem::testing {

// The largest |a - b| over a row of logits, over the largest |b|: the engine computes in float32
// as PyTorch does, so rows agree to about 1e-6.
inline double NormalisedRowError(const float* a, const float* b, int n) {
  double err = 0, scale = 1e-6;
  for (int i = 0; i < n; ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return err / scale;
}

// The bound every golden comparison uses (measured ~1e-6 on every model).
inline constexpr double kLogitTolerance = 2e-5;

}  // namespace tandem::testing
