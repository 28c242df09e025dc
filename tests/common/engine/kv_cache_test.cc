#include "common/engine/kv_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/kernels/cpu/kernels.h"

namespace tandem::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const float* Floats(const KvBlockPool& pool) { return reinterpret_cast<const float*>(pool.data()); }

KvCacheConfig SmallConfig() {
  KvCacheConfig config;
  config.num_layers = 3;
  config.num_kv_heads = 2;
  config.head_dim = 5;  // slot 10 floats, block 40: pools need padding to 64 bytes
  config.block_size = 4;
  config.num_blocks = 7;
  return config;
}

std::unique_ptr<KvBlockPool> MakePool(const KvCacheConfig& config = SmallConfig()) {
  auto pool = KvBlockPool::Create(config);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *std::move(pool);
}

bool IsAligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % KvBlockPool::kAlignment == 0;
}

TEST(KvCacheConfigTest, ValidateNamesTheField) {
  EXPECT_TRUE(SmallConfig().Validate().ok());
  for (const char* field : {"num_layers", "num_kv_heads", "head_dim", "block_size", "num_blocks"}) {
    KvCacheConfig config = SmallConfig();
    const std::string name = field;
    if (name == "num_layers") config.num_layers = 0;
    if (name == "num_kv_heads") config.num_kv_heads = -1;
    if (name == "head_dim") config.head_dim = 0;
    if (name == "block_size") config.block_size = 0;
    if (name == "num_blocks") config.num_blocks = -3;
    absl::Status status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(status.message(), HasSubstr(field));
    EXPECT_EQ(KvBlockPool::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(KvBlockPoolTest, StateSlotsAreZeroedSeparateAndBounded) {
  KvCacheConfig config = SmallConfig();
  config.state_bytes = 100;  // padded to 128 in the pool
  config.num_state_slots = 2;
  std::unique_ptr<KvBlockPool> pool = MakePool(config);
  ASSERT_GE(pool->size_bytes(), *KvBlockPool::BytesFor(SmallConfig()) + 2 * 128);
  // Both slots past the K/V pools, aligned, not overlapping.
  absl::StatusOr<int32_t> a = pool->AllocateState();
  absl::StatusOr<int32_t> b = pool->AllocateState();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(IsAligned(pool->state(*a)) && IsAligned(pool->state(*b)));
  EXPECT_GE(pool->state(std::min(*a, *b)),
            pool->v_block(SmallConfig().num_layers - 1, SmallConfig().num_blocks - 1) +
                pool->block_bytes());
  EXPECT_GE(std::abs(pool->state(*a) - pool->state(*b)), 100);
  EXPECT_EQ(pool->num_free_states(), 0);
  EXPECT_EQ(pool->AllocateState().status().code(), absl::StatusCode::kResourceExhausted);
  // A slot comes back zeroed for its next sequence.
  std::memset(pool->state(*a), 0x5a, 100);
  pool->ReleaseState(*a);
  absl::StatusOr<int32_t> again = pool->AllocateState();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *a);
  EXPECT_TRUE(std::all_of(pool->state(*again), pool->state(*again) + 100,
                          [](std::byte x) { return x == std::byte{0}; }));
  // Without snapshots a cached prefix could not resume: no prefix cache here.
  pool->EnablePrefixCache();
  EXPECT_FALSE(pool->prefix_cache_enabled());
}

TEST(KvBlockPoolTest, BlockTableHoldsOneStateSlotAllOrNothing) {
  KvCacheConfig config = SmallConfig();
  config.state_bytes = 64;
  config.num_state_slots = 1;
  std::unique_ptr<KvBlockPool> pool = MakePool(config);
  BlockTable a;
  ASSERT_TRUE(a.Reserve(pool.get(), 5).ok());
  EXPECT_GE(a.state_slot(), 0);
  const int32_t slot = a.state_slot();
  ASSERT_TRUE(a.Reserve(pool.get(), 9).ok());  // more blocks, the same slot
  EXPECT_EQ(a.state_slot(), slot);
  // No slot left: a second table gets neither blocks nor a slot.
  BlockTable b;
  const int free_blocks = pool->num_free();
  EXPECT_EQ(b.Reserve(pool.get(), 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->num_free(), free_blocks);
  EXPECT_EQ(b.state_slot(), -1);
  a.ReleaseAll(pool.get());
  EXPECT_EQ(a.state_slot(), -1);
  EXPECT_EQ(pool->num_free_states(), 1);
  // Blocks short: the slot taken for the attempt goes back.
  BlockTable c;
  EXPECT_EQ(c.Reserve(pool.get(), 4 * 100).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->num_free_states(), 1);
  EXPECT_EQ(c.state_slot(), -1);
}

TEST(KvCacheConfigTest, StateSlotsNeedBothFields) {
  KvCacheConfig config = SmallConfig();
  config.state_bytes = 64;
  EXPECT_THAT(config.Validate().message(), HasSubstr("state slots"));
  config.state_bytes = 0;
  config.num_state_slots = 3;
  EXPECT_EQ(config.Validate().code(), absl::StatusCode::kInvalidArgument);
  config.num_state_slots = 0;
  config.num_state_snapshots = 2;  // snapshots of no state
  EXPECT_THAT(config.Validate().message(), HasSubstr("state snapshots"));
}

// State snapshots: kept with a published block, restored into a sequence's slot, the least
// recently used reclaimed when all are taken, dropped with their block on eviction, and counted
// in the pool's size.
TEST(KvBlockPoolTest, StateSnapshotsFollowTheirBlocks) {
  KvCacheConfig config = SmallConfig();
  config.state_bytes = 100;
  config.num_state_slots = 1;
  config.num_state_snapshots = 2;
  KvCacheConfig without = config;
  without.num_state_snapshots = 0;
  EXPECT_EQ(*KvBlockPool::BytesFor(config), *KvBlockPool::BytesFor(without) + 2 * 128);
  std::unique_ptr<KvBlockPool> pool = MakePool(config);
  pool->EnablePrefixCache();
  ASSERT_TRUE(pool->prefix_cache_enabled());
  const int32_t slot = *pool->AllocateState();
  std::vector<int32_t> blocks = *pool->Allocate(3);
  const std::vector<int32_t> tokens(config.block_size, 7);
  auto write = [&](uint8_t value) { std::memset(pool->state(slot), value, 100); };
  auto holds = [&](uint8_t value) {
    return std::all_of(pool->state(slot), pool->state(slot) + 100,
                       [&](std::byte x) { return x == std::byte{value}; });
  };
  EXPECT_FALSE(pool->SnapshotState(200, slot));  // nothing published under the key
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(pool->Publish(blocks[i], 100 + i, 200 + i, tokens));
    write(static_cast<uint8_t>(i + 1));
    EXPECT_TRUE(pool->SnapshotState(200 + i, slot));
    if (i == 1) {  // block 0's snapshot is used last
      ASSERT_TRUE(pool->RestoreState(blocks[0], slot));
    }
  }
  // Two snapshots for three blocks: block 1's, the least recently used, went to block 2.
  EXPECT_TRUE(pool->HasStateSnapshot(blocks[0]));
  EXPECT_FALSE(pool->HasStateSnapshot(blocks[1]));
  EXPECT_TRUE(pool->HasStateSnapshot(blocks[2]));
  EXPECT_FALSE(pool->RestoreState(blocks[1], slot));
  ASSERT_TRUE(pool->RestoreState(blocks[0], slot));
  EXPECT_TRUE(holds(1));
  ASSERT_TRUE(pool->RestoreState(blocks[2], slot));
  EXPECT_TRUE(holds(3));
  EXPECT_EQ(pool->prefix_cache_stats().state_snapshots, 2);
  // Evicting a block drops its snapshot.
  pool->Release(blocks);
  const int free_blocks = pool->num_free();
  std::vector<int32_t> all = *pool->Allocate(free_blocks);
  EXPECT_EQ(pool->prefix_cache_stats().state_snapshots, 0);
  pool->Release(all);
  pool->ReleaseState(slot);
}

TEST(KvBlockPoolTest, OverflowingSizeIsResourceExhausted) {
  KvCacheConfig config;
  config.num_layers = INT_MAX;
  config.num_kv_heads = INT_MAX;
  config.head_dim = INT_MAX;
  config.block_size = INT_MAX;
  config.num_blocks = INT_MAX;
  auto pool = KvBlockPool::Create(config);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(pool.status().message(), HasSubstr("overflows"));
}

TEST(KvBlockPoolTest, LayoutIsAlignedAndPoolsDoNotOverlap) {
  const KvCacheConfig config = SmallConfig();
  auto pool = MakePool(config);
  EXPECT_EQ(pool->slot_values(), 10u);
  EXPECT_EQ(pool->block_values(), 40u);
  EXPECT_TRUE(IsAligned(Floats(*pool)));
  const size_t pool_floats = pool->block_values() * config.num_blocks;
  const float* begin = Floats(*pool);
  const float* end = Floats(*pool) + pool->size_bytes() / sizeof(float);
  std::vector<std::pair<const float*, const float*>> ranges;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    for (const float* p : {pool->k_pool(layer), pool->v_pool(layer)}) {
      EXPECT_TRUE(IsAligned(p)) << "layer " << layer;
      EXPECT_GE(p, begin);
      EXPECT_LE(p + pool_floats, end);
      ranges.push_back({p, p + pool_floats});
    }
  }
  // K then V per layer, in layer order, disjoint.
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);
  EXPECT_EQ(pool->k_pool(0), Floats(*pool));
  const KvBlockPool& const_pool = *pool;
  EXPECT_EQ(const_pool.v_pool(2), pool->v_pool(2));
}

TEST(KvBlockPoolTest, UnpaddedLayoutIsExactlyContiguous) {
  KvCacheConfig config = SmallConfig();
  config.head_dim = 8;  // block 64 floats: no padding
  auto pool = MakePool(config);
  const size_t pool_floats = pool->block_values() * config.num_blocks;
  EXPECT_EQ(pool->size_bytes(), 2 * config.num_layers * pool_floats * sizeof(float));
  EXPECT_EQ(pool->v_pool(0), pool->k_pool(0) + pool_floats);
  EXPECT_EQ(pool->k_pool(1), pool->v_pool(0) + pool_floats);
}

TEST(KvBlockPoolTest, StartsZeroedAndWritingOneBlockTouchesNoOther) {
  const KvCacheConfig config = SmallConfig();
  auto pool = MakePool(config);
  const size_t total = pool->size_bytes() / sizeof(float);
  for (size_t i = 0; i < total; ++i) ASSERT_EQ(Floats(*pool)[i], 0.0f) << i;

  BlockTable table;
  ASSERT_TRUE(table.Reserve(pool.get(), 3 * config.block_size).ok());
  // Fill every slot of the middle block in layer 1, keys and values.
  const int32_t middle = table.blocks()[1];
  for (int pos = config.block_size; pos < 2 * config.block_size; ++pos) {
    float* k = table.KeySlot(*pool, 1, pos);
    float* v = table.ValueSlot(*pool, 1, pos);
    for (size_t i = 0; i < pool->slot_values(); ++i) {
      k[i] = 1.0f;
      v[i] = 2.0f;
    }
  }
  const float* k_block = pool->k_pool(1) + middle * pool->block_values();
  const float* v_block = pool->v_pool(1) + middle * pool->block_values();
  size_t written = 0;
  for (size_t i = 0; i < total; ++i) {
    const float* p = Floats(*pool) + i;
    const bool in_k = p >= k_block && p < k_block + pool->block_values();
    const bool in_v = p >= v_block && p < v_block + pool->block_values();
    const float expected = in_k ? 1.0f : in_v ? 2.0f : 0.0f;
    ASSERT_EQ(*p, expected) << "float " << i;
    written += in_k || in_v;
  }
  EXPECT_EQ(written, 2 * pool->block_values());
  table.ReleaseAll(pool.get());
}

// Bf16 and int8 pools: blocks of the dtype's bytes, every pool 64-byte aligned and disjoint,
// kv_store through Writer writes only its slot, and View reads back what was stored within the
// dtype's rounding.
TEST(KvBlockPoolTest, ReducedPrecisionPoolsStoreAndReadBack) {
  for (kernels::KvDtype dtype : {kernels::KvDtype::kBf16, kernels::KvDtype::kInt8}) {
    KvCacheConfig config = SmallConfig();
    config.dtype = dtype;
    auto pool = MakePool(config);
    EXPECT_EQ(pool->dtype(), dtype);
    EXPECT_EQ(pool->block_bytes(), kernels::KvBlockBytes(dtype, 4, 2, 5));
    EXPECT_EQ(pool->block_bytes(), dtype == kernels::KvDtype::kBf16 ? 80u : 40u + 32u);
    EXPECT_EQ(*KvBlockPool::BytesFor(config), pool->size_bytes());
    EXPECT_EQ(pool->size_bytes(), 2u * 3 * KvBlockPool::PoolStrideBytes(config));
    for (int layer = 0; layer < config.num_layers; ++layer) {
      EXPECT_TRUE(IsAligned(pool->k_block(layer, 0)));
      EXPECT_TRUE(IsAligned(pool->v_block(layer, 0)));
      EXPECT_LE(pool->k_block(layer, 6) + pool->block_bytes(), pool->v_block(layer, 0));
    }
    const std::vector<float> k = {1, -2, 3, -4, 5, 0.5f, 0.25f, -0.125f, 8, 16};
    const std::vector<float> v = {-1, 2, -3, 4, -5, 6, -7, 8, -9, 10};
    const int32_t table[] = {5, 3};  // position 6 = block 3, offset 2
    const int32_t position = 6;
    kernels::cpu::ActiveBackend().kv_store(pool->Writer(/*layer=*/1, table), 1, &position, k.data(),
                                           v.data());
    size_t nonzero = 0;
    for (size_t i = 0; i < pool->size_bytes(); ++i) {
      const std::byte* p = pool->data() + i;
      const bool in_k = p >= pool->k_block(1, 3) && p < pool->k_block(1, 3) + pool->block_bytes();
      const bool in_v = p >= pool->v_block(1, 3) && p < pool->v_block(1, 3) + pool->block_bytes();
      if (*p != std::byte{0}) {
        ASSERT_TRUE(in_k || in_v) << "byte " << i;
        ++nonzero;
      }
    }
    EXPECT_GT(nonzero, 0u);
    const kernels::PagedKv view = pool->View(1, table);
    for (int head = 0; head < 2; ++head) {
      float got_k[5], got_v[5];
      kernels::LoadKvRow(view, false, 6, head, got_k);
      kernels::LoadKvRow(view, true, 6, head, got_v);
      for (int i = 0; i < 5; ++i) {
        // Every value here is exact in bf16; int8 is within half a step of the head's max.
        const float tolerance = dtype == kernels::KvDtype::kBf16 ? 0.0f : 16.0f / 254 * 1.0001f;
        EXPECT_NEAR(got_k[i], k[head * 5 + i], tolerance) << head << " " << i;
        EXPECT_NEAR(got_v[i], v[head * 5 + i],
                    dtype == kernels::KvDtype::kBf16 ? 0.0f : 10.0f / 254)
            << head << " " << i;
      }
    }
    EXPECT_DEATH(pool->k_pool(0), "k_pool of a");
  }
}

TEST(KvBlockPoolTest, SmallerDtypesHoldMoreBlocksInTheSameBytes) {
  KvCacheConfig config = SmallConfig();
  config.head_dim = 64;
  config.block_size = 16;
  const size_t f32 = *KvBlockPool::BytesFor(config);
  config.dtype = kernels::KvDtype::kBf16;
  EXPECT_EQ(*KvBlockPool::BytesFor(config) * 2, f32);
  config.dtype = kernels::KvDtype::kInt8;
  // 64 int8 values and a 4-byte scale per head: 68 of f32's 256 bytes.
  EXPECT_EQ(*KvBlockPool::BytesFor(config) * 256, f32 * 68);
}

TEST(KvBlockPoolTest, AllocateRefRelease) {
  auto pool = MakePool();
  EXPECT_EQ(pool->num_total(), 7);
  EXPECT_EQ(pool->num_free(), 7);
  auto a = pool->Allocate(3);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(*a, ElementsAre(0, 1, 2));
  EXPECT_EQ(pool->num_free(), 4);
  for (int32_t b : *a) EXPECT_EQ(pool->ref_count(b), 1);
  EXPECT_EQ(pool->ref_count(3), 0);

  pool->Ref({a->data(), 2});  // share blocks 0 and 1
  EXPECT_EQ(pool->ref_count(0), 2);
  EXPECT_EQ(pool->ref_count(2), 1);
  pool->Release(*a);
  EXPECT_EQ(pool->ref_count(0), 1);
  EXPECT_EQ(pool->ref_count(2), 0);
  EXPECT_EQ(pool->num_free(), 5);
  pool->Release({a->data(), 2});
  EXPECT_EQ(pool->num_free(), 7);

  auto none = pool->Allocate(0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(pool->Allocate(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvBlockPoolTest, AllocationIsAllOrNothing) {
  auto pool = MakePool();
  auto a = pool->Allocate(5);
  ASSERT_TRUE(a.ok());
  auto b = pool->Allocate(3);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("asked for 3"));
  EXPECT_THAT(b.status().message(), HasSubstr("only 2 of 7 are free"));
  EXPECT_EQ(pool->num_free(), 2);
  auto c = pool->Allocate(2);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(pool->num_free(), 0);
  pool->Release(*a);
  pool->Release(*c);
  EXPECT_EQ(pool->num_free(), 7);
}

TEST(KvBlockPoolTest, ConcurrentAllocateAndReleaseKeepCountsConsistent) {
  KvCacheConfig config = SmallConfig();
  config.num_blocks = 32;
  auto pool = MakePool(config);
  // owner[b] is the thread holding block b, or -1; a block handed to two threads at once
  // would be caught by the exchange.
  std::vector<std::atomic<int>> owner(config.num_blocks);
  for (auto& o : owner) o.store(-1);
  std::atomic<int> double_allocations{0};
  std::atomic<int> failed_allocations{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int iter = 0; iter < 2000; ++iter) {
        const int n = 1 + static_cast<int>(rng() % 6);
        auto blocks = pool->Allocate(n);
        if (!blocks.ok()) {
          ++failed_allocations;
          continue;
        }
        for (int32_t b : *blocks) {
          if (owner[b].exchange(t) != -1) ++double_allocations;
        }
        pool->Ref(*blocks);  // a second holder, as a shared prefix would have
        pool->Release(*blocks);
        for (int32_t b : *blocks) owner[b].store(-1);
        pool->Release(*blocks);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(double_allocations.load(), 0);
  EXPECT_EQ(pool->num_free(), config.num_blocks);
  for (int32_t b = 0; b < config.num_blocks; ++b) EXPECT_EQ(pool->ref_count(b), 0) << b;
  // Each block is free exactly once: allocating everything yields every id.
  auto all = pool->Allocate(config.num_blocks);
  ASSERT_TRUE(all.ok());
  std::vector<int32_t> ids = *all;
  std::sort(ids.begin(), ids.end());
  for (int32_t b = 0; b < config.num_blocks; ++b) EXPECT_EQ(ids[b], b);
}

TEST(KvBlockPoolDeathTest, ReleasingAFreeBlockIsFatal) {
  auto pool = MakePool();
  const std::vector<int32_t> free_block = {4};
  EXPECT_DEATH(pool->Release(free_block), "Release of free KV block 4");
  const std::vector<int32_t> out_of_range = {7};
  EXPECT_DEATH(pool->Release(out_of_range), "out of range");
  EXPECT_DEATH(pool->Ref(free_block), "Ref of free KV block 4");
}

TEST(BlockTableTest, GrowsAcrossBlockBoundaries) {
  const KvCacheConfig config = SmallConfig();  // block_size 4
  auto pool = MakePool(config);
  BlockTable table;
  EXPECT_EQ(table.num_tokens(), 0);
  EXPECT_EQ(table.capacity_tokens(config.block_size), 0);

  ASSERT_TRUE(table.Reserve(pool.get(), 3).ok());
  EXPECT_EQ(table.blocks().size(), 1u);
  table.Append(3);
  ASSERT_TRUE(table.Reserve(pool.get(), 4).ok());  // still fits
  EXPECT_EQ(table.blocks().size(), 1u);
  table.Append(1);
  ASSERT_TRUE(table.Reserve(pool.get(), 5).ok());  // crosses into a second block
  EXPECT_EQ(table.blocks().size(), 2u);
  table.Append(1);
  ASSERT_TRUE(table.Reserve(pool.get(), 13).ok());  // 4 blocks
  EXPECT_EQ(table.blocks().size(), 4u);
  EXPECT_EQ(table.capacity_tokens(config.block_size), 16);
  table.Append(8);
  EXPECT_EQ(table.num_tokens(), 13);
  EXPECT_EQ(pool->num_free(), 3);

  // Asking for more than is free changes nothing.
  absl::Status status = table.Reserve(pool.get(), 33);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(table.blocks().size(), 4u);
  EXPECT_EQ(pool->num_free(), 3);
  EXPECT_EQ(table.Reserve(pool.get(), -1).code(), absl::StatusCode::kInvalidArgument);

  table.ReleaseAll(pool.get());
  EXPECT_EQ(table.num_tokens(), 0);
  EXPECT_TRUE(table.blocks().empty());
  EXPECT_EQ(pool->num_free(), 7);
}

TEST(BlockTableTest, MapsPositionsToSlots) {
  const KvCacheConfig config = SmallConfig();
  auto pool = MakePool(config);
  // Interleave two sequences so that a table's blocks are not consecutive ids.
  BlockTable a, b;
  for (int tokens = 4; tokens <= 12; tokens += 4) {
    ASSERT_TRUE(a.Reserve(pool.get(), tokens).ok());
    ASSERT_TRUE(b.Reserve(pool.get(), tokens).ok());
  }
  EXPECT_THAT(a.blocks(), ElementsAre(0, 2, 4));
  EXPECT_THAT(b.blocks(), ElementsAre(1, 3, 5));
  for (int pos = 0; pos < 12; ++pos) {
    const BlockSlot slot = a.Locate(pos, config.block_size);
    EXPECT_EQ(slot.block, a.blocks()[pos / 4]);
    EXPECT_EQ(slot.offset, pos % 4);
    for (int layer = 0; layer < config.num_layers; ++layer) {
      const size_t offset = slot.block * pool->block_values() + slot.offset * pool->slot_values();
      EXPECT_EQ(a.KeySlot(*pool, layer, pos), pool->k_pool(layer) + offset);
      EXPECT_EQ(a.ValueSlot(*pool, layer, pos), pool->v_pool(layer) + offset);
      const KvBlockPool& const_pool = *pool;
      EXPECT_EQ(a.KeySlot(const_pool, layer, pos), pool->k_pool(layer) + offset);
    }
  }
  // Positions 4 and 5 of sequence b are adjacent slots of its second block.
  EXPECT_EQ(b.KeySlot(*pool, 0, 5), b.KeySlot(*pool, 0, 4) + pool->slot_values());
  a.ReleaseAll(pool.get());
  b.ReleaseAll(pool.get());
  EXPECT_EQ(pool->num_free(), 7);
}

TEST(BlockTableDeathTest, AppendBeyondCapacityAndBadPositionsAreFatal) {
  const KvCacheConfig config = SmallConfig();
  auto pool = MakePool(config);
  BlockTable table;
  EXPECT_DEATH(table.Append(1), "capacity 0");
  ASSERT_TRUE(table.Reserve(pool.get(), 2).ok());
  table.Append(4);
  EXPECT_DEATH(table.Append(1), "capacity 4");
  EXPECT_DEATH(table.KeySlot(*pool, 0, 4), "position 4 outside");
  EXPECT_DEATH(table.KeySlot(*pool, 3, 0), "layer 3 outside");
  auto other = MakePool(config);
  EXPECT_DEATH(table.Reserve(other.get(), 8).IgnoreError(), "second KV pool");
  table.ReleaseAll(pool.get());
}

// ---- Prefix cache ----

std::vector<int32_t> Tokens(int first, int n = 4) {
  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = first + i;
  return tokens;
}

TEST(PrefixCacheTest, OffByDefault) {
  auto pool = MakePool();
  EXPECT_FALSE(pool->prefix_cache_enabled());
  std::vector<int32_t> block = *pool->Allocate(1);
  const uint64_t root = pool->PrefixRoot(0);
  const uint64_t key = pool->PrefixKey(root, Tokens(1));
  EXPECT_FALSE(pool->Publish(block[0], root, key, Tokens(1)));
  EXPECT_EQ(pool->AcquireCached(root, key, Tokens(1)), -1);
  pool->Release(block);
  EXPECT_EQ(pool->ref_count(block[0]), 0);
  EXPECT_EQ(pool->prefix_cache_stats().evictable_blocks, 0);
}

TEST(PrefixCacheTest, KeysChainParentsTokensAndSalt) {
  auto pool = MakePool();
  const uint64_t root = pool->PrefixRoot(7);
  EXPECT_EQ(root, pool->PrefixRoot(7));
  EXPECT_NE(root, pool->PrefixRoot(8));
  const uint64_t a = pool->PrefixKey(root, Tokens(1));
  EXPECT_EQ(a, pool->PrefixKey(root, Tokens(1)));
  EXPECT_NE(a, pool->PrefixKey(root, Tokens(2)));
  EXPECT_NE(a, pool->PrefixKey(pool->PrefixRoot(8), Tokens(1)));
  // The same block after different parents is a different key.
  EXPECT_NE(pool->PrefixKey(a, Tokens(5)),
            pool->PrefixKey(pool->PrefixKey(root, Tokens(9)), Tokens(5)));
  // Keys are seeded per pool.
  auto other = MakePool();
  EXPECT_NE(other->PrefixRoot(7), root);
}

TEST(PrefixCacheTest, PublishedBlocksOutliveTheirHoldersAndAreAcquiredByContent) {
  auto pool = MakePool();
  pool->EnablePrefixCache();
  std::vector<int32_t> blocks = *pool->Allocate(2);
  const uint64_t root = pool->PrefixRoot(0);
  const uint64_t k0 = pool->PrefixKey(root, Tokens(1));
  const uint64_t k1 = pool->PrefixKey(k0, Tokens(5));
  ASSERT_TRUE(pool->Publish(blocks[0], root, k0, Tokens(1)));
  ASSERT_TRUE(pool->Publish(blocks[1], k0, k1, Tokens(5)));
  EXPECT_FALSE(pool->Publish(blocks[1], k0, k1, Tokens(5)));  // already published
  EXPECT_EQ(pool->prefix_cache_stats().cached_blocks, 2);
  // A second holder while the first still runs.
  EXPECT_EQ(pool->AcquireCached(root, k0, Tokens(1)), blocks[0]);
  EXPECT_EQ(pool->ref_count(blocks[0]), 2);
  pool->Release({blocks[0]});
  // The last holder leaves: the blocks stay, evictable, and count as free.
  pool->Release(blocks);
  EXPECT_EQ(pool->ref_count(blocks[0]), 0);
  EXPECT_EQ(pool->num_free(), 7);
  EXPECT_EQ(pool->prefix_cache_stats().evictable_blocks, 2);
  EXPECT_EQ(pool->AcquireCached(root, k0, Tokens(1)), blocks[0]);
  EXPECT_EQ(pool->AcquireCached(k0, k1, Tokens(5)), blocks[1]);
  EXPECT_EQ(pool->prefix_cache_stats().evictable_blocks, 0);
  EXPECT_EQ(pool->num_free(), 5);
  // Wrong tokens, wrong parent or a key nobody published: no block (even under a key that
  // exists, so a hash collision never hands out another prompt's KV).
  EXPECT_EQ(pool->AcquireCached(root, k0, Tokens(2)), -1);
  EXPECT_EQ(pool->AcquireCached(k1, k1, Tokens(5)), -1);
  EXPECT_EQ(pool->AcquireCached(root, k0 + 1, Tokens(1)), -1);
  EXPECT_EQ(pool->AcquireCached(root, k0, Tokens(1, 3)), -1);
  pool->Release(blocks);
}

TEST(PrefixCacheTest, AKeyIsHeldByOneBlock) {
  auto pool = MakePool();
  pool->EnablePrefixCache();
  std::vector<int32_t> blocks = *pool->Allocate(2);
  const uint64_t root = pool->PrefixRoot(0);
  const uint64_t key = pool->PrefixKey(root, Tokens(1));
  ASSERT_TRUE(pool->Publish(blocks[0], root, key, Tokens(1)));
  // Two sequences computed the same block: the second copy stays private and is freed.
  EXPECT_FALSE(pool->Publish(blocks[1], root, key, Tokens(1)));
  pool->Release(blocks);
  EXPECT_EQ(pool->prefix_cache_stats().cached_blocks, 1);
  EXPECT_EQ(pool->prefix_cache_stats().evictable_blocks, 1);
}

TEST(PrefixCacheTest, EvictsLeastRecentlyReleasedOnlyWhenTheFreeListIsEmpty) {
  auto pool = MakePool();  // 7 blocks
  pool->EnablePrefixCache();
  const uint64_t root = pool->PrefixRoot(0);
  // Three one-block prefixes released in the order a, b, c.
  std::vector<uint64_t> keys;
  std::vector<int32_t> ids;
  for (int first : {100, 200, 300}) {
    std::vector<int32_t> block = *pool->Allocate(1);
    keys.push_back(pool->PrefixKey(root, Tokens(first)));
    ASSERT_TRUE(pool->Publish(block[0], root, keys.back(), Tokens(first)));
    ids.push_back(block[0]);
    pool->Release(block);
  }
  // a is used again: b is now the least recently released.
  ASSERT_EQ(pool->AcquireCached(root, keys[0], Tokens(100)), ids[0]);
  pool->Release({ids[0]});
  // Four free blocks go first; nothing is evicted.
  std::vector<int32_t> four = *pool->Allocate(4);
  EXPECT_EQ(pool->prefix_cache_stats().evictions, 0);
  for (int32_t b : four) EXPECT_TRUE(std::find(ids.begin(), ids.end(), b) == ids.end());
  // The next takes b, then c.
  EXPECT_THAT(*pool->Allocate(1), ElementsAre(ids[1]));
  EXPECT_EQ(pool->AcquireCached(root, keys[1], Tokens(200)), -1);
  EXPECT_THAT(*pool->Allocate(1), ElementsAre(ids[2]));
  EXPECT_EQ(pool->prefix_cache_stats().evictions, 2);
  EXPECT_EQ(pool->prefix_cache_stats().cached_blocks, 1);
  // a is still there; once taken by a holder it is not evictable, so the pool is dry.
  ASSERT_EQ(pool->AcquireCached(root, keys[0], Tokens(100)), ids[0]);
  EXPECT_EQ(pool->num_free(), 0);
  EXPECT_EQ(pool->Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->ref_count(ids[0]), 1);
}

TEST(PrefixCacheTest, AReleasedSequenceIsEvictedTailFirst) {
  auto pool = MakePool();
  pool->EnablePrefixCache();
  std::vector<int32_t> blocks = *pool->Allocate(3);
  uint64_t parent = pool->PrefixRoot(0);
  for (int i = 0; i < 3; ++i) {
    const uint64_t key = pool->PrefixKey(parent, Tokens(4 * i));
    ASSERT_TRUE(pool->Publish(blocks[i], parent, key, Tokens(4 * i)));
    parent = key;
  }
  pool->Release(blocks);
  std::vector<int32_t> fresh = *pool->Allocate(5);  // the 4 free blocks, then the tail
  EXPECT_EQ(fresh.back(), blocks[2]);
  EXPECT_THAT(*pool->Allocate(1), ElementsAre(blocks[1]));
}

TEST(PrefixCacheTest, BlockTableAdoptsCachedBlocks) {
  auto pool = MakePool();
  pool->EnablePrefixCache();
  std::vector<int32_t> block = *pool->Allocate(1);
  const uint64_t root = pool->PrefixRoot(0);
  const uint64_t key = pool->PrefixKey(root, Tokens(1));
  ASSERT_TRUE(pool->Publish(block[0], root, key, Tokens(1)));
  pool->Release(block);
  BlockTable table;
  table.AppendFull(pool.get(), pool->AcquireCached(root, key, Tokens(1)));
  EXPECT_EQ(table.num_tokens(), 4);
  ASSERT_TRUE(table.Reserve(pool.get(), 6).ok());
  EXPECT_EQ(table.blocks().size(), 2u);
  EXPECT_EQ(table.blocks()[0], block[0]);
  table.ReleaseAll(pool.get());
  EXPECT_EQ(pool->ref_count(block[0]), 0);
  EXPECT_EQ(pool->num_free(), 7);
}

TEST(PrefixCacheTest, ConcurrentAcquireReleaseAndAllocateKeepCountsConsistent) {
  KvCacheConfig config = SmallConfig();
  config.num_blocks = 64;
  auto pool = MakePool(config);
  pool->EnablePrefixCache();
  const uint64_t root = pool->PrefixRoot(0);
  std::atomic<bool> failed{false};
  auto worker = [&](int seed) {
    std::mt19937 rng(seed);
    for (int i = 0; i < 2000; ++i) {
      const int first = static_cast<int>(rng() % 8) * 4;
      const uint64_t key = pool->PrefixKey(root, Tokens(first));
      int32_t b = pool->AcquireCached(root, key, Tokens(first));
      if (b < 0) {
        absl::StatusOr<std::vector<int32_t>> got = pool->Allocate(1);
        if (!got.ok()) continue;
        b = (*got)[0];
        pool->Publish(b, root, key, Tokens(first));
      }
      absl::StatusOr<std::vector<int32_t>> extra = pool->Allocate(static_cast<int>(rng() % 3));
      if (pool->ref_count(b) < 1) failed = true;
      if (extra.ok()) pool->Release(*extra);
      pool->Release({b});
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  EXPECT_FALSE(failed);
  EXPECT_EQ(pool->num_free(), 64);
  const KvBlockPool::PrefixCacheStats stats = pool->prefix_cache_stats();
  EXPECT_EQ(stats.cached_blocks, stats.evictable_blocks);
  EXPECT_LE(stats.cached_blocks, 8);
}

}  // namespace
}  // namespace tandem::engine
