// Routing for dummy models (`--load-format dummy`), whose random router weights say nothing
// about how a trained router spreads tokens. The routing is stated instead: each layer ranks
// its experts in a fixed random order, and each token draws its top-k experts without
// replacement from a Zipf(s) distribution over that ranking (s = 0 is uniform). Draws are
// hashed from (seed, layer, token, position), so a sequence routes the same alone, batched or
// chunked, and a run is reproducible.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/forward.h"

namespace tandem::engine {

class ZipfRouter : public RouterOverride {
 public:
  // INVALID_ARGUMENT unless layers >= 1, experts >= 1 and 0 <= exponent <= 10.
  static absl::StatusOr<std::unique_ptr<ZipfRouter>> Create(int num_layers, int num_experts,
                                                            double exponent, uint64_t seed);
  // "uniform" or "zipf:S" (S a number, e.g. "zipf:1.2").
  static absl::StatusOr<std::unique_ptr<ZipfRouter>> FromSpec(const std::string& spec,
                                                              int num_layers, int num_experts,
                                                              uint64_t seed);

  void Logits(int layer, int32_t token, int position, absl::Span<float> logits) const override;

  // Probability that a single draw picks expert e of `layer` (its stated popularity).
  double Probability(int layer, int expert) const;
  double exponent() const { return exponent_; }

 private:
  ZipfRouter(double exponent, uint64_t seed, std::vector<std::vector<float>> log_p)
      : exponent_(exponent), seed_(seed), log_p_(std::move(log_p)) {}

  const double exponent_;
  const uint64_t seed_;
  const std::vector<std::vector<float>> log_p_;  // (layers, experts): log probability
};

}  // namespace tandem::engine
