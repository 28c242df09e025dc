// Shared by the cross-process UCX test and its peer process: the pool geometry both sides use
// and the block checksums they compare.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/engine/kv_cache.h"

namespace tandem::kv::testing {

inline engine::KvCacheConfig PeerPoolConfig() {
  return {/*num_layers=*/4, /*num_kv_heads=*/2, /*head_dim=*/64, /*block_size=*/16,
          /*num_blocks=*/64};
}

// FNV-1a of each listed block, for every layer, K then V.
inline std::vector<uint64_t> BlockChecksums(const engine::KvBlockPool& pool,
                                            absl::Span<const int32_t> blocks) {
  std::vector<uint64_t> sums;
  const size_t bytes = pool.block_floats() * sizeof(float);
  for (int layer = 0; layer < pool.config().num_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int32_t b : blocks) {
        const float* base = (kv == 0 ? pool.k_pool(layer) : pool.v_pool(layer)) +
                            static_cast<size_t>(b) * pool.block_floats();
        const auto* p = reinterpret_cast<const unsigned char*>(base);
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
        sums.push_back(h);
      }
    }
  }
  return sums;
}

}  // namespace tandem::kv::testing
