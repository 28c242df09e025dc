// The GPU side of weight streaming: a file (an expert pack, common/moe/expert_store.h) held in
// pinned host memory, and batches of byte ranges of it copied to a device arena bounded in bytes
// on a copy stream of their own, in the order given, with an event per range, so that a consumer
// on another stream can start on each range as soon as its copy is done while later ones still
// copy. The arena is reused batch by batch (a layer's expert loads, widest first: the caller
// turns each load into a range with moe::PackLayout::Prefix).
//
// Built with TANDEM_ENABLE_CUDA (compile-tested wherever nvcc is found); its test (label gpu)
// skips without a device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tandem::kernels::cuda {

class PinnedCopier {
 public:
  // A range of the file to copy, named by `key` (an expert index).
  struct Range {
    int key = 0;
    int64_t offset = 0;
    int64_t bytes = 0;
  };

  // Reads the file at `path` into pinned host memory and allocates `device_bytes` on the current
  // device. UNAVAILABLE when there is no CUDA device; RESOURCE_EXHAUSTED when the allocations
  // fail; NOT_FOUND or DATA_LOSS when the file cannot be read whole.
  static absl::StatusOr<std::unique_ptr<PinnedCopier>> Create(const std::string& path,
                                                              int64_t device_bytes);
  ~PinnedCopier();
  PinnedCopier(const PinnedCopier&) = delete;
  PinnedCopier& operator=(const PinnedCopier&) = delete;

  // Starts copying `ranges`, in order, into the arena (the previous batch's copies must have
  // been waited for). INVALID_ARGUMENT for a range outside the file; RESOURCE_EXHAUSTED when the
  // batch does not fit the arena.
  absl::Status Begin(absl::Span<const Range> ranges);
  // The device address of range `key`'s bytes once its copy is done. DEADLINE_EXCEEDED after
  // `deadline`; INVALID_ARGUMENT if the batch holds no such range.
  absl::StatusOr<const void*> Wait(int key, absl::Duration deadline = absl::Seconds(30));

  int64_t file_bytes() const { return file_bytes_; }
  int64_t bytes_copied() const { return bytes_copied_; }

 private:
  struct Copy;
  PinnedCopier() = default;

  void* host_ = nullptr;  // the file, pinned
  int64_t file_bytes_ = 0;
  void* device_ = nullptr;  // the arena
  int64_t device_bytes_ = 0;
  void* stream_ = nullptr;  // cudaStream_t
  std::vector<Copy> copies_;
  int64_t bytes_copied_ = 0;
};

}  // namespace tandem::kernels::cuda
