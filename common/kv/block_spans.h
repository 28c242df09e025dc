// Which bytes of two KV block pools a block copy moves: for every layer, the K and the V
// block of each (source block, destination block) pair, as spans relative to each pool's
// data() (the region a transport registers). Consecutive blocks that stay consecutive merge
// into one span, so a prompt's run of blocks costs few spans however long it is.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/engine/kv_cache.h"
#include "common/kv/transfer.h"

namespace tandem::kv {

// INVALID_ARGUMENT when the pools' geometries differ (naming the field), the lists differ in
// length, or a block id is out of range.
absl::StatusOr<std::vector<CopySpan>> KvBlockCopySpans(const engine::KvBlockPool& src,
                                                       absl::Span<const int32_t> src_blocks,
                                                       const engine::KvBlockPool& dst,
                                                       absl::Span<const int32_t> dst_blocks);
// The same into a pool known only by its geometry (another instance's).
absl::StatusOr<std::vector<CopySpan>> KvBlockCopySpans(const engine::KvBlockPool& src,
                                                       absl::Span<const int32_t> src_blocks,
                                                       const engine::KvCacheConfig& dst,
                                                       absl::Span<const int32_t> dst_blocks);

}  // namespace tandem::kv
