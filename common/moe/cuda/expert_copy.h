// The GPU side of expert streaming (issue #7), built with TANDEM_ENABLE_CUDA: the expert pack
// in pinned host memory, and each layer's expert loads, in the order the forward pass asks for
// them (widest first), issued as host-to-device copies of their first `width` bundles on a
// copy stream of their own, with an event per expert, so that a consumer on another stream can
// start on each expert as soon as its copy is done while the narrower ones still copy. The
// device arena is bounded in bytes and reused layer by layer.
//
// Compile-tested wherever nvcc is found; its test (label gpu) skips without a device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/engine/forward.h"
#include "common/moe/expert_store.h"

namespace tandem::moe {

class CudaExpertCopier {
 public:
  // Reads the pack at `pack_path` into pinned host memory and allocates `device_bytes` on the
  // current device. UNAVAILABLE when there is no CUDA device; RESOURCE_EXHAUSTED when the
  // allocations fail.
  static absl::StatusOr<std::unique_ptr<CudaExpertCopier>> Create(const std::string& pack_path,
                                                                  int64_t device_bytes);
  ~CudaExpertCopier();
  CudaExpertCopier(const CudaExpertCopier&) = delete;
  CudaExpertCopier& operator=(const CudaExpertCopier&) = delete;

  // Starts the copies of `loads` of `layer`, in order, into the arena (the previous layer's
  // copies must have been waited for). INVALID_ARGUMENT for experts or widths outside the pack;
  // RESOURCE_EXHAUSTED when the layer's loads do not fit the arena.
  absl::Status BeginLayer(int layer, absl::Span<const engine::ExpertLoad> loads);
  // The device address of `expert`'s bundles once its copy is done (bundle layout as in the
  // pack). DEADLINE_EXCEEDED after `deadline`; INVALID_ARGUMENT if the layer did not load it.
  absl::StatusOr<const void*> Wait(int expert, absl::Duration deadline = absl::Seconds(30));

  const PackLayout& layout() const { return layout_; }
  int64_t bytes_copied() const { return bytes_copied_; }

 private:
  struct Copy;
  CudaExpertCopier() = default;

  PackLayout layout_;
  void* host_ = nullptr;    // the pack, pinned
  void* device_ = nullptr;  // the arena
  int64_t device_bytes_ = 0;
  void* stream_ = nullptr;  // cudaStream_t
  std::vector<Copy> copies_;
  int64_t bytes_copied_ = 0;
};

}  // namespace tandem::moe
