#include "common/kernels/packed_matrix.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/kernels/cpu/kernels.h"

namespace tandem::kernels {
namespace {

using cpu::Bf16ToF32;
using cpu::F32ToBf16;

std::vector<float> RandomFloats(size_t count, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

TEST(F16Test, RoundTripsEveryValueExactly) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float v = F16ToF32(static_cast<uint16_t>(bits));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(v)))) << bits;
      continue;
    }
    ASSERT_EQ(F32ToF16(v), bits) << bits;
  }
}

TEST(F16Test, RoundsToNearestEvenAndSaturatesToInfinity) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // the tie goes to the even neighbour: infinity
  EXPECT_EQ(F32ToF16(1e9f), 0x7c00);
  EXPECT_EQ(F32ToF16(-INFINITY), 0xfc00);
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: to the even one, 1.
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(F32ToF16(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the normals
}

TEST(PanelLayoutTest, SizesAndChecks) {
  const PanelLayout bf16{WeightFormat::kBf16, 17, 5, 0};
  EXPECT_EQ(bf16.panels(), 2);
  EXPECT_EQ(bf16.panel_bytes(), 3 * 64);
  EXPECT_EQ(bf16.bytes(), 2 * 3 * 64);
  EXPECT_EQ(bf16.Check(), "");
  const PanelLayout int8{WeightFormat::kInt8, 16, 64, 32};
  EXPECT_EQ(int8.group_bytes(), 512);
  EXPECT_EQ(int8.scale_offset(), 1024);
  EXPECT_EQ(int8.panel_bytes(), 1024 + 64);
  const PanelLayout int4{WeightFormat::kInt4, 40, 256, 128};
  EXPECT_EQ(int4.group_bytes(), 1024);
  EXPECT_EQ(int4.panel_bytes(), 2 * (1024 + 32));
  EXPECT_EQ(int4.bytes(), 3 * 2 * (1024 + 32));
  EXPECT_NE(PanelLayout({WeightFormat::kInt8, 16, 48, 32}).Check(), "");
  EXPECT_NE(PanelLayout({WeightFormat::kInt4, 16, 64, 16}).Check(), "");
  EXPECT_NE(PanelLayout({WeightFormat::kBf16, 0, 64, 0}).Check(), "");
}

TEST(PackBf16Test, EveryElementReadsBack) {
  std::mt19937 rng(7);
  for (int rows : {1, 15, 16, 17, 40}) {
    for (int cols : {1, 2, 7, 64, 193}) {
      std::vector<uint16_t> w(size_t{1} * rows * (cols + 3));
      for (uint16_t& v : w) v = F32ToBf16(std::normal_distribution<float>()(rng));
      const PanelLayout layout{WeightFormat::kBf16, rows, cols, 0};
      std::vector<std::byte> packed(layout.bytes());
      PackBf16(w.data(), cols + 3, layout, packed.data());
      const PackedMatrix view = View(layout, packed.data());
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < cols; ++c) {
          ASSERT_EQ(PackedElement(view, r, c), Bf16ToF32(w[size_t{1} * r * (cols + 3) + c]))
              << rows << "x" << cols << " at " << r << "," << c;
        }
      }
      // The padding rows and column are zeros.
      if (rows % kPanelRows != 0) {
        EXPECT_EQ(PackedElement(view, rows, 0), 0.0f);
      }
      if (cols % 2 != 0) {
        EXPECT_EQ(PackedElement(view, 0, cols), 0.0f);
      }
    }
  }
}

class QuantizeTest : public ::testing::TestWithParam<std::tuple<WeightFormat, int>> {
 protected:
  WeightFormat format() const { return std::get<0>(GetParam()); }
  int group() const { return std::get<1>(GetParam()); }
  int max_level() const { return format() == WeightFormat::kInt8 ? 127 : 7; }
  int min_level() const { return format() == WeightFormat::kInt8 ? -127 : -8; }
  std::mt19937 rng_{11};
};

TEST_P(QuantizeTest, PackedElementsAreScaleTimesLevel) {
  for (int rows : {1, 16, 33}) {
    const int cols = 3 * group();
    const std::vector<float> w = RandomFloats(size_t{1} * rows * cols, rng_, 0.02f);
    const QuantizedRows q = QuantizeRows(w.data(), cols, rows, cols, format(), group());
    ASSERT_EQ(q.q.size(), w.size());
    ASSERT_EQ(q.scales.size(), size_t{1} * rows * 3);
    const PanelLayout layout{format(), rows, cols, group()};
    ASSERT_EQ(layout.Check(), "");
    std::vector<std::byte> packed(layout.bytes());
    PackQuantized(q, layout, packed.data());
    const PackedMatrix view = View(layout, packed.data());
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const int level = q.q[size_t{1} * r * cols + c];
        ASSERT_GE(level, min_level());
        ASSERT_LE(level, max_level());
        const float scale = F16ToF32(q.scales[size_t{1} * r * 3 + c / group()]);
        ASSERT_EQ(PackedElement(view, r, c), scale * static_cast<float>(level)) << r << "," << c;
      }
    }
  }
}

// Round to nearest against the float16 scale: within half a step of the value, unless the
// value lies beyond the levels (int4 may clip the extreme when that lowers the group's error).
TEST_P(QuantizeTest, ErrorIsWithinHalfAStep) {
  const int rows = 8, cols = 4 * group();
  const std::vector<float> w = RandomFloats(size_t{1} * rows * cols, rng_, 0.05f);
  const QuantizedRows q = QuantizeRows(w.data(), cols, rows, cols, format(), group());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const float scale = F16ToF32(q.scales[size_t{1} * r * 4 + c / group()]);
      const int level = q.q[size_t{1} * r * cols + c];
      const float value = w[size_t{1} * r * cols + c];
      if (level == max_level() || level == min_level()) continue;  // maybe clipped
      ASSERT_LE(std::fabs(value - scale * static_cast<float>(level)),
                0.5f * std::fabs(scale) * (1 + 1e-6f))
          << r << "," << c;
    }
  }
}

// int4's search includes Q4_0's rule (the extreme value at level -8), so no group does worse.
TEST(QuantizeInt4Test, NoWorseThanTheQ4_0Rule) {
  for (int group : {32, 64, 128}) {
    std::mt19937 rng(group);
    const int rows = 64, cols = 2 * group;
    const std::vector<float> w = RandomFloats(size_t{1} * rows * cols, rng, 0.02f);
    const QuantizedRows q = QuantizeRows(w.data(), cols, rows, cols, WeightFormat::kInt4, group);
    double ours_total = 0, q4_0_total = 0;
    for (int r = 0; r < rows; ++r) {
      for (int g = 0; g < 2; ++g) {
        const float* v = w.data() + size_t{1} * r * cols + g * group;
        const int8_t* levels = q.q.data() + size_t{1} * r * cols + g * group;
        float extreme = 0;
        for (int i = 0; i < group; ++i) {
          if (std::fabs(v[i]) > std::fabs(extreme)) extreme = v[i];
        }
        const float d = F16ToF32(F32ToF16(extreme / -8.0f));
        const float scale = F16ToF32(q.scales[size_t{1} * r * 2 + g]);
        double q4_0 = 0, ours = 0;
        for (int i = 0; i < group; ++i) {
          const int level = std::clamp(static_cast<int>(std::nearbyint(v[i] / d)), -8, 7);
          q4_0 += std::pow(double{v[i]} - double{d} * level, 2);
          ours += std::pow(double{v[i]} - double{scale} * levels[i], 2);
        }
        EXPECT_LE(ours, q4_0 * (1 + 1e-9)) << "group " << group << " at " << r << "," << g;
        ours_total += ours;
        q4_0_total += q4_0;
      }
    }
    // And clearly better overall on Gaussian weights.
    EXPECT_LT(ours_total, 0.95 * q4_0_total) << "group " << group;
  }
}

TEST_P(QuantizeTest, ZeroGroupsHaveZeroScale) {
  const int cols = 2 * group();
  std::vector<float> w(cols, 0.0f);
  for (int i = group(); i < cols; ++i) w[i] = 0.01f * static_cast<float>(i % 7 - 3);
  const QuantizedRows q = QuantizeRows(w.data(), cols, 1, cols, format(), group());
  EXPECT_EQ(q.scales[0], 0);
  for (int i = 0; i < group(); ++i) EXPECT_EQ(q.q[i], 0);
  EXPECT_NE(q.scales[1], 0);
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizeTest,
                         ::testing::Combine(::testing::Values(WeightFormat::kInt8,
                                                              WeightFormat::kInt4),
                                            ::testing::Values(32, 64, 128)));

TEST(NibblesTest, RoundTrip) {
  std::vector<int8_t> q;
  for (int v = -8; v <= 7; ++v) {
    for (int u = -8; u <= 7; ++u) {
      q.push_back(static_cast<int8_t>(v));
      q.push_back(static_cast<int8_t>(u));
    }
  }
  std::vector<uint8_t> packed(q.size() / 2);
  PackNibbles(q.data(), static_cast<int64_t>(q.size()), packed.data());
  EXPECT_EQ(packed[0], 0x00);  // -8, -8
  EXPECT_EQ(packed[1], 0x10);  // -8 low, -7 high
  std::vector<int8_t> back(q.size());
  UnpackNibbles(packed.data(), static_cast<int64_t>(q.size()), back.data());
  EXPECT_EQ(back, q);
}

TEST(QuantizeActivationsTest, PerGroupScalesLevelsAndSums) {
  std::vector<float> x(64);
  for (int i = 0; i < 32; ++i) x[i] = 0.5f * static_cast<float>(i - 16);  // max |x| = 8
  // The second group is all zero.
  std::vector<int8_t> q(64);
  float scales[2];
  int32_t sums[2];
  QuantizeActivations(x.data(), 64, 32, q.data(), scales, sums);
  EXPECT_FLOAT_EQ(scales[0], 8.0f / 127.0f);
  EXPECT_EQ(q[0], -127);
  EXPECT_EQ(q[16], 0);
  EXPECT_EQ(q[31], static_cast<int8_t>(std::nearbyint(7.5f * (127.0f / 8.0f))));
  int32_t sum = 0;
  for (int i = 0; i < 32; ++i) {
    sum += q[i];
    EXPECT_LE(std::fabs(x[i] - scales[0] * q[i]), 0.5f * scales[0] * 1.0001f);
  }
  EXPECT_EQ(sums[0], sum);
  EXPECT_EQ(scales[1], 0.0f);
  EXPECT_EQ(sums[1], 0);
  for (int i = 32; i < 64; ++i) EXPECT_EQ(q[i], 0);
}

}  // namespace
}  // namespace tandem::kernels
