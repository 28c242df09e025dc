// A shipped model prepared for a streamed, mixed-width decoder with the `tandem` CLI, as a user
// would: its neurons reordered (tandem reorder), optionally quantized (tandem quantize --bits),
// a shipped plan (by default tiny-moe's REAP keep-8) tiered (by default Hot 0.3 / Warm 0.4:
// tandem tier),
// and the experts packed (tandem pack).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tandem::testing {

struct MixedWidthModel {
  std::string model_dir;  // the reordered (and maybe quantized) checkpoint
  std::string plan;       // the tiered plan (proto JSON)
  std::string pack;       // the expert pack, for --expert_pack
  // The pack goes away with this (it lives in the build tree, not in `work_dir`).
  ~MixedWidthModel();
  MixedWidthModel() = default;
  MixedWidthModel(MixedWidthModel&& other) noexcept;
  MixedWidthModel& operator=(MixedWidthModel&&) = delete;
};

// Writes the checkpoint and the plan under `work_dir`, and the pack on the build tree's disk
// (O_DIRECT needs a file system that supports it); errors carry the CLI's output. `model` is a
// shipped model (models/MODEL) and `plan` one of its shipped plans (models/MODEL/pruning).
// `bits` 8 or 4 quantizes the reordered checkpoint (experts and attention, groups of 32).
// `tier_flags` are the tiers' (tandem tier), e.g. widths by rank for a top-k model.
absl::StatusOr<MixedWidthModel> MakeMixedWidthModel(
    const std::string& work_dir, const std::string& model = "tiny-moe",
    const std::string& plan = "reap-keep8.json", int bits = 0,
    const std::string& tier_flags = "--hot_share 0.3 --warm_share 0.4");

}  // namespace tandem::testing
