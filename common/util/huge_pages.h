// An allocator for large, long-lived buffers that are streamed from memory (model weights, the KV
// pool, an expert pack held in host memory), kept in transparent huge pages (MADV_HUGEPAGE; the
// kernel default here is "madvise", so nothing is huge unless asked). Streaming gigabytes
// through 4 KiB pages costs a TLB miss and page walk every 4 KiB, and the hardware prefetchers
// stop at each page edge: measured on 2 cores, random 7 MiB bf16 products over a 3 GiB pool ran
// at 16-31 GB/s on 4 KiB pages and 40-42 GB/s on huge pages; an int4 batch-1 decode step whose
// 2 MB expert matrices came from malloc ran about 1.1x slower than with them in huge pages.
//
// By size:
// - 2 MiB and more: an allocation of its own, 2 MiB-aligned, rounded up to whole huge pages;
// - from 64 KiB to under 2 MiB (an int4 expert of a small or fine-grained model, a k or v
//   projection): a piece of a shared slab of huge pages, 4 KiB-aligned, first fit among the
//   slabs' free ranges (freed pieces merge with their free neighbours; a slab wholly free is
//   released, but one is kept for the next allocation), so such buffers need not each round up
//   to a huge page of their own;
// - under 64 KiB: the C heap, 64-byte aligned.
// Where huge pages are unavailable the advice is ignored and the memory is ordinary.
#pragma once

#include <cstddef>
#include <new>

#if defined(__SANITIZE_ADDRESS__)  // GCC
#define TANDEM_ASAN 1
#elif defined(__has_feature)  // clang
#if __has_feature(address_sanitizer)
#define TANDEM_ASAN 1
#endif
#endif
#ifndef TANDEM_ASAN
#define TANDEM_ASAN 0
#endif

namespace tandem::util {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;
// Buffers from this size up to a huge page are pieces of shared slabs.
inline constexpr size_t kSlabPieceMinBytes = size_t{64} << 10;
inline constexpr size_t kSlabBytes = size_t{32} << 20;

// Allocates `bytes` (> 0): 2 MiB-aligned from kHugePageBytes up, 4 KiB-aligned from
// kSlabPieceMinBytes up, 64-byte aligned below; throws std::bad_alloc when out of memory, as
// operator new does.
void* AllocateStreamed(size_t bytes);
// Frees what AllocateStreamed(bytes) returned (the same `bytes`).
void FreeStreamed(void* p, size_t bytes);

// The shared slabs' state, for tests and reports.
struct SlabUsage {
  size_t slabs = 0;         // slabs held (each kSlabBytes)
  size_t bytes_in_use = 0;  // their pieces' bytes, each rounded up to 4 KiB
};
SlabUsage StreamedSlabUsage();

// Under AddressSanitizer the slabs' free ranges are poisoned, so a read or write past a piece
// into the free space beside it is caught as one past a malloc'd buffer would be.
inline constexpr bool kSlabFreeRangesPoisoned = TANDEM_ASAN;

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(AllocateStreamed(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { FreeStreamed(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

}  // namespace tandem::util
