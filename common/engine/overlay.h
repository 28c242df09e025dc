// Decoder overlays (docs/distillation.md): the always-on tensors of a pruned decoder after
// low-cost distillation (tools/train/distill.py), to run in place of the base model's for the
// tokens the decoder generates. An overlay is a safetensors file holding only trained tensors
// (RMSNorm weights, routers, shared experts and their gates, dense MLPs, the final norm; never
// attention, routed experts, the embedding or the lm_head, so the KV cache a full prefill wrote
// is read by frozen attention exactly as before), with metadata:
//   format       "tandem-decoder-overlay"     version "1"
//   base_sha256  SHA-256 of the base checkpoint (CheckpointSha256)
//   plan_sha256  SHA-256 of the pruning plan it was distilled for (PlanSha256)
//   base_model, plan, recipe (JSON: split rule, alpha, steps, tokens, validation, ...)
// Loading refuses a file made for another base checkpoint or plan, and any tensor that is not
// always-on or not of the model's shape, naming it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/model_weights.h"

namespace tandem::engine {

inline constexpr char kOverlayFormat[] = "tandem-decoder-overlay";
inline constexpr char kOverlayVersion[] = "1";

struct DecoderOverlay {
  std::string path;
  std::string name;    // the file's name without directory and ".safetensors"
  std::string sha256;  // of the file
  std::string base_sha256;
  std::string plan_sha256;
  std::string recipe;                // as the metadata gives it
  std::vector<std::string> tensors;  // what the file holds, sorted
  // The always-on fields only (attn_norm, ffn_norm, router, shared, shared_gate, dense), each
  // the file's tensor or, where it has none, a copy of the base model's; the rest empty.
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;
};

// SHA-256 of a plan's retained experts: of one line per layer, "e0,e1,...\n" with the layer's
// retained experts ascending (every expert for an empty mask), in layer order.
std::string PlanSha256(const ExpertMask& mask, const model::ModelConfig& config);

// SHA-256 of DIR's checkpoint: of DIR/model.safetensors, or, for a sharded checkpoint, of the
// lines "<shard sha256>  <shard file>\n" in file-name order. NOT_FOUND without one.
absl::StatusOr<std::string> CheckpointSha256(const std::string& model_dir);

// Whether a tensor of `kind` is always-on (may be in an overlay).
bool IsAlwaysOn(model::TensorKind kind);

// Loads the overlay at `path` for `base` (loaded from `dir`) decoding under `plan` (its mask;
// empty: every expert). INVALID_ARGUMENT naming the problem for a file that is not an
// overlay, one made for another checkpoint or plan, a tensor that is not always-on or has the
// wrong shape, or no tensors; NOT_FOUND for a missing file.
absl::StatusOr<std::unique_ptr<DecoderOverlay>> LoadDecoderOverlay(const std::string& path,
                                                                   const model::ModelDir& dir,
                                                                   const ModelWeights& base,
                                                                   const ExpertMask& plan);

}  // namespace tandem::engine
