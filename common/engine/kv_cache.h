// Paged KV cache: one pool of fixed-size blocks shared by every sequence, and the per-sequence
// table that maps token positions to (block, offset).
//
// Memory layout, one contiguous 64-byte-aligned allocation, zero-filled at creation:
//   for each layer l:  K pool (num_blocks blocks of block_bytes())
//                      V pool (num_blocks blocks of block_bytes()); none where the layers keep
//                      keys only (latent attention: its values are its keys' first values,
//                      and the V view is the K pool)
//   state slots:       num_state_slots slots of state_bytes, each padded to 64 bytes, then
//                      num_state_snapshots more for the prefix cache's state snapshots
// (layers here are the model's paged attention layers; a recurrent layer keeps a fixed-size
// state per sequence in its sequence's state slot instead, and so does a sliding-window layer
// its ring of the last positions where the model also has whole-context layers: CacheLayout).
// A block holds (block_size, num_kv_heads, head_dim) values in the config's dtype (float32, bf16,
// or int8 followed by its per-token, per-head scales: common/kernels/kv_format.h). Each pool
// starts on a 64-byte boundary (pools are padded up to a multiple of 64 bytes), so an attention
// kernel indexes a pool by block id and a transport registers data() once and moves whole
// blocks as bytes, whatever the dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/kernels/kv_format.h"
#include "common/model/config.h"

namespace tandem::engine {

struct KvCacheConfig {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;  // tokens per block
  int num_blocks = 0;
  kernels::KvDtype dtype = kernels::KvDtype::kF32;  // how keys and values are stored
  // A layer keeps keys only, and its values are the keys' first values (multi-head latent
  // attention: one "head" of the latent and the rotary key): one pool a layer, not two.
  bool keys_only = false;
  // Per-sequence state of the model's recurrent layers (Gated DeltaNet: convolution tails and
  // recurrent states), one slot of state_bytes per sequence; 0 and 0 when it has none.
  int64_t state_bytes = 0;
  int num_state_slots = 0;
  // Copies of a sequence's state taken at block boundaries, which the prefix cache keeps with
  // the published block ending there (state_bytes each): with recurrent layers a cached prefix
  // can only be resumed where such a snapshot exists. 0 keeps the prefix cache off in a pool
  // with state.
  int num_state_snapshots = 0;

  // INVALID_ARGUMENT naming the first field that is not positive (state: both or neither;
  // snapshots only with state).
  absl::Status Validate() const;
  // The rings in a state slot where the model's sliding-window layers keep their last positions
  // (CacheSpec::kWindowRing) rather than paged blocks of every position, in layer order: where
  // each starts and its blocks (K blocks, then as many V blocks), so that a handoff ships only
  // the blocks holding positions (kv/kv_stream.h). Set by KvCacheConfigFor; ForwardPass::Create
  // lays the model out with rings where there are any (CacheLayoutFor, below). A ring's blocks
  // have its layer's geometry, which may differ from the paged layers' (Gemma 4).
  struct Ring {
    int64_t offset = 0;
    int blocks = 0;
    int64_t block_bytes = 0;
  };
  std::vector<Ring> rings = {};

  // Pools a layer has: K and V, or K alone (keys_only).
  int pools_per_layer() const { return keys_only ? 1 : 2; }
};

// Owns the KV memory and hands out blocks. Blocks are reference counted so that sequences can
// share a prefix: Allocate returns blocks with count 1, Ref adds a holder, Release drops one,
// and a block returns to the free list when its count reaches zero. Allocate, Ref, Release and
// the counters are thread-safe; the memory itself is not guarded (a block's holders coordinate
// writes to it).
//
// Prefix cache (off until EnablePrefixCache; docs/kv-cache.md "Prefix cache"): a full block
// whose KV will not change can be published under a chain key, the hash of its parent's key
// (the previous block's, or PrefixRoot(salt) for a sequence's first block) and its tokens. A
// published block stays published while it is referenced and after: when its last holder
// releases it, it becomes evictable instead of free, and Allocate takes the least recently
// released evictable blocks (and unpublishes them) only once the free list is empty. Lookups
// (AcquireCached) compare the parent key and the tokens, not only the hash, so a colliding
// prompt never reads another's KV. Keys are seeded per pool: a client cannot choose prompts
// that collide.
class KvBlockPool {
 public:
  static constexpr size_t kAlignment = 64;  // bytes, for data() and every k_pool / v_pool

  // INVALID_ARGUMENT for a bad config; RESOURCE_EXHAUSTED when the size overflows or the
  // allocation fails.
  static absl::StatusOr<std::unique_ptr<KvBlockPool>> Create(const KvCacheConfig& config);
  // The same pool laid out in `memory` (`bytes` long, 64-byte aligned, not owned: it must
  // outlive the pool), e.g. memory a KV transport allocated so that peers in other processes
  // can reach it. INVALID_ARGUMENT if it is misaligned or too small; zero-filled here.
  static absl::StatusOr<std::unique_ptr<KvBlockPool>> CreateIn(const KvCacheConfig& config,
                                                               void* memory, size_t bytes);
  // Bytes Create would allocate for `config`.
  static absl::StatusOr<size_t> BytesFor(const KvCacheConfig& config);

  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;
  ~KvBlockPool();

  const KvCacheConfig& config() const { return config_; }

  kernels::KvDtype dtype() const { return config_.dtype; }

  // Block `block` of layer `layer`'s K or V pool (block_bytes() long).
  std::byte* k_block(int layer, int32_t block) { return PoolBase(layer, 0) + BlockOffset(block); }
  std::byte* v_block(int layer, int32_t block) { return PoolBase(layer, 1) + BlockOffset(block); }
  const std::byte* k_block(int layer, int32_t block) const {
    return PoolBase(layer, 0) + BlockOffset(block);
  }
  const std::byte* v_block(int layer, int32_t block) const {
    return PoolBase(layer, 1) + BlockOffset(block);
  }
  // Layer `layer`'s K and V as the attention kernels read them, for a sequence whose blocks are
  // `block_table` (which must outlive the view).
  kernels::PagedKv View(int layer, const int32_t* block_table) const;
  // The same, writable: where a step's keys and values go (Backend::kv_store).
  kernels::PagedKvOut Writer(int layer, const int32_t* block_table);
  // A sliding-window layer's ring (CacheSpec::kWindowRing) in state slot `slot` from byte
  // `offset`: `blocks` K blocks of the layer's geometry (`kv_heads` heads of `head_dim`, in this
  // pool's block size and dtype), then as many V blocks, read through `ring_table` (a position's
  // block b -> b % blocks; it must outlive the view).
  kernels::PagedKv RingView(int32_t slot, int64_t offset, int blocks, int kv_heads, int head_dim,
                            const int32_t* ring_table) const;
  kernels::PagedKvOut RingWriter(int32_t slot, int64_t offset, int blocks, int kv_heads,
                                 int head_dim, const int32_t* ring_table);

  // A float32 pool's layer `layer`, (num_blocks, block_size, num_kv_heads, head_dim) floats;
  // CHECK-fails for another dtype.
  float* k_pool(int layer);
  float* v_pool(int layer);
  const float* k_pool(int layer) const;
  const float* v_pool(int layer) const;

  // Values in one token's slot (num_kv_heads * head_dim) and in one block of one pool
  // (block_size * num_kv_heads * head_dim), and bytes in one block of one pool.
  size_t slot_values() const { return slot_values_; }
  size_t block_values() const { return block_values_; }
  size_t block_bytes() const { return block_bytes_; }
  // Bytes from one layer's K pool to its V pool (and V to the next layer's K; K to the next K
  // with keys only) in a pool of `config`'s geometry: what a peer needs to address another
  // instance's pool.
  static size_t PoolStrideBytes(const KvCacheConfig& config);

  // The whole region, for registering with a transport.
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size_bytes() const { return size_bytes_; }

  // `n` distinct free blocks, each with reference count 1; all or nothing: RESOURCE_EXHAUSTED
  // (with the numbers asked and free) leaves the pool unchanged. INVALID_ARGUMENT for n < 0.
  absl::StatusOr<std::vector<int32_t>> Allocate(int n);
  // Adds one holder to each block; each must be allocated (CHECK).
  void Ref(absl::Span<const int32_t> blocks);
  // Drops one holder from each block; each must be allocated (CHECK). Published blocks left
  // unreferenced become evictable, the last of `blocks` first (a sequence's tail is worth
  // less than its head: every sequence sharing the tail shares the head).
  void Release(absl::Span<const int32_t> blocks);

  // Blocks Allocate can hand out: free ones and evictable (published, unreferenced) ones.
  int num_free() const;

  // A free state slot, zero-filled (a sequence's recurrent layers start from zero state);
  // RESOURCE_EXHAUSTED when none is free or the pool has none.
  absl::StatusOr<int32_t> AllocateState();
  // Returns a slot AllocateState handed out (CHECK).
  void ReleaseState(int32_t slot);
  int num_free_states() const;
  // Slot `slot`'s bytes (state_bytes of them; CHECK on an out-of-range id).
  std::byte* state(int32_t slot);
  const std::byte* state(int32_t slot) const;
  int num_total() const { return config_.num_blocks; }
  int ref_count(int32_t block) const;  // 0 for a free block; CHECK on an out-of-range id

  // Turns the prefix cache on (it cannot be turned off again), except in a pool that keeps
  // recurrent state without room for state snapshots (num_state_snapshots 0), whose cached
  // blocks could not be resumed from: there it stays off, with a warning in the log.
  void EnablePrefixCache();
  bool prefix_cache_enabled() const;
  // The parent key of a sequence's first block: `salt` stands for whatever else changes the
  // KV besides the tokens (the experts prefill ran), so blocks computed under different
  // settings never match.
  uint64_t PrefixRoot(uint64_t salt) const;
  // The key of a block holding `tokens` after the block keyed `parent`.
  uint64_t PrefixKey(uint64_t parent, absl::Span<const int32_t> tokens) const;
  // Publishes `block` (referenced, holding exactly `tokens`, block_size of them, whose KV its
  // holders will not change again) under `key` = PrefixKey(parent, tokens). False, changing
  // nothing, when the cache is off, another block holds the key, or `block` is published.
  bool Publish(int32_t block, uint64_t parent, uint64_t key, absl::Span<const int32_t> tokens);
  // The block published under `key` after `parent` holding `tokens`, with one more holder
  // (Release it like an allocated block); -1 when there is none.
  int32_t AcquireCached(uint64_t parent, uint64_t key, absl::Span<const int32_t> tokens);
  // State snapshots (a pool with recurrent state): SnapshotState copies state slot `slot` (a
  // sequence's state after exactly the tokens up to the end of the block published under `key`,
  // whichever sequence published it) into a snapshot kept with that block, taking a free
  // snapshot or the least recently used one; false, changing nothing, when the cache is off, no
  // block is published under `key` or the pool keeps no snapshots. A snapshot goes when its
  // block is evicted. RestoreState copies the block's snapshot into `slot` (false when it has
  // none); HasStateSnapshot says whether it has one.
  bool SnapshotState(uint64_t key, int32_t slot);
  bool RestoreState(int32_t block, int32_t slot);
  bool HasStateSnapshot(int32_t block) const;

  struct PrefixCacheStats {
    int cached_blocks = 0;     // published, referenced or not
    int evictable_blocks = 0;  // published and unreferenced
    int64_t evictions = 0;     // published blocks Allocate has taken back
    int state_snapshots = 0;   // blocks holding a state snapshot
  };
  PrefixCacheStats prefix_cache_stats() const;

 private:
  struct PoolDelete {
    size_t bytes = 0;  // util::AllocateStreamed's; 0 for memory the caller provided (CreateIn)
    void operator()(std::byte* p) const;
  };

  KvBlockPool(const KvCacheConfig& config, std::unique_ptr<std::byte[], PoolDelete> data,
              size_t size_bytes);
  std::byte* PoolBase(int layer, int kv);  // kv: 0 = K, 1 = V; CHECKs the layer
  const std::byte* PoolBase(int layer, int kv) const;
  size_t BlockOffset(int32_t block) const;  // CHECKs the id
  // K and V at k and v read through `block_table`, in this pool's block size and dtype: a
  // paged layer's pools (this pool's geometry), or a ring's blocks (its layer's heads).
  template <class Byte>
  kernels::BasicPagedKv<Byte> Paged(Byte* k, Byte* v, const int32_t* block_table) const {
    return Paged(k, v, block_table, config_.num_kv_heads, config_.head_dim, block_bytes_);
  }
  template <class Byte>
  kernels::BasicPagedKv<Byte> Paged(Byte* k, Byte* v, const int32_t* block_table, int kv_heads,
                                    int head_dim, size_t block_bytes) const {
    return {.k = k,
            .v = v,
            .dtype = config_.dtype,
            .block_size = config_.block_size,
            .num_kv_heads = kv_heads,
            .head_dim = head_dim,
            .block_bytes = block_bytes,
            .block_table = block_table};
  }

  const KvCacheConfig config_;
  const std::unique_ptr<std::byte[], PoolDelete> data_;
  const size_t slot_values_;
  const size_t block_values_;
  const size_t block_bytes_;
  const size_t pool_stride_bytes_;  // block_bytes * num_blocks, padded to kAlignment
  const size_t size_bytes_;

  // Takes `block` off the evictable list (CHECK that it is there).
  void Unlink(int32_t block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unpublishes the least recently released evictable block and returns it.
  int32_t Evict() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);         // stack of free block ids
  std::vector<int32_t> ref_counts_ ABSL_GUARDED_BY(mu_);   // (num_blocks,)
  std::vector<bool> state_used_ ABSL_GUARDED_BY(mu_);      // (num_state_slots,)
  std::vector<int32_t> free_states_ ABSL_GUARDED_BY(mu_);  // stack of free state slots
  const size_t state_stride_bytes_;                        // state_bytes padded to kAlignment
  const size_t state_base_;                                // where the state slots start in data()

  // Prefix cache: per block (sized when enabled), whether it is published, its key, its
  // parent's key and its tokens; the published blocks by key; the evictable ones as a list
  // through prev/next ids (-1 ends it), oldest first.
  const uint64_t seed_;
  bool prefix_cache_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<bool> published_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> key_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> parent_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);  // (num_blocks, block_size)
  absl::flat_hash_map<uint64_t, int32_t> by_key_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> lru_prev_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> lru_next_ ABSL_GUARDED_BY(mu_);
  int32_t lru_head_ ABSL_GUARDED_BY(mu_) = -1;  // least recently released
  int32_t lru_tail_ ABSL_GUARDED_BY(mu_) = -1;
  int num_evictable_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  // State snapshots: each block's snapshot (-1: none), each snapshot's block (-1: free) and
  // when it was last written or read (a clock), for reclaiming the least recently used.
  std::vector<int32_t> snapshot_of_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> snapshot_block_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> snapshot_used_ ABSL_GUARDED_BY(mu_);
  uint64_t snapshot_clock_ ABSL_GUARDED_BY(mu_) = 0;
  // Snapshot `snapshot`'s bytes (after the sequences' slots).
  std::byte* snapshot(int32_t snapshot);
};

// Where a token position lives in the pool.
struct BlockSlot {
  int32_t block = 0;
  int offset = 0;  // in [0, block_size)
};

// One sequence's blocks, in position order, and how many tokens they hold. Position p lives in
// blocks()[p / block_size] at offset p % block_size. Not thread-safe. The table does not
// release its blocks when destroyed: the owner calls ReleaseAll. Between ReleaseAll calls every
// call must pass the same pool (CHECK).
class BlockTable {
 public:
  BlockTable() = default;

  int num_tokens() const { return num_tokens_; }
  const std::vector<int32_t>& blocks() const { return blocks_; }
  int capacity_tokens(int block_size) const {
    return static_cast<int>(blocks_.size()) * block_size;
  }

  // Allocates the blocks needed to hold `new_num_tokens` tokens (none if they are held
  // already), and the sequence's state slot on first use where the pool keeps recurrent state.
  // All or nothing: on RESOURCE_EXHAUSTED the table is unchanged.
  absl::Status Reserve(KvBlockPool* pool, int new_num_tokens);
  // Marks `n` more tokens as written; num_tokens() + n must not exceed the capacity (CHECK).
  void Append(int n);
  // Appends `block`, full of written tokens, taking over the caller's reference to it (a block
  // from KvBlockPool::AcquireCached). The table must hold whole blocks only, all written
  // (CHECK).
  void AppendFull(KvBlockPool* pool, int32_t block);
  // Releases every block (and the state slot) to `pool` and empties the table.
  void ReleaseAll(KvBlockPool* pool);
  // The sequence's state slot in the pool; -1 when it has none.
  int32_t state_slot() const { return state_slot_; }

  // Where position `position` lives; it must be within the reserved capacity (CHECK), which
  // may be beyond num_tokens() (a step writes new tokens' slots before Append).
  BlockSlot Locate(int position, int block_size) const;

  // The (num_kv_heads, head_dim) key / value slot of `position` in layer `layer` of a float32
  // pool (CHECK).
  float* KeySlot(KvBlockPool& pool, int layer, int position) const;
  float* ValueSlot(KvBlockPool& pool, int layer, int position) const;
  const float* KeySlot(const KvBlockPool& pool, int layer, int position) const;
  const float* ValueSlot(const KvBlockPool& pool, int layer, int position) const;

 private:
  size_t SlotOffset(const KvBlockPool& pool, int position) const;

  void BindPool(const KvBlockPool* pool);             // on first use; then CHECKs sameness
  void CheckSamePool(const KvBlockPool* pool) const;  // CHECK

  std::vector<int32_t> blocks_;
  int32_t state_slot_ = -1;
  int num_tokens_ = 0;
  const KvBlockPool* pool_ = nullptr;  // the pool the blocks come from, once known
};

// A prompt's tokens a windowed layer's ring holds beyond its window: a step's run of a
// sequence's tokens is attended in rounds of at least this many (AttentionBlock).
inline constexpr int kRingRoundTokens = 256;

// Where each layer of a model keeps its cache in a KvBlockPool of a given block size and dtype
// (each layer's CacheSpec): attention and latent attention layers in consecutive layers of the
// pool (paged K/V of every position); a sliding-window attention layer, where the model also
// has layers attending to the whole context, in a ring of blocks in its sequence's state slot
// that holds only the last positions (its window and a round's tokens: the blocks falling out
// of the window are reused, not kept); recurrent layers (Gated DeltaNet) at consecutive offsets
// of the state slot. A windowed layer whose shape differs from the paged layers' (Gemma 4's
// sliding layers beside its global ones) keeps a ring whatever `window_rings` says: the paged
// pool has one geometry.
struct CacheLayout {
  std::vector<int> kv_layers;             // (layers): the pool layer of a paged layer, else -1
  std::vector<int64_t> state_offsets;     // (layers): the byte offset of a layer's state or ring
                                          // in its sequence's state slot, else -1
  std::vector<int> ring_blocks;           // (layers): blocks of a windowed layer's ring, else 0
  std::vector<int64_t> ring_block_bytes;  // (layers): bytes of one of its blocks, else 0
  int paged_layers = 0;
  int64_t state_bytes = 0;  // a sequence's state slot: recurrent states, then rings
};

// The cache layout of `config` in a pool of `block_size` and `dtype` (CacheLayout),
// its windowed layers in rings where `window_rings` (and the model has a layer that pages its
// whole context), else paged like the others.
CacheLayout CacheLayoutFor(const model::ModelConfig& config, int block_size, kernels::KvDtype dtype,
                           bool window_rings = true);

// The KV pool a model needs: paged K/V for its attention layers and, where it has recurrent
// layers or windowed layers kept in rings (`window_rings`), a state slot per sequence for
// `max_sequences` sequences at once.
KvCacheConfig KvCacheConfigFor(const model::ModelConfig& config, int block_size, int num_blocks,
                               kernels::KvDtype dtype, int max_sequences, bool window_rings = true);

}  // namespace tandem::engine
