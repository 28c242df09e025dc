// How a serving engine decodes under a pruning plan (issues #6 and #7): the plan's retained
// experts (masked, and the only ones loaded when the whole engine decodes), its mixed-width
// tiers (a width policy, on a checkpoint whose neurons were reordered), and experts either
// resident or streamed from an expert pack through a cache bounded in bytes. Shared by
// tandem-decode (every step is decode) and tandem-serve (phase-aware: only generated tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/engine_loop.h"
#include "common/engine/forward.h"
#include "common/engine/overlay.h"
#include "common/moe/expert_stream.h"
#include "common/moe/tiers.h"
#include "services/common/serving.h"
#include "services/common/serving_metrics.h"

namespace tandem::serving {

struct DecoderOptions {
  std::string plan = {};         // pruning plan, maybe with tiers; empty: every expert, full width
  std::string overlay = {};      // a distilled decoder's always-on tensors (tandem distill), for
                                 // generated tokens; made for this model and plan
  std::string expert_pack = {};  // stream experts from this pack (tandem pack), not loaded
  int64_t expert_cache_bytes = 0;  // the resident cache's bound, with expert_pack
  bool expert_direct_io = true;    // read the pack with O_DIRECT; else hold it in host memory
  bool expert_overlap = true;      // compute each expert as soon as it is in
  // Load only the plan's experts (tandem-decode); tandem-serve prefills with all of them.
  bool decode_only = true;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;  // how the KV pool stores keys and values
  // Dummy weights and their routing (benchmarks); load.only_experts is set here from the plan.
  engine::LoadOptions load = {};
  // > 0: the KV pool gets what the weights leave of this many bytes (EngineOptions).
  int64_t memory_bytes = 0;
  int max_sequences = 64;    // sequences held at once (EngineOptions)
  int state_snapshots = 0;   // the prefix cache's state snapshots (EngineOptions)
  bool window_rings = true;  // sliding-window layers in rings (EngineOptions)
};

struct Decoder {
  ServingEngine engine;
  engine::ExpertMask mask;                      // the plan's; empty without one
  std::unique_ptr<moe::TierWidthPolicy> tiers;  // the plan's tiers, if any
  std::unique_ptr<moe::ExpertBacking> backing;  // with an expert pack
  std::unique_ptr<moe::ExpertStream> stream;    // with an expert pack; the forward pass's provider
  std::unique_ptr<engine::DecoderOverlay> overlay;  // with --overlay

  // What decode steps run: the plan's mask and widths, and the overlay's always-on tensors.
  engine::MoeOptions decode_moe() const {
    return {.mask = mask.retained.empty() ? nullptr : &mask,
            .widths = tiers.get(),
            .overlay = overlay.get()};
  }
};

// Loads `dir` with a pool of `num_blocks` blocks of `block_size` tokens, set up as
// `options` says. INVALID_ARGUMENT naming the flag for a plan that does not fit, tiers on a
// checkpoint that was not reordered, a pack of another model, a pack without a cache bound, or an
// overlay made for another checkpoint or plan; logs which overlay it decodes with.
absl::StatusOr<Decoder> LoadDecoder(const model::ModelDir& dir, int block_size, int num_blocks,
                                    const DecoderOptions& options);

// `inner`, then the expert metrics of `decoder` (cache hits, misses, bytes and seconds loaded,
// time hidden, pairs per tier, neurons run) brought up to date after every step.
engine::EngineLoop::StepObserver WithExpertMetrics(engine::EngineLoop::StepObserver inner,
                                                   Decoder* decoder, ExpertMetrics* metrics);

}  // namespace tandem::serving
