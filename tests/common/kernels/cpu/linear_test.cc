// The matrix products over packed weights at every kernel level this CPU has, against the
// reference (the dequantized elements summed in double): bf16, int8 and int4 weights, odd and
// tiny shapes, the tiny model's 192 x 384 experts, column prefixes (mixed width), partial panels,
// products large enough to be split across threads, the independence of a row's result from
// the other rows of its batch, and groups of products run in one pass (linear_group).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/kernels/cpu/kernels.h"
#include "common/kernels/packed_matrix.h"

namespace tandem::kernels::cpu {
namespace {

struct Matrix {
  PanelLayout layout;
  std::vector<std::byte> bytes;
  PackedMatrix view() const { return View(layout, bytes.data()); }
};

// A random matrix of `format`: bf16 values, or Gaussian weights quantized by QuantizeRows.
// `poison_from` (a column) puts NaN from there on: bf16 values, or the scales of those groups.
Matrix RandomMatrix(WeightFormat format, int rows, int cols, int group, std::mt19937& rng,
                    int poison_from = -1) {
  Matrix m{.layout = {format, rows, cols, format == WeightFormat::kBf16 ? 0 : group}, .bytes = {}};
  EXPECT_EQ(m.layout.Check(), "");
  m.bytes.resize(m.layout.bytes());
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(size_t{1} * rows * cols);
  for (float& v : w) v = dist(rng);
  if (format == WeightFormat::kBf16) {
    std::vector<uint16_t> bits(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      const bool poisoned = poison_from >= 0 && static_cast<int>(i % cols) >= poison_from;
      bits[i] = F32ToBf16(poisoned ? NAN : w[i]);
    }
    PackBf16(bits.data(), cols, m.layout, m.bytes.data());
  } else {
    QuantizedRows q = QuantizeRows(w.data(), cols, rows, cols, format, group);
    if (poison_from >= 0) {
      for (int r = 0; r < rows; ++r) {
        for (int g = poison_from / group; g < cols / group; ++g) {
          q.scales[size_t{1} * r * (cols / group) + g] = 0x7e00;  // float16 NaN
        }
      }
    }
    PackQuantized(q, m.layout, m.bytes.data());
  }
  return m;
}

std::vector<float> RandomFloats(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

// x as the level's Linear sees it: rounded to bf16, or quantized per group and dequantized.
std::vector<float> AsTheLevelSeesIt(const Backend& backend, const PackedMatrix& w,
                                    const std::vector<float>& x, int b) {
  std::vector<float> out = x;
  if (w.format == WeightFormat::kBf16) {
    if (backend.rounding != ActivationRounding::kBf16AndInt8) return out;
    for (float& v : out) v = Bf16ToF32(F32ToBf16(v));
    return out;
  }
  if (backend.rounding == ActivationRounding::kNone) return out;
  const int groups = w.cols / w.group;
  std::vector<int8_t> q(w.cols);
  std::vector<float> scales(groups);
  std::vector<int32_t> sums(groups);
  for (int m = 0; m < b; ++m) {
    QuantizeActivations(x.data() + size_t{1} * m * w.cols, w.cols, w.group, q.data(), scales.data(),
                        sums.data());
    for (int c = 0; c < w.cols; ++c) {
      out[size_t{1} * m * w.cols + c] = scales[c / w.group] * static_cast<float>(q[c]);
    }
  }
  return out;
}

class LinearTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    backend_ = std::string(GetParam()) == "amx-emulated" ? AmxEmulatedBackendForTesting()
                                                         : FindBackend(GetParam());
    if (backend_ == nullptr) {
      GTEST_SKIP() << "this CPU cannot run the " << GetParam() << " kernels";
    }
  }

  // Linear at this level against the reference fed the activations the level uses; errors
  // relative to the largest sum of |w x| terms, the scale of float32 accumulation error.
  void Check(const PackedMatrix& w, int b, const std::string& what, bool f32 = false) {
    const std::vector<float> x = RandomFloats(size_t{1} * b * w.cols, rng_);
    std::vector<float> got(size_t{1} * b * w.rows + 7, 12345.0f);
    (f32 ? backend_->linear_f32 : backend_->linear)(x.data(), b, w, got.data());
    for (int i = 0; i < 7; ++i) {
      ASSERT_EQ(got[size_t{1} * b * w.rows + i], 12345.0f) << what << ": wrote past y";
    }
    got.resize(size_t{1} * b * w.rows);
    const std::vector<float> seen = f32 ? x : AsTheLevelSeesIt(*backend_, w, x, b);
    std::vector<float> want(got.size()), magnitude(got.size());
    reference::Linear(seen.data(), b, w, want.data());
    // |W| |x| per output: the reference over absolute values, computed element by element.
    for (int m = 0; m < b; ++m) {
      for (int r = 0; r < w.rows; ++r) {
        double sum = 0;
        for (int c = 0; c < w.cols; ++c) {
          sum += std::fabs(double{PackedElement(w, r, c)} * seen[size_t{1} * m * w.cols + c]);
        }
        magnitude[size_t{1} * m * w.rows + r] = static_cast<float>(sum);
      }
    }
    const double scale = *std::max_element(magnitude.begin(), magnitude.end()) + 1e-30;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_LT(std::fabs(double{got[i]} - want[i]) / scale, 2e-6)
          << what << " b=" << b << " rows=" << w.rows << " cols=" << w.cols << " at " << i << ": "
          << got[i] << " vs " << want[i];
    }
  }

  const Backend* backend_ = nullptr;
  std::mt19937 rng_{4321};
};

TEST_P(LinearTest, Bf16MatchesReference) {
  for (int cols : {1, 2, 3, 7, 31, 33, 64, 192, 384, 1000}) {
    for (int rows : {1, 7, 16, 17, 40}) {
      const Matrix w = RandomMatrix(WeightFormat::kBf16, rows, cols, 0, rng_);
      for (int b : {1, 2, 3, 4, 5, 9, 13, 17}) {
        Check(w.view(), b, "bf16");
        Check(w.view(), b, "bf16 (f32 activations)", /*f32=*/true);
      }
    }
  }
}

TEST_P(LinearTest, QuantizedMatchesReference) {
  for (WeightFormat format : {WeightFormat::kInt8, WeightFormat::kInt4}) {
    for (int group : {32, 64, 128}) {
      for (int cols : {group, 3 * group, 384}) {
        if (cols % group != 0) continue;
        for (int rows : {1, 7, 16, 33}) {
          const Matrix w = RandomMatrix(format, rows, cols, group, rng_);
          for (int b : {1, 2, 4, 5, 9}) {
            Check(w.view(), b, WeightFormatName(format));
            Check(w.view(), b, std::string(WeightFormatName(format)) + " (f32 activations)",
                  /*f32=*/true);
          }
        }
      }
    }
  }
}

// The tiny model's experts: gate/up (384, 192) and down (192, 384).
TEST_P(LinearTest, TinyModelExpertShapes) {
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kInt8, WeightFormat::kInt4}) {
    const Matrix gate = RandomMatrix(format, 384, 192, 32, rng_);
    const Matrix down = RandomMatrix(format, 192, 384, 32, rng_);
    for (int b : {1, 6, 16}) {
      Check(gate.view(), b, "gate");
      Check(down.view(), b, "down");
    }
  }
}

// Over the threading threshold, so split across threads, and with many row blocks.
TEST_P(LinearTest, LargeProductsMatchReference) {
  const struct {
    WeightFormat format;
    int b, rows, cols;
  } shapes[] = {{WeightFormat::kBf16, 1, 4201, 1000}, {WeightFormat::kBf16, 3, 4003, 384},
                {WeightFormat::kBf16, 40, 1700, 64},  {WeightFormat::kInt8, 1, 4100, 1024},
                {WeightFormat::kInt8, 17, 2001, 128}, {WeightFormat::kInt4, 1, 4100, 1024},
                {WeightFormat::kInt4, 33, 1500, 256}};
  for (const auto& s : shapes) {
    const Matrix w = RandomMatrix(s.format, s.rows, s.cols, 32, rng_);
    Check(w.view(), s.b, WeightFormatName(s.format));
  }
}

// A prefix of the columns (an expert's down projection at width k) reads nothing past it, and
// gives exactly what a matrix of those columns alone gives.
TEST_P(LinearTest, ColumnPrefixReadsOnlyThePrefix) {
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kInt8, WeightFormat::kInt4}) {
    const bool bf16 = format == WeightFormat::kBf16;
    for (int prefix : bf16 ? std::vector<int>{1, 5, 64, 129} : std::vector<int>{32, 96}) {
      const int cols = prefix + (bf16 ? 37 : 64);
      for (int rows : {9, 48}) {
        std::mt19937 rng(prefix * 100 + rows);
        const Matrix wide = RandomMatrix(format, rows, cols, 32, rng, /*poison_from=*/prefix);
        const PackedMatrix view = View(wide.layout, wide.bytes.data(), rows, prefix);
        // The same rows' first `prefix` columns, packed on their own.
        Matrix narrow{.layout = {format, rows, prefix, bf16 ? 0 : 32}, .bytes = {}};
        narrow.bytes.resize(narrow.layout.bytes());
        if (bf16) {
          std::vector<uint16_t> bits(size_t{1} * rows * prefix);
          for (int r = 0; r < rows; ++r) {
            for (int c = 0; c < prefix; ++c)
              bits[size_t{1} * r * prefix + c] = F32ToBf16(PackedElement(view, r, c));
          }
          PackBf16(bits.data(), prefix, narrow.layout, narrow.bytes.data());
        } else {
          // Copy the panels' first groups and their scales.
          for (int p = 0; p < narrow.layout.panels(); ++p) {
            const std::byte* from = wide.bytes.data() + p * wide.layout.panel_bytes();
            std::byte* to = narrow.bytes.data() + p * narrow.layout.panel_bytes();
            std::copy_n(from, narrow.layout.scale_offset(), to);
            std::copy_n(from + wide.layout.scale_offset(),
                        narrow.layout.panel_bytes() - narrow.layout.scale_offset(),
                        to + narrow.layout.scale_offset());
          }
        }
        for (int b : {1, 3, 8}) {
          const std::vector<float> x = RandomFloats(size_t{1} * b * prefix, rng);
          std::vector<float> got(size_t{1} * b * rows), want(got.size());
          backend_->linear(x.data(), b, view, got.data());
          backend_->linear(x.data(), b, narrow.view(), want.data());
          ASSERT_EQ(got, want) << WeightFormatName(format) << " prefix " << prefix << " of " << cols
                               << ", b=" << b;
          for (float v : got) ASSERT_FALSE(std::isnan(v));
        }
      }
    }
  }
}

// A row's outputs are the same bits whatever else is in the batch (the engine promises that a
// sequence's result does not depend on the sequences sharing its step).
TEST_P(LinearTest, RowsDoNotDependOnTheirBatch) {
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kInt8, WeightFormat::kInt4}) {
    for (int rows : {24, 2100}) {
      const Matrix w = RandomMatrix(format, rows, 256, 64, rng_);
      for (int b : {2, 7, 13, 30}) {
        const std::vector<float> x = RandomFloats(size_t{1} * b * 256, rng_);
        std::vector<float> all(size_t{1} * b * rows);
        backend_->linear(x.data(), b, w.view(), all.data());
        for (int m = 0; m < b; ++m) {
          std::vector<float> one(rows);
          backend_->linear(x.data() + size_t{1} * m * 256, 1, w.view(), one.data());
          ASSERT_TRUE(std::equal(one.begin(), one.end(), all.begin() + size_t{1} * m * rows))
              << WeightFormatName(format) << " rows=" << rows << " b=" << b << " row " << m;
        }
      }
    }
  }
}

// A group of products equals each product run alone, bit for bit: products sharing an input
// (an expert's gate and up, q / k / v) and not, every format in one group, the same input read
// by bf16 and quantized weights (prepared apart), batches of 1 and more, an empty product, and
// groups small enough to run inline and large enough to be split across threads.
TEST_P(LinearTest, GroupEqualsEachProductAlone) {
  for (int b : {1, 3, 17}) {
    for (int rows : {40, 1200}) {
      const std::vector<float> shared = RandomFloats(size_t{1} * b * 512, rng_);
      const std::vector<float> own = RandomFloats(size_t{1} * b * 256, rng_);
      std::vector<Matrix> ws;
      std::vector<const float*> xs;
      for (WeightFormat format : {WeightFormat::kInt4, WeightFormat::kBf16, WeightFormat::kInt8}) {
        ws.push_back(RandomMatrix(format, rows, 512, 32, rng_));
        xs.push_back(shared.data());
        ws.push_back(RandomMatrix(format, rows + 16, 512, 64, rng_));
        xs.push_back(shared.data());
        ws.push_back(RandomMatrix(format, rows - 8, 256, 32, rng_));
        xs.push_back(own.data());
      }
      std::vector<std::vector<float>> got(ws.size()), want(ws.size());
      std::vector<LinearProduct> products;
      for (size_t i = 0; i < ws.size(); ++i) {
        const PackedMatrix w = ws[i].view();
        got[i].assign(size_t{1} * b * w.rows, 12345.0f);
        want[i].resize(got[i].size());
        backend_->linear(xs[i], b, w, want[i].data());
        products.push_back({.x = xs[i], .b = b, .w = w, .y = got[i].data()});
      }
      // An empty product in the middle writes nothing.
      float untouched = 7.0f;
      products.insert(products.begin() + 4,
                      {.x = shared.data(), .b = 0, .w = ws[0].view(), .y = &untouched});
      backend_->linear_group(products.data(), static_cast<int>(products.size()));
      EXPECT_EQ(untouched, 7.0f);
      for (size_t i = 0; i < ws.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << "b=" << b << " rows=" << rows << " product " << i << " ("
                                   << WeightFormatName(ws[i].layout.format) << ")";
      }
    }
  }
}

// The tiles' integer sums are the VNNI kernels' (signed weights against the same int8
// activations, each group folded into float32 in the same order), so the amx levels give
// avx512bf16's bits for quantized weights at every batch and group (the amx level runs the
// VNNI kernels below 16 rows, the tiles from 16).
TEST(LinearTilesTest, QuantizedTilesEqualVnni) {
  const Backend* vnni = FindBackend("avx512bf16");
  if (vnni == nullptr)
    GTEST_SKIP() << "this CPU has no AVX512-BF16: no amx level, not even emulated";
  std::mt19937 rng(77);
  for (const Backend* tiles : {FindBackend("amx"), AmxEmulatedBackendForTesting()}) {
    if (tiles == nullptr) continue;  // no AMX here: the emulated tiles only
    for (WeightFormat format : {WeightFormat::kInt8, WeightFormat::kInt4}) {
      for (int group : {32, 64, 128}) {
        const Matrix w = RandomMatrix(format, 40, 384, group, rng);
        for (int b : {1, 5, 16, 17, 33}) {
          const std::vector<float> x = RandomFloats(size_t{1} * b * 384, rng);
          std::vector<float> got(size_t{1} * b * 40), want(got.size());
          tiles->linear(x.data(), b, w.view(), got.data());
          vnni->linear(x.data(), b, w.view(), want.data());
          ASSERT_EQ(got, want) << tiles->name << " " << WeightFormatName(format) << " group "
                               << group << " b=" << b;
        }
      }
    }
  }
}

// How far the reduced-precision levels move a product from float32 activations, for the record
// (docs/kernels.md): bf16 activations (8 significant bits) and int8 per group of 32.
TEST_P(LinearTest, RoundingErrorIsBounded) {
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kInt8}) {
    const Matrix w = RandomMatrix(format, 64, 1024, 32, rng_);
    const std::vector<float> x = RandomFloats(size_t{4} * 1024, rng_);
    std::vector<float> got(4 * 64), want(got.size());
    backend_->linear(x.data(), 4, w.view(), got.data());
    reference::Linear(x.data(), 4, w.view(), want.data());
    double err = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      err += std::pow(double{got[i]} - want[i], 2);
      norm += std::pow(double{want[i]}, 2);
    }
    // Random signs: the relative error of a sum is about the per-term rounding (2^-9 for bf16,
    // about 1/(127 * sqrt(3)) / 2 for int8 of Gaussian groups), well under 1%.
    EXPECT_LT(std::sqrt(err / norm), 0.01) << WeightFormatName(format);
  }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, LinearTest,
                         ::testing::Values("reference", "avx2", "avx2int8", "avx512", "avx512vnni",
                                           "avx512bf16", "amx", "amx-emulated"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace tandem::kernels::cpu
