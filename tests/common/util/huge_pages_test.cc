// Large buffers come 2 MiB-aligned (so the huge-page advice can take), small ones from malloc;
// both hold what is written to them.
#include "common/util/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
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

}  // namespace
}  // namespace tandem::util
