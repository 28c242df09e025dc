#include "common/util/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#if TANDEM_ASAN
#include <sanitizer/asan_interface.h>
#define TANDEM_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define TANDEM_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define TANDEM_POISON(p, n) ((void)(p), (void)(n))
#define TANDEM_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace tandem::util {
namespace {

constexpr size_t kPieceAlign = size_t{4} << 10;
constexpr size_t kSmallAlign = 64;  // under kSlabPieceMinBytes

size_t RoundUp(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

// 2 MiB-aligned memory advised into huge pages; throws std::bad_alloc.
std::byte* AllocateHuge(size_t bytes) {
  void* p = std::aligned_alloc(kHugePageBytes, bytes);
  if (p == nullptr) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure leaves ordinary pages
  return static_cast<std::byte*>(p);
}

struct Slab {
  // Free ranges by offset: disjoint, none adjacent to another (a freed piece merges with its
  // neighbours).
  std::map<size_t, size_t> free{{0, kSlabBytes}};
  size_t used = 0;
};

// The shared slabs of the 64 KiB - 2 MiB pieces. Allocation tries the slab of the last
// allocation first (a model's weights are loaded one after another), then every slab in
// address order; a slab whose pieces are all freed is released unless it is the only empty one.
class SlabPool {
 public:
  void* Allocate(size_t bytes) {
    const size_t size = RoundUp(bytes, kPieceAlign);
    absl::MutexLock lock(&mu_);
    if (auto it = slabs_.find(last_); it != slabs_.end()) {
      if (void* p = Carve(it, size)) return p;
    }
    for (auto it = slabs_.begin(); it != slabs_.end(); ++it) {
      if (void* p = Carve(it, size)) return p;
    }
    std::byte* base = AllocateHuge(kSlabBytes);
    TANDEM_POISON(base, kSlabBytes);
    auto it = slabs_.emplace(reinterpret_cast<uintptr_t>(base), Slab{}).first;
    ++empty_slabs_;
    return Carve(it, size);
  }

  void Free(void* p, size_t bytes) {
    const size_t size = RoundUp(bytes, kPieceAlign);
    const auto address = reinterpret_cast<uintptr_t>(p);
    absl::MutexLock lock(&mu_);
    auto slab = std::prev(slabs_.upper_bound(address));  // p came from this pool: never begin()
    Slab& s = slab->second;
    size_t offset = address - slab->first;
    size_t length = size;
    TANDEM_POISON(p, size);
    auto next = s.free.lower_bound(offset);
    if (next != s.free.end() && next->first == offset + length) {
      length += next->second;
      next = s.free.erase(next);
    }
    if (next != s.free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        length += prev->second;
        s.free.erase(prev);
      }
    }
    s.free.emplace(offset, length);
    s.used -= size;
    if (s.used > 0) return;
    if (empty_slabs_ == 0) {
      ++empty_slabs_;
      return;
    }
    auto* base = reinterpret_cast<std::byte*>(slab->first);
    TANDEM_UNPOISON(base, kSlabBytes);
    std::free(base);
    slabs_.erase(slab);
  }

  SlabUsage Usage() {
    absl::MutexLock lock(&mu_);
    SlabUsage usage{slabs_.size(), 0};
    for (const auto& [base, slab] : slabs_) usage.bytes_in_use += slab.used;
    return usage;
  }

 private:
  // The first free range of the slab at `it` that holds `size`, taken from its front; null when
  // none does.
  void* Carve(std::map<uintptr_t, Slab>::iterator it, size_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Slab& s = it->second;
    if (kSlabBytes - s.used < size) return nullptr;
    for (auto range = s.free.begin(); range != s.free.end(); ++range) {
      if (range->second < size) continue;
      const size_t offset = range->first;
      const size_t left = range->second - size;
      s.free.erase(range);
      if (left > 0) s.free.emplace(offset + size, left);
      if (s.used == 0) --empty_slabs_;
      s.used += size;
      last_ = it->first;
      auto* piece = reinterpret_cast<std::byte*>(it->first) + offset;
      TANDEM_UNPOISON(piece, size);
      return piece;
    }
    return nullptr;
  }

  absl::Mutex mu_;
  std::map<uintptr_t, Slab> slabs_ ABSL_GUARDED_BY(mu_);  // by base address
  uintptr_t last_ ABSL_GUARDED_BY(mu_) = 0;
  int empty_slabs_ ABSL_GUARDED_BY(mu_) = 0;
};

// Never destroyed: buffers held by objects with static storage are freed after main returns.
SlabPool& Slabs() {
  static auto* pool = new SlabPool;
  return *pool;
}

}  // namespace

void* AllocateStreamed(size_t bytes) {
  if (bytes >= kHugePageBytes) return AllocateHuge(RoundUp(bytes, kHugePageBytes));
  if (bytes >= kSlabPieceMinBytes) return Slabs().Allocate(bytes);
  // 64-byte aligned (a cache line, what the kernels' loads and the KV pool want).
  void* p = std::aligned_alloc(kSmallAlign, RoundUp(bytes, kSmallAlign));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void FreeStreamed(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes >= kSlabPieceMinBytes && bytes < kHugePageBytes) {
    Slabs().Free(p, bytes);
  } else {
    std::free(p);
  }
}

SlabUsage StreamedSlabUsage() { return Slabs().Usage(); }

}  // namespace tandem::util
