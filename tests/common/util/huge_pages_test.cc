// Large buffers come 2 MiB-aligned (so the huge-page advice can take), mid-sized ones as pieces
// of shared huge-page slabs, small ones from malloc; all hold what is written to them, and the
// slabs' free ranges are reused, merged and released.
#include "common/util/huge_pages.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace tandem::util {
namespace {

TEST(HugePageAllocatorTest, LargeBuffersAreHugePageAligned) {
  std::vector<uint16_t, HugePageAllocator<uint16_t>> big(3 << 20);  // 6 MiB
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % kHugePageBytes, 0u);
  std::iota(big.begin(), big.end(), 0);
  EXPECT_EQ(big[12345], 12345);
  EXPECT_EQ(big.back(), static_cast<uint16_t>(big.size() - 1));
}

TEST(HugePageAllocatorTest, SmallBuffersWork) {
  std::vector<float, HugePageAllocator<float>> small(100, 1.5f);
  small.push_back(2.5f);
  EXPECT_EQ(small.size(), 101u);
  EXPECT_EQ(small[100], 2.5f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % alignof(float), 0u);
}

// The VmFlags of the mapping holding `p` in /proc/self/smaps ("" when not found).
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    // A mapping's first line is "BEGIN-END perms ...", its fields "Name: value".
    const std::string first = line.substr(0, line.find(' '));
    if (first.find(':') == std::string::npos && first.find('-') != std::string::npos) {
      const uintptr_t begin = std::stoull(first.substr(0, first.find('-')), nullptr, 16);
      const uintptr_t end = std::stoull(first.substr(first.find('-') + 1), nullptr, 16);
      inside = begin <= address && address < end;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(HugePageAllocatorTest, MidSizedBuffersShareHugePageSlabs) {
  const SlabUsage before = StreamedSlabUsage();
  constexpr size_t kPiece = (size_t{2} << 20) - (size_t{32} << 10);  // an int4 expert's size
  std::vector<void*> pieces;
  for (int i = 0; i < 4; ++i) pieces.push_back(AllocateStreamed(kPiece));
  const SlabUsage during = StreamedSlabUsage();
  EXPECT_EQ(during.bytes_in_use, before.bytes_in_use + 4 * kPiece);
  EXPECT_LE(during.slabs, before.slabs + 1) << "four 2 MB pieces fit one 32 MiB slab";
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pieces[i]) % 4096, 0u);
    std::fill_n(static_cast<uint8_t*>(pieces[i]), kPiece, static_cast<uint8_t>(i + 1));
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto* bytes = static_cast<const uint8_t*>(pieces[i]);
    EXPECT_EQ(bytes[0], i + 1);
    EXPECT_EQ(bytes[kPiece - 1], i + 1);
  }
  for (void* p : pieces) FreeStreamed(p, kPiece);
  const SlabUsage after = StreamedSlabUsage();
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_LE(after.slabs, std::max<size_t>(before.slabs, 1)) << "an emptied slab is released "
                                                               "unless it is the one kept";
}

TEST(HugePageAllocatorTest, SlabsAreAdvisedIntoHugePages) {
  std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(mode, modes);
  if (modes.empty() || modes.find("[never]") != std::string::npos) {
    GTEST_SKIP() << "transparent huge pages are off here ("
                 << (modes.empty() ? "no /sys/kernel/mm/transparent_hugepage" : modes) << ")";
  }
  constexpr size_t kPiece = size_t{512} << 10;
  void* p = AllocateStreamed(kPiece);
  const std::string flags = VmFlagsOf(p);
  EXPECT_NE(flags.find(" hg"), std::string::npos)
      << "the slab holding a mid-sized buffer is advised into huge pages: " << flags;
  FreeStreamed(p, kPiece);
}

TEST(HugePageAllocatorTest, FreedPiecesAreReusedAndMerged) {
  constexpr size_t kPiece = size_t{256} << 10;
  void* a = AllocateStreamed(kPiece);
  void* b = AllocateStreamed(kPiece);
  void* c = AllocateStreamed(kPiece);
  ASSERT_EQ(static_cast<char*>(b), static_cast<char*>(a) + kPiece) << "consecutive pieces";
  FreeStreamed(b, kPiece);
  void* b2 = AllocateStreamed(kPiece - 4096);
  EXPECT_EQ(b2, b) << "the first free range that fits is reused";
  FreeStreamed(b2, kPiece - 4096);
  FreeStreamed(a, kPiece);
  void* ab = AllocateStreamed(2 * kPiece);
  EXPECT_EQ(ab, a) << "a freed piece merges with its free neighbour";
  FreeStreamed(ab, 2 * kPiece);
  FreeStreamed(c, kPiece);
}

// A slab's pieces sit side by side in one allocation, so the slab's free ranges are poisoned
// for AddressSanitizer: a write past a piece is caught as one past a malloc'd buffer would be.
TEST(HugePageAllocatorTest, AWritePastAPieceIsCaughtUnderAsan) {
  if (!kSlabFreeRangesPoisoned)
    GTEST_SKIP() << "not built with AddressSanitizer (scripts/sanitize.sh asan runs it)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr size_t kPiece = size_t{64} << 10;
  auto* p = static_cast<volatile char*>(AllocateStreamed(kPiece));
  p[kPiece - 1] = 1;
  EXPECT_DEATH(p[kPiece + 100] = 1, "use-after-poison");
  FreeStreamed(const_cast<char*>(p), kPiece);
}

// Random sizes allocated and freed in random order: no two live pieces overlap, each keeps its
// bytes, and everything comes back.
TEST(HugePageAllocatorTest, RandomChurnKeepsPiecesApart) {
  const SlabUsage before = StreamedSlabUsage();
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> size(kSlabPieceMinBytes, kHugePageBytes - 1);
  struct Live {
    uint8_t* p;
    size_t bytes;
    uint8_t tag;
  };
  std::vector<Live> live;
  for (int step = 0; step < 400; ++step) {
    if (live.size() < 24 && (live.empty() || rng() % 3 != 0)) {
      const size_t bytes = size(rng);
      auto* p = static_cast<uint8_t*>(AllocateStreamed(bytes));
      const auto tag = static_cast<uint8_t>(step);
      std::fill_n(p, bytes, tag);
      live.push_back({p, bytes, tag});
    } else {
      const size_t i = rng() % live.size();
      const Live& l = live[i];
      ASSERT_TRUE(std::all_of(l.p, l.p + l.bytes, [&](uint8_t v) { return v == l.tag; }))
          << "a live piece kept its bytes";
      FreeStreamed(l.p, l.bytes);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  std::sort(live.begin(), live.end(), [](const Live& x, const Live& y) { return x.p < y.p; });
  for (size_t i = 1; i < live.size(); ++i) {
    EXPECT_LE(live[i - 1].p + live[i - 1].bytes, live[i].p) << "live pieces do not overlap";
  }
  for (const Live& l : live) FreeStreamed(l.p, l.bytes);
  EXPECT_EQ(StreamedSlabUsage().bytes_in_use, before.bytes_in_use);
}

}  // namespace
}  // namespace tandem::util
