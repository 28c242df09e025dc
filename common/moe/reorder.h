// Neuron reordering for mixed-width experts (docs/design.md, "Combination-aware mixed-width
// experts"): each expert's FFN neurons are permuted so that the most important on calibration
// data come first — gate (w1) and up (w3) rows and down (w2) columns alike. The reordered
// expert computes the same function at full width (a sum over the same neurons in another
// order), so prefill may load the reordered checkpoint too, and a width-k execution, which runs
// the first k neurons, keeps the k most important ones.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model/model_dir.h"
#include "common/moe/calibration.h"

namespace tandem::moe {

// Neuron indices by descending importance, ties to the lower index: order[0] is the most
// important neuron, and neuron order[i] of the original becomes neuron i.
std::vector<int> NeuronOrder(const std::vector<double>& importance);

// The safetensors metadata key ReorderCheckpoint sets.
inline constexpr char kNeuronOrderKey[] = "tandem.neuron_order";

// Writes to `out_dir` the checkpoint of `dir` with every expert's neurons ordered by the
// neuron importance of `stats`, every other tensor byte-identical, and the directory's other
// files (config, tokenizer) copied; the safetensors metadata records the order's provenance.
// INVALID_ARGUMENT when the statistics do not fit the model, or `out_dir` is `dir`.
absl::Status ReorderCheckpoint(const model::ModelDir& dir, const CalibrationStats& stats,
                               const std::string& out_dir);

// Whether the checkpoint in `dir` was written by ReorderCheckpoint (its metadata says so).
absl::StatusOr<bool> IsReordered(const model::ModelDir& dir);

}  // namespace tandem::moe
