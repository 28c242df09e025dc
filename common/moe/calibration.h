// Calibration statistics for expert pruning (issue #6) and mixed-width experts (#7): one pass
// of the full model over calibration text, per layer and expert. X_e is the set of calibration
// tokens routed to expert e (among its top-k), g_e(x) the router probability (the full softmax,
// before top-k renormalisation) and E_e(x) the expert's output before the router weight.
//   frequency[e]   |X_e|
//   mass[e]        sum over X_e of g_e(x)
//   ean[e]         sum over X_e of ||E_e(x)||_2
//   reap[e]        mean over X_e of g_e(x) * ||E_e(x)||_2 (0 when X_e is empty)
//   pairs          for every token, the unordered pair of its two leading experts (highest
//                  router weights; with top-2 its only pair): (a < b) -> count
//   pair_a_first   of those, how often a had the higher router weight (the router-weight
//                  heuristic for a pair's dominant expert)
//   neuron_importance[e][i]  sum over X_e of |silu(gate_i) * up_i| (neuron i's activation)
// Stored as JSON (ToJson / FromJson): {"format": "tandem-calibration-v1", "model", "text",
// "text_sha256" (of the text file's bytes), "tokens", "layers": [{"frequency", "mass", "ean",
// "reap", "pairs": [[a, b, count, a_first], ...], "neuron_importance": [[...] per expert]}]}.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/forward.h"
#include "common/model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace tandem::moe {

struct LayerStats {
  std::vector<int64_t> frequency;                       // (experts,)
  std::vector<double> mass;                             // (experts,)
  std::vector<double> ean;                              // (experts,)
  std::vector<double> reap;                             // (experts,)
  std::map<std::pair<int, int>, int64_t> pairs;         // (a < b) -> tokens
  std::map<std::pair<int, int>, int64_t> pair_a_first;  // (a < b) -> tokens with a ranked first
  std::vector<std::vector<double>> neuron_importance;   // (experts, intermediate)
};

struct CalibrationStats {
  std::string model;
  std::string text;
  std::string text_sha256;  // hex, of the text file's bytes
  int64_t tokens = 0;
  std::vector<LayerStats> layers;

  nlohmann::json ToJson() const;
  // INVALID_ARGUMENT naming what is wrong with a malformed document.
  static absl::StatusOr<CalibrationStats> FromJson(const nlohmann::json& doc);
};

// Reads statistics written by `tandem calibrate`: NOT_FOUND for a missing file,
// INVALID_ARGUMENT naming the file for anything else wrong.
absl::StatusOr<CalibrationStats> LoadCalibrationStats(const std::string& path);

// Accumulates statistics over forward steps. Attach it to a ForwardPass with
// SetExpertObserver, run steps with a RouterTrace, and hand each trace to AddStep.
class Calibrator : public engine::ExpertObserver {
 public:
  explicit Calibrator(const model::ModelConfig& config);

  void OnExpert(int layer, int expert, int width, absl::Span<const int> tokens, const float* act,
                const float* out) override;
  // Folds in one step: its trace (router probabilities and choices) and the expert outputs
  // observed during it. INVALID_ARGUMENT if the trace does not match the observations.
  absl::Status AddStep(const engine::RouterTrace& trace);

  CalibrationStats Finish() const;

 private:
  const int hidden_, inter_, experts_, top_k_;
  CalibrationStats stats_;
  std::vector<double> reap_sum_;  // (layers * experts)
  // This step's output norms, per layer: (token, expert) -> ||E_e(x)||.
  std::vector<std::map<std::pair<int, int>, double>> step_norms_;
};

// Runs the full model over the documents of `text_path`, read by the evaluation protocol
// (engine/perplexity.h), and returns the statistics. `progress`, if set, gets the fraction done.
absl::StatusOr<CalibrationStats> Calibrate(engine::ForwardPass* forward,
                                           const model::Tokenizer& tokenizer,
                                           const std::string& text_path,
                                           const std::function<void(double)>& progress = nullptr);

}  // namespace tandem::moe
