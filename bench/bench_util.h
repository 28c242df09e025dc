// What the benchmark binaries share: timing, medians and the --batches list.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace tandem::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The upper median; 0 for no values.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// "1,4,16" -> {1, 4, 16}; nullopt when an entry is not a positive integer.
inline std::optional<std::vector<int>> ParseBatches(const std::string& list) {
  std::vector<int> batches;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    int b = 0;
    if (!absl::SimpleAtoi(part, &b) || b < 1) return std::nullopt;
    batches.push_back(b);
  }
  return batches;
}

}  // namespace tandem::bench
