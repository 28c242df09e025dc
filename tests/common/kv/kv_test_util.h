// What the KV transfer tests share: pools with random contents and per-block checksums.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "common/engine/kv_cache.h"

namespace tandem::kv::testing {

inline std::unique_ptr<engine::KvBlockPool> Pool(int num_blocks, int num_layers = 3,
                                                 int head_dim = 32,
                                                 kernels::KvDtype dtype = kernels::KvDtype::kF32) {
  auto pool = engine::KvBlockPool::Create({num_layers, /*num_kv_heads=*/2, head_dim,
                                           /*block_size=*/16, num_blocks, dtype});
  return pool.ok() ? *std::move(pool) : nullptr;
}

inline void Randomize(engine::KvBlockPool& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  for (size_t i = 0; i < pool.size_bytes(); ++i) pool.data()[i] = std::byte(byte(rng));
}

// FNV-1a of each listed block, for every layer, K then V.
inline std::vector<uint64_t> BlockChecksums(const engine::KvBlockPool& pool,
                                            absl::Span<const int32_t> blocks) {
  std::vector<uint64_t> sums;
  const size_t bytes = pool.block_bytes();
  for (int layer = 0; layer < pool.config().num_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int32_t b : blocks) {
        const auto* p = reinterpret_cast<const unsigned char*>(kv == 0 ? pool.k_block(layer, b)
                                                                       : pool.v_block(layer, b));
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
        sums.push_back(h);
      }
    }
  }
  return sums;
}

// Every block of `pool` except `except`, as a list.
inline std::vector<int32_t> OtherBlocks(const engine::KvBlockPool& pool,
                                        absl::Span<const int32_t> except) {
  std::vector<int32_t> out;
  for (int32_t b = 0; b < pool.num_total(); ++b) {
    bool listed = false;
    for (int32_t e : except) listed = listed || e == b;
    if (!listed) out.push_back(b);
  }
  return out;
}

// A prompt's blocks on both sides: 38 source blocks (30 consecutive, then scattered) and 38
// scattered destination blocks.
inline void PromptBlocks(std::vector<int32_t>* from, std::vector<int32_t>* to) {
  from->clear();
  to->clear();
  for (int i = 0; i < 30; ++i) from->push_back(i);
  for (int i = 0; i < 8; ++i) from->push_back(40 + 3 * i);
  for (int i = 0; i < 38; ++i) to->push_back((i * 7 + 3) % 47);
}

}  // namespace tandem::kv::testing
