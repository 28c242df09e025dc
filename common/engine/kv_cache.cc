#include "common/engine/kv_cache.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <random>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/util/huge_pages.h"
#include "common/util/logging.h"
#include "common/util/status.h"

namespace tandem::engine {
namespace {

bool MulOverflows(size_t a, size_t b, size_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

absl::Status KvCacheConfig::Validate() const {
  const std::pair<const char*, int> fields[] = {{"num_layers", num_layers},
                                                {"num_kv_heads", num_kv_heads},
                                                {"head_dim", head_dim},
                                                {"block_size", block_size},
                                                {"num_blocks", num_blocks}};
  for (const auto& [name, value] : fields) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV cache ", name, " must be positive, got ", value));
    }
  }
  if (state_bytes < 0 || num_state_slots < 0 || (state_bytes > 0) != (num_state_slots > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache state slots (", num_state_slots,
                                                   " of ", state_bytes,
                                                   " bytes) must both be positive or both zero"));
  }
  if (num_state_snapshots < 0 || (num_state_snapshots > 0 && state_bytes == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache state snapshots (", num_state_snapshots,
                     ") must be zero, or positive in a pool that keeps recurrent state"));
  }
  return absl::OkStatus();
}

void KvBlockPool::PoolDelete::operator()(std::byte* p) const {
  if (bytes > 0) util::FreeStreamed(p, bytes);
}

absl::StatusOr<size_t> KvBlockPool::BytesFor(const KvCacheConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  // Values in a block, then bytes (at most 4 a value plus int8's 4-byte scales per head_dim).
  size_t slot = 0, values = 0, worst_block = 0, pool = 0, total = 0;
  const bool overflows = MulOverflows(config.num_kv_heads, config.head_dim, &slot) ||
                         MulOverflows(slot, config.block_size, &values) ||
                         MulOverflows(values, 2 * sizeof(float), &worst_block) ||
                         MulOverflows(kernels::KvBlockBytes(config.dtype, config.block_size,
                                                            config.num_kv_heads, config.head_dim),
                                      config.num_blocks, &pool) ||
                         pool > SIZE_MAX - kAlignment ||
                         MulOverflows((pool + kAlignment - 1) / kAlignment * kAlignment,
                                      static_cast<size_t>(config.pools_per_layer()) *
                                          static_cast<size_t>(config.num_layers),
                                      &total) ||
                         total > static_cast<size_t>(PTRDIFF_MAX);
  size_t states = 0;
  const bool states_overflow =
      config.state_bytes > static_cast<int64_t>(PTRDIFF_MAX / 2) ||
      MulOverflows(
          (static_cast<size_t>(config.state_bytes) + kAlignment - 1) / kAlignment * kAlignment,
          static_cast<size_t>(config.num_state_slots) +
              static_cast<size_t>(std::max(config.num_state_snapshots, 0)),
          &states) ||
      states > static_cast<size_t>(PTRDIFF_MAX) - total;
  if (states_overflow) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache state slots overflow: ", config.num_state_slots, " + ",
                     config.num_state_snapshots, " x ", config.state_bytes, " bytes"));
  }
  total += states;
  if (overflows) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache size overflows: ", config.num_layers, " layers x ",
                     config.pools_per_layer(), " x ", config.num_blocks, " blocks x ",
                     config.block_size, " tokens x ", config.num_kv_heads, " heads x ",
                     config.head_dim, " ", kernels::KvDtypeName(config.dtype), " values"));
  }
  return total;
}

absl::StatusOr<std::unique_ptr<KvBlockPool>> KvBlockPool::CreateIn(const KvCacheConfig& config,
                                                                   void* memory, size_t bytes) {
  ASSIGN_OR_RETURN(const size_t needed, BytesFor(config));
  if (memory == nullptr || reinterpret_cast<uintptr_t>(memory) % kAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool memory must be ", kAlignment, "-byte aligned"));
  }
  if (bytes < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool memory holds ", bytes, " bytes; the pool needs ", needed));
  }
  std::memset(memory, 0, needed);
  std::unique_ptr<std::byte[], PoolDelete> data(static_cast<std::byte*>(memory), PoolDelete{});
  return std::unique_ptr<KvBlockPool>(new KvBlockPool(config, std::move(data), needed));
}

absl::StatusOr<std::unique_ptr<KvBlockPool>> KvBlockPool::Create(const KvCacheConfig& config) {
  ASSIGN_OR_RETURN(const size_t bytes, BytesFor(config));
  // In transparent huge pages, as the weights (util/huge_pages.h): attention walks gigabytes of
  // KV, and with 4 KiB pages every 4 KiB of it is a TLB miss.
  void* memory = nullptr;
  try {
    memory = util::AllocateStreamed(bytes);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes for the KV cache"));
  }
  // Zero-filling commits the pages now, so a pool that does not fit fails at start-up rather
  // than mid-request, and unwritten slots read as zeros rather than garbage.
  std::memset(memory, 0, bytes);
  std::unique_ptr<std::byte[], PoolDelete> data(static_cast<std::byte*>(memory), PoolDelete{bytes});
  return std::unique_ptr<KvBlockPool>(new KvBlockPool(config, std::move(data), bytes));
}

KvBlockPool::KvBlockPool(const KvCacheConfig& config, std::unique_ptr<std::byte[], PoolDelete> data,
                         size_t size_bytes)
    : config_(config),
      data_(std::move(data)),
      slot_values_(static_cast<size_t>(config.num_kv_heads) * config.head_dim),
      block_values_(slot_values_ * config.block_size),
      block_bytes_(kernels::KvBlockBytes(config.dtype, config.block_size, config.num_kv_heads,
                                         config.head_dim)),
      pool_stride_bytes_(PoolStrideBytes(config)),
      size_bytes_(size_bytes),
      ref_counts_(config.num_blocks, 0),
      state_used_(config.num_state_slots, false),
      state_stride_bytes_((static_cast<size_t>(config.state_bytes) + kAlignment - 1) / kAlignment *
                          kAlignment),
      state_base_(static_cast<size_t>(config.pools_per_layer()) *
                  static_cast<size_t>(config.num_layers) * pool_stride_bytes_),
      seed_([] {
        std::random_device device;
        return (uint64_t{device()} << 32) ^ device();
      }()) {
  // Popped from the back, so a fresh pool hands out ids 0, 1, 2, ...
  free_.reserve(config.num_blocks);
  for (int32_t b = config.num_blocks - 1; b >= 0; --b) free_.push_back(b);
  for (int32_t s = config.num_state_slots - 1; s >= 0; --s) free_states_.push_back(s);
}

absl::StatusOr<int32_t> KvBlockPool::AllocateState() {
  int32_t slot;
  {
    absl::MutexLock lock(&mu_);
    if (free_states_.empty()) {
      return absl::ResourceExhaustedError(absl::StrCat("no free state slot for a sequence (all ",
                                                       config_.num_state_slots, " in use)"));
    }
    slot = free_states_.back();
    free_states_.pop_back();
    state_used_[slot] = true;
  }
  std::memset(state(slot), 0, static_cast<size_t>(config_.state_bytes));
  return slot;
}

void KvBlockPool::ReleaseState(int32_t slot) {
  absl::MutexLock lock(&mu_);
  TANDEM_CHECK(slot >= 0 && slot < config_.num_state_slots && state_used_[slot])
      << "release of state slot " << slot << ", which is not allocated";
  state_used_[slot] = false;
  free_states_.push_back(slot);
}

int KvBlockPool::num_free_states() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(free_states_.size());
}

const std::byte* KvBlockPool::state(int32_t slot) const {
  TANDEM_CHECK(slot >= 0 && slot < config_.num_state_slots)
      << "state slot " << slot << " outside [0, " << config_.num_state_slots << ")";
  return data_.get() + state_base_ + static_cast<size_t>(slot) * state_stride_bytes_;
}

std::byte* KvBlockPool::state(int32_t slot) {
  return const_cast<std::byte*>(std::as_const(*this).state(slot));
}

KvBlockPool::~KvBlockPool() = default;

size_t KvBlockPool::PoolStrideBytes(const KvCacheConfig& config) {
  const size_t pool =
      kernels::KvBlockBytes(config.dtype, config.block_size, config.num_kv_heads, config.head_dim) *
      config.num_blocks;
  return (pool + kAlignment - 1) / kAlignment * kAlignment;
}

const std::byte* KvBlockPool::PoolBase(int layer, int kv) const {
  TANDEM_CHECK(layer >= 0 && layer < config_.num_layers)
      << "layer " << layer << " outside [0, " << config_.num_layers << ")";
  const size_t pools = static_cast<size_t>(config_.pools_per_layer());
  return data_.get() +
         (pools * static_cast<size_t>(layer) + (config_.keys_only ? 0 : kv)) * pool_stride_bytes_;
}

std::byte* KvBlockPool::PoolBase(int layer, int kv) {
  return const_cast<std::byte*>(std::as_const(*this).PoolBase(layer, kv));
}

size_t KvBlockPool::BlockOffset(int32_t block) const {
  TANDEM_CHECK(block >= 0 && block < config_.num_blocks)
      << "KV block id " << block << " out of range";
  return static_cast<size_t>(block) * block_bytes_;
}

kernels::PagedKv KvBlockPool::View(int layer, const int32_t* block_table) const {
  return Paged(PoolBase(layer, 0), PoolBase(layer, 1), block_table);
}

kernels::PagedKvOut KvBlockPool::Writer(int layer, const int32_t* block_table) {
  return Paged(PoolBase(layer, 0), PoolBase(layer, 1), block_table);
}

kernels::PagedKv KvBlockPool::RingView(int32_t slot, int64_t offset, int blocks, int kv_heads,
                                       int head_dim, const int32_t* ring_table) const {
  const size_t block_bytes =
      kernels::KvBlockBytes(config_.dtype, config_.block_size, kv_heads, head_dim);
  const size_t ring_bytes = static_cast<size_t>(blocks) * block_bytes;
  TANDEM_CHECK(offset >= 0 && static_cast<size_t>(offset) + 2 * ring_bytes <=
                                  static_cast<size_t>(config_.state_bytes))
      << "ring at " << offset << " outside a state slot of " << config_.state_bytes << " bytes";
  const std::byte* k = state(slot) + offset;
  return Paged(k, k + ring_bytes, ring_table, kv_heads, head_dim, block_bytes);
}

kernels::PagedKvOut KvBlockPool::RingWriter(int32_t slot, int64_t offset, int blocks, int kv_heads,
                                            int head_dim, const int32_t* ring_table) {
  const kernels::PagedKv view =
      std::as_const(*this).RingView(slot, offset, blocks, kv_heads, head_dim, ring_table);
  return Paged(const_cast<std::byte*>(view.k), const_cast<std::byte*>(view.v), ring_table, kv_heads,
               head_dim, view.block_bytes);
}

float* KvBlockPool::k_pool(int layer) {
  return const_cast<float*>(std::as_const(*this).k_pool(layer));
}
float* KvBlockPool::v_pool(int layer) {
  return const_cast<float*>(std::as_const(*this).v_pool(layer));
}
const float* KvBlockPool::k_pool(int layer) const {
  TANDEM_CHECK(config_.dtype == kernels::KvDtype::kF32)
      << "k_pool of a " << kernels::KvDtypeName(config_.dtype) << " KV pool";
  return reinterpret_cast<const float*>(PoolBase(layer, 0));
}
const float* KvBlockPool::v_pool(int layer) const {
  TANDEM_CHECK(config_.dtype == kernels::KvDtype::kF32)
      << "v_pool of a " << kernels::KvDtypeName(config_.dtype) << " KV pool";
  return reinterpret_cast<const float*>(PoolBase(layer, 1));
}

absl::StatusOr<std::vector<int32_t>> KvBlockPool::Allocate(int n) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", n, " KV blocks"));
  }
  absl::MutexLock lock(&mu_);
  const size_t available = free_.size() + num_evictable_;
  if (static_cast<size_t>(n) > available) {
    return absl::ResourceExhaustedError(absl::StrCat("asked for ", n, " KV blocks but only ",
                                                     available, " of ", config_.num_blocks,
                                                     " are free"));
  }
  const int from_free = std::min(n, static_cast<int>(free_.size()));
  std::vector<int32_t> blocks(free_.rbegin(), free_.rbegin() + from_free);
  free_.resize(free_.size() - from_free);
  while (static_cast<int>(blocks.size()) < n) blocks.push_back(Evict());
  for (int32_t b : blocks) ref_counts_[b] = 1;
  return blocks;
}

void KvBlockPool::Ref(absl::Span<const int32_t> blocks) {
  absl::MutexLock lock(&mu_);
  for (int32_t b : blocks) {
    TANDEM_CHECK(b >= 0 && b < config_.num_blocks) << "KV block id " << b << " out of range";
    TANDEM_CHECK(ref_counts_[b] > 0) << "Ref of free KV block " << b;
    ++ref_counts_[b];
  }
}

void KvBlockPool::Release(absl::Span<const int32_t> blocks) {
  absl::MutexLock lock(&mu_);
  for (int32_t b : blocks) {
    TANDEM_CHECK(b >= 0 && b < config_.num_blocks) << "KV block id " << b << " out of range";
    TANDEM_CHECK(ref_counts_[b] > 0) << "Release of free KV block " << b;
  }
  // Free blocks go back in order (a fresh pool's ids stay predictable); published ones join
  // the evictable list tail first, so a sequence's tail is evicted before its head.
  for (int32_t b : blocks) {
    if (--ref_counts_[b] == 0 && !(prefix_cache_ && published_[b])) free_.push_back(b);
  }
  if (!prefix_cache_) return;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t b = *it;
    if (ref_counts_[b] != 0 || !published_[b] || lru_prev_[b] != -1 || lru_head_ == b) continue;
    lru_prev_[b] = lru_tail_;
    lru_next_[b] = -1;
    if (lru_tail_ >= 0) {
      lru_next_[lru_tail_] = b;
    } else {
      lru_head_ = b;
    }
    lru_tail_ = b;
    ++num_evictable_;
  }
}

void KvBlockPool::Unlink(int32_t block) {
  TANDEM_CHECK(lru_prev_[block] != -1 || lru_head_ == block)
      << "KV block " << block << " is not evictable";
  const int32_t prev = lru_prev_[block], next = lru_next_[block];
  if (prev >= 0) {
    lru_next_[prev] = next;
  } else {
    lru_head_ = next;
  }
  if (next >= 0) {
    lru_prev_[next] = prev;
  } else {
    lru_tail_ = prev;
  }
  lru_prev_[block] = lru_next_[block] = -1;
  --num_evictable_;
}

int32_t KvBlockPool::Evict() {
  const int32_t b = lru_head_;
  TANDEM_CHECK(b >= 0) << "no evictable KV block";
  Unlink(b);
  published_[b] = false;
  by_key_.erase(key_[b]);
  if (const int32_t s = snapshot_of_[b]; s >= 0) {
    snapshot_block_[s] = -1;
    snapshot_of_[b] = -1;
  }
  ++evictions_;
  return b;
}

int KvBlockPool::num_free() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(free_.size()) + num_evictable_;
}

int KvBlockPool::ref_count(int32_t block) const {
  TANDEM_CHECK(block >= 0 && block < config_.num_blocks)
      << "KV block id " << block << " out of range";
  absl::MutexLock lock(&mu_);
  return ref_counts_[block];
}

void KvBlockPool::EnablePrefixCache() {
  if (config_.num_state_slots > 0 && config_.num_state_snapshots == 0) {
    TANDEM_LOG(WARNING) << "prefix cache off: the model's recurrent layers (Gated DeltaNet) "
                           "resume a cached prefix only from a state snapshot, and the pool "
                           "keeps none (--prefix_state_snapshots 0)";
    return;
  }
  absl::MutexLock lock(&mu_);
  if (prefix_cache_) return;
  const size_t n = config_.num_blocks;
  published_.assign(n, false);
  key_.assign(n, 0);
  parent_.assign(n, 0);
  tokens_.assign(n * config_.block_size, 0);
  lru_prev_.assign(n, -1);
  lru_next_.assign(n, -1);
  snapshot_of_.assign(n, -1);
  snapshot_block_.assign(config_.num_state_snapshots, -1);
  snapshot_used_.assign(config_.num_state_snapshots, 0);
  prefix_cache_ = true;
}

std::byte* KvBlockPool::snapshot(int32_t snapshot) {
  return data_.get() + state_base_ +
         static_cast<size_t>(config_.num_state_slots + snapshot) * state_stride_bytes_;
}

bool KvBlockPool::SnapshotState(uint64_t key, int32_t slot) {
  absl::MutexLock lock(&mu_);
  if (!prefix_cache_ || config_.num_state_snapshots == 0) return false;
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return false;
  const int32_t block = it->second;
  TANDEM_CHECK(slot >= 0 && slot < config_.num_state_slots && state_used_[slot])
      << "snapshot of state slot " << slot << ", which is not allocated";
  int32_t s = snapshot_of_[block];
  if (s < 0) {
    // A free snapshot, else the least recently used one, taken from its block.
    s = 0;
    for (int32_t i = 0; i < config_.num_state_snapshots; ++i) {
      if (snapshot_block_[i] < 0) {
        s = i;
        break;
      }
      if (snapshot_used_[i] < snapshot_used_[s]) s = i;
    }
    if (snapshot_block_[s] >= 0) snapshot_of_[snapshot_block_[s]] = -1;
    snapshot_block_[s] = block;
    snapshot_of_[block] = s;
  }
  snapshot_used_[s] = ++snapshot_clock_;
  std::memcpy(snapshot(s), state(slot), static_cast<size_t>(config_.state_bytes));
  return true;
}

bool KvBlockPool::RestoreState(int32_t block, int32_t slot) {
  TANDEM_CHECK(block >= 0 && block < config_.num_blocks)
      << "KV block id " << block << " out of range";
  absl::MutexLock lock(&mu_);
  if (!prefix_cache_ || snapshot_of_[block] < 0) return false;
  TANDEM_CHECK(slot >= 0 && slot < config_.num_state_slots && state_used_[slot])
      << "restore into state slot " << slot << ", which is not allocated";
  const int32_t s = snapshot_of_[block];
  snapshot_used_[s] = ++snapshot_clock_;
  std::memcpy(state(slot), snapshot(s), static_cast<size_t>(config_.state_bytes));
  return true;
}

bool KvBlockPool::HasStateSnapshot(int32_t block) const {
  TANDEM_CHECK(block >= 0 && block < config_.num_blocks)
      << "KV block id " << block << " out of range";
  absl::MutexLock lock(&mu_);
  return prefix_cache_ && snapshot_of_[block] >= 0;
}

bool KvBlockPool::prefix_cache_enabled() const {
  absl::MutexLock lock(&mu_);
  return prefix_cache_;
}

uint64_t KvBlockPool::PrefixRoot(uint64_t salt) const {
  return absl::Hash<std::tuple<uint64_t, uint64_t, std::string_view>>()(
      std::make_tuple(seed_, salt, std::string_view("tandem prefix root")));
}

uint64_t KvBlockPool::PrefixKey(uint64_t parent, absl::Span<const int32_t> tokens) const {
  const std::string_view bytes(reinterpret_cast<const char*>(tokens.data()),
                               tokens.size() * sizeof(int32_t));
  return absl::Hash<std::tuple<uint64_t, uint64_t, std::string_view>>()(
      std::make_tuple(seed_, parent, bytes));
}

bool KvBlockPool::Publish(int32_t block, uint64_t parent, uint64_t key,
                          absl::Span<const int32_t> tokens) {
  TANDEM_CHECK(block >= 0 && block < config_.num_blocks)
      << "KV block id " << block << " out of range";
  TANDEM_CHECK(static_cast<int>(tokens.size()) == config_.block_size)
      << "a published block holds " << config_.block_size << " tokens, not " << tokens.size();
  absl::MutexLock lock(&mu_);
  TANDEM_CHECK(ref_counts_[block] > 0) << "Publish of free KV block " << block;
  if (!prefix_cache_ || published_[block] || by_key_.contains(key)) return false;
  published_[block] = true;
  key_[block] = key;
  parent_[block] = parent;
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<size_t>(block) * config_.block_size);
  by_key_[key] = block;
  return true;
}

int32_t KvBlockPool::AcquireCached(uint64_t parent, uint64_t key,
                                   absl::Span<const int32_t> tokens) {
  absl::MutexLock lock(&mu_);
  if (!prefix_cache_ || static_cast<int>(tokens.size()) != config_.block_size) return -1;
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  const int32_t b = it->second;
  const auto held = tokens_.begin() + static_cast<size_t>(b) * config_.block_size;
  if (parent_[b] != parent || !std::equal(tokens.begin(), tokens.end(), held)) return -1;
  if (ref_counts_[b] == 0) Unlink(b);
  ++ref_counts_[b];
  return b;
}

KvBlockPool::PrefixCacheStats KvBlockPool::prefix_cache_stats() const {
  absl::MutexLock lock(&mu_);
  PrefixCacheStats stats;
  stats.cached_blocks = static_cast<int>(by_key_.size());
  stats.evictable_blocks = num_evictable_;
  stats.evictions = evictions_;
  stats.state_snapshots = static_cast<int>(std::count_if(
      snapshot_block_.begin(), snapshot_block_.end(), [](int32_t b) { return b >= 0; }));
  return stats;
}

void BlockTable::BindPool(const KvBlockPool* pool) {
  TANDEM_CHECK(pool != nullptr);
  if (pool_ == nullptr) pool_ = pool;
  CheckSamePool(pool);
}

void BlockTable::CheckSamePool(const KvBlockPool* pool) const {
  TANDEM_CHECK(pool_ == nullptr || pool == pool_) << "block table used with a second KV pool";
}

absl::Status BlockTable::Reserve(KvBlockPool* pool, int new_num_tokens) {
  if (new_num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reserve KV space for ", new_num_tokens, " tokens"));
  }
  BindPool(pool);
  const int64_t block_size = pool->config().block_size;
  const int64_t needed = (new_num_tokens + block_size - 1) / block_size;
  const int64_t have = static_cast<int64_t>(blocks_.size());
  const bool wants_state = pool->config().num_state_slots > 0 && state_slot_ < 0;
  if (needed <= have && !wants_state) return absl::OkStatus();
  int32_t state = -1;
  if (wants_state) {
    ASSIGN_OR_RETURN(state, pool->AllocateState());
  }
  if (needed > have) {
    absl::StatusOr<std::vector<int32_t>> fresh = pool->Allocate(static_cast<int>(needed - have));
    if (!fresh.ok()) {
      if (state >= 0) pool->ReleaseState(state);
      return fresh.status();
    }
    blocks_.insert(blocks_.end(), fresh->begin(), fresh->end());
  }
  if (state >= 0) state_slot_ = state;
  return absl::OkStatus();
}

void BlockTable::Append(int n) {
  const int capacity = pool_ == nullptr ? 0 : capacity_tokens(pool_->config().block_size);
  TANDEM_CHECK(n >= 0 && num_tokens_ + n <= capacity)
      << "append of " << n << " tokens to " << num_tokens_ << " with capacity " << capacity;
  num_tokens_ += n;
}

void BlockTable::AppendFull(KvBlockPool* pool, int32_t block) {
  BindPool(pool);
  const int block_size = pool->config().block_size;
  TANDEM_CHECK(num_tokens_ == capacity_tokens(block_size))
      << "a full block appended to a table holding " << num_tokens_ << " tokens in room for "
      << capacity_tokens(block_size);
  blocks_.push_back(block);
  num_tokens_ += block_size;
}

void BlockTable::ReleaseAll(KvBlockPool* pool) {
  if (!blocks_.empty()) {
    CheckSamePool(pool);
    pool->Release(blocks_);
  }
  if (state_slot_ >= 0) {
    CheckSamePool(pool);
    pool->ReleaseState(state_slot_);
    state_slot_ = -1;
  }
  blocks_.clear();
  num_tokens_ = 0;
  pool_ = nullptr;
}

BlockSlot BlockTable::Locate(int position, int block_size) const {
  TANDEM_CHECK(position >= 0 && position < capacity_tokens(block_size))
      << "position " << position << " outside the reserved " << capacity_tokens(block_size)
      << " tokens";
  return BlockSlot{blocks_[position / block_size], position % block_size};
}

size_t BlockTable::SlotOffset(const KvBlockPool& pool, int position) const {
  CheckSamePool(&pool);
  const BlockSlot slot = Locate(position, pool.config().block_size);
  return static_cast<size_t>(slot.block) * pool.block_values() +
         static_cast<size_t>(slot.offset) * pool.slot_values();
}

float* BlockTable::KeySlot(KvBlockPool& pool, int layer, int position) const {
  return pool.k_pool(layer) + SlotOffset(pool, position);
}

float* BlockTable::ValueSlot(KvBlockPool& pool, int layer, int position) const {
  return pool.v_pool(layer) + SlotOffset(pool, position);
}

const float* BlockTable::KeySlot(const KvBlockPool& pool, int layer, int position) const {
  return pool.k_pool(layer) + SlotOffset(pool, position);
}

const float* BlockTable::ValueSlot(const KvBlockPool& pool, int layer, int position) const {
  return pool.v_pool(layer) + SlotOffset(pool, position);
}

CacheLayout CacheLayoutFor(const model::ModelConfig& c, int block_size, kernels::KvDtype dtype,
                           bool window_rings) {
  CacheLayout layout;
  const int layers = static_cast<int>(c.num_hidden_layers);
  layout.kv_layers.assign(layers, -1);
  layout.state_offsets.assign(layers, -1);
  layout.ring_blocks.assign(layers, 0);
  layout.ring_block_bytes.assign(layers, 0);
  // Rings only where some layer pages the whole context: a model whose every attention layer
  // slides keeps them paged (its blocks are what the prefix cache and the handoff index).
  bool whole_context = false;  // and so rings
  for (int l = 0; l < layers; ++l) {
    whole_context |= c.Mixer(l) != model::MixerKind::kGatedDeltaNet && c.LayerWindow(l) == 0;
  }
  const model::ModelConfig::KvShape shape = c.kv_shape();
  for (int l = 0; l < layers; ++l) {
    // A layer of another shape than the paged layers' cannot share their pool.
    const model::AttentionShape own = c.LayerAttention(l);
    const bool other_shape = c.Mixer(l) == model::MixerKind::kAttention &&
                             (own.kv_heads != shape.heads || own.head_dim != shape.head_dim);
    if (c.Mixer(l) == model::MixerKind::kGatedDeltaNet) {
      layout.state_offsets[l] = layout.state_bytes;
      layout.state_bytes += c.linear.state_bytes();
    } else if (c.LayerWindow(l) == 0 ||
               ((!window_rings || !whole_context || block_size <= 0) && !other_shape)) {
      layout.kv_layers[l] = layout.paged_layers++;
    }
  }
  for (int l = 0; l < layers; ++l) {
    if (layout.kv_layers[l] >= 0 || layout.state_offsets[l] >= 0) continue;
    // The window and at least kRingRoundTokens more: a round of a prompt's tokens stores its
    // keys and values, then attends, without overwriting a position its queries read.
    const int64_t tokens = c.LayerWindow(l) - 1 + kRingRoundTokens;
    layout.ring_blocks[l] = static_cast<int>((tokens + block_size - 1) / block_size);
    const model::AttentionShape own = c.LayerAttention(l);
    layout.ring_block_bytes[l] = static_cast<int64_t>(kernels::KvBlockBytes(
        dtype, block_size, static_cast<int>(own.kv_heads), static_cast<int>(own.head_dim)));
    layout.state_bytes = (layout.state_bytes + 63) / 64 * 64;  // rings start 64-byte aligned
    layout.state_offsets[l] = layout.state_bytes;
    // K ring, then V ring
    layout.state_bytes += 2 * layout.ring_blocks[l] * layout.ring_block_bytes[l];
  }
  return layout;
}

KvCacheConfig KvCacheConfigFor(const model::ModelConfig& c, int block_size, int num_blocks,
                               kernels::KvDtype dtype, int max_sequences, bool window_rings) {
  KvCacheConfig kv;
  const model::ModelConfig::KvShape shape = c.kv_shape();
  const CacheLayout layout = CacheLayoutFor(c, block_size, dtype, window_rings);
  for (size_t l = 0; l < layout.ring_blocks.size(); ++l) {
    if (layout.ring_blocks[l] > 0)
      kv.rings.push_back(
          {layout.state_offsets[l], layout.ring_blocks[l], layout.ring_block_bytes[l]});
  }
  kv.num_layers = layout.paged_layers;
  kv.num_kv_heads = shape.heads;
  kv.head_dim = shape.head_dim;
  kv.keys_only = shape.keys_only;
  kv.block_size = block_size;
  kv.num_blocks = num_blocks;
  kv.dtype = dtype;
  if (layout.state_bytes > 0) {
    kv.state_bytes = layout.state_bytes;
    kv.num_state_slots = max_sequences;
  }
  return kv;
}

}  // namespace tandem::engine
