#include "common/engine/synthetic_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/util/hash.h"

namespace tandem::engine {
namespace {

using util::SplitMix64;

}  // namespace

absl::StatusOr<std::unique_ptr<ZipfRouter>> ZipfRouter::Create(int num_layers, int num_experts,
                                                               double exponent, uint64_t seed) {
  if (num_layers < 1 || num_experts < 1) {
    return absl::InvalidArgumentError("a synthetic router needs at least one layer and expert");
  }
  if (!(exponent >= 0 && exponent <= 10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Zipf exponent ", exponent, " is outside [0, 10]"));
  }
  std::mt19937_64 rng(seed);
  std::vector<std::vector<float>> log_p(num_layers);
  for (auto& layer : log_p) {
    std::vector<int> rank(num_experts);
    std::iota(rank.begin(), rank.end(), 0);
    std::shuffle(rank.begin(), rank.end(), rng);
    double total = 0;
    for (int r = 1; r <= num_experts; ++r) total += std::pow(r, -exponent);
    layer.resize(num_experts);
    for (int e = 0; e < num_experts; ++e) {
      layer[e] = static_cast<float>(-exponent * std::log(rank[e] + 1.0) - std::log(total));
    }
  }
  return std::unique_ptr<ZipfRouter>(new ZipfRouter(exponent, seed, std::move(log_p)));
}

absl::StatusOr<std::unique_ptr<ZipfRouter>> ZipfRouter::FromSpec(const std::string& spec,
                                                                 int num_layers, int num_experts,
                                                                 uint64_t seed) {
  double exponent = 0;
  if (spec == "uniform") {
    exponent = 0;
  } else if (!absl::StartsWith(spec, "zipf:") || !absl::SimpleAtod(spec.substr(5), &exponent)) {
    return absl::InvalidArgumentError(
        absl::StrCat("routing \"", spec, "\" is not \"uniform\" or \"zipf:S\" (e.g. zipf:1.2)"));
  }
  return Create(num_layers, num_experts, exponent, seed);
}

double ZipfRouter::Probability(int layer, int expert) const {
  return std::exp(static_cast<double>(log_p_[layer][expert]));
}

// Gumbel-top-k: the k largest of log p + Gumbel noise are k draws without replacement from p.
void ZipfRouter::Logits(int layer, int32_t token, int position, absl::Span<float> logits) const {
  const auto& log_p = log_p_[layer];
  uint64_t key =
      SplitMix64(seed_ ^ SplitMix64((uint64_t(layer) << 40) ^ (uint64_t(uint32_t(token)) << 8) ^
                                    SplitMix64(uint64_t(uint32_t(position)))));
  for (size_t e = 0; e < logits.size(); ++e) {
    key = SplitMix64(key);
    const double u = (static_cast<double>(key >> 11) + 0.5) * 0x1p-53;  // in (0, 1)
    logits[e] = log_p[e] - static_cast<float>(std::log(-std::log(u)));
  }
}

}  // namespace tandem::engine
