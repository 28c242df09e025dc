#include "common/kernels/cpu/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace tandem::kernels::cpu {
namespace {

constexpr int kSizes[] = {1, 3, 7, 31, 33, 127, 192, 384, 1000};

std::vector<float> RandomFloats(size_t count, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

double MaxAbs(const std::vector<float>& values) {
  double max = 0;
  for (float v : values) max = std::max(max, std::fabs(double{v}));
  return max;
}

double MaxAbsDiff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double max = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(double{got[i]} - want[i]);
    if (std::isnan(diff)) return INFINITY;
    max = std::max(max, diff);
  }
  return max;
}

// max |got - want| / max |want|: the error relative to the output's scale.
double NormalisedError(const std::vector<float>& got, const std::vector<float>& want) {
  return MaxAbsDiff(got, want) / (MaxAbs(want) + 1e-30);
}

TEST(Bf16Test, RoundTripsEveryValueExactly) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float value = Bf16ToF32(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(F32ToBf16(value), bits) << "bits 0x" << std::hex << bits;
  }
}

TEST(Bf16Test, WidensByShifting) {
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0xc000), -2.0f);
  EXPECT_EQ(Bf16ToF32(0x3fc0), 1.5f);
}

TEST(Bf16Test, RoundsToNearestEven) {
  // Between 1.0 (0x3f80) and the next bf16 1 + 2^-7 (0x3f81).
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // Tie: to even.
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8) - std::ldexp(1.0f, -20)), 0x3f80);
  // Between 0x3f81 and 0x3f82: the tie goes up, to the even 0x3f82.
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(F32ToBf16(-(1.0f + 3 * std::ldexp(1.0f, -8))), 0xbf82);
  // Rounding up carries into the exponent.
  EXPECT_EQ(F32ToBf16(std::nextafter(2.0f, 0.0f)), 0x4000);
}

TEST(Bf16Test, NanStaysNan) {
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  // Payloads only in the low 16 bits must not turn into infinity.
  for (uint32_t bits : {0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu, 0x7fc00000u}) {
    float nan;
    std::memcpy(&nan, &bits, sizeof(nan));
    const uint16_t bf16 = F32ToBf16(nan);
    EXPECT_TRUE(std::isnan(Bf16ToF32(bf16))) << std::hex << bits << " -> " << bf16;
    EXPECT_EQ(bf16 >> 15, bits >> 31) << "sign kept";
  }
}

TEST(Bf16Test, Infinities) {
  EXPECT_EQ(F32ToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(F32ToBf16(-INFINITY), 0xff80);
  EXPECT_EQ(Bf16ToF32(0x7f80), INFINITY);
  EXPECT_EQ(Bf16ToF32(0xff80), -INFINITY);
  // FLT_MAX is more than half a bf16 step above the largest bf16, so it rounds to infinity.
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(F32ToBf16(Bf16ToF32(0x7f7f)), 0x7f7f);
}

TEST(Bf16Test, SubnormalsAndZeros) {
  EXPECT_EQ(F32ToBf16(0.0f), 0x0000);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  EXPECT_EQ(Bf16ToF32(0x0001), std::ldexp(1.0f, -133));  // Smallest bf16 subnormal.
  EXPECT_EQ(F32ToBf16(std::ldexp(1.0f, -133)), 0x0001);
  EXPECT_EQ(F32ToBf16(std::ldexp(1.0f, -134)), 0x0000);      // Tie: to even (zero).
  EXPECT_EQ(F32ToBf16(3 * std::ldexp(1.0f, -134)), 0x0002);  // Tie: to even (2).
  EXPECT_EQ(F32ToBf16(-3 * std::ldexp(1.0f, -134)), 0x8002);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  // The largest subnormal rounds up to the smallest normal.
  EXPECT_EQ(F32ToBf16(std::nextafter(std::numeric_limits<float>::min(), 0.0f)), 0x0080);
}

TEST(KernelIsaTest, DefaultIsTheFastestLevelAndExactKeepsFloat32) {
  if (std::getenv("TANDEM_KERNELS") != nullptr) GTEST_SKIP() << "TANDEM_KERNELS is set";
  const std::vector<const Backend*> levels = SupportedBackends();
  ASSERT_FALSE(levels.empty());
  EXPECT_STREQ(levels.front()->name, "reference");
  EXPECT_STREQ(KernelIsa(), levels.back()->name);
  const Backend* exact = FindBackend("exact");
  ASSERT_NE(exact, nullptr);
  EXPECT_EQ(exact->rounding, ActivationRounding::kNone);
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    EXPECT_STREQ(exact->name, "avx512");
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16")) {
      // amx where the CPU and the OS allow tiles.
      EXPECT_TRUE(std::string(KernelIsa()) == "avx512bf16" || std::string(KernelIsa()) == "amx")
          << KernelIsa();
    }
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_STREQ(KernelIsa(), "avx2int8");  // int8 activations for quantized weights
    EXPECT_STREQ(exact->name, "avx2");
  }
}

TEST(KernelIsaTest, SetRejectsUnknownNamesAndRestores) {
  const std::string isa = KernelIsa();
  EXPECT_FALSE(SetKernelIsa("sse9"));
  EXPECT_EQ(KernelIsa(), isa);
  EXPECT_EQ(FindBackend("sse9"), nullptr);
  EXPECT_TRUE(SetKernelIsa("reference"));
  EXPECT_STREQ(KernelIsa(), "reference");
  EXPECT_TRUE(SetKernelIsa(isa));
  EXPECT_EQ(KernelIsa(), isa);
  EXPECT_NE(KernelIsaNames().find("avx512bf16"), std::string::npos);
}

// Every dispatched kernel under each instruction set this CPU has.
class IsaTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    previous_ = KernelIsa();
    if (!SetKernelIsa(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << GetParam() << " kernels";
    }
    ASSERT_STREQ(KernelIsa(), GetParam());
  }
  void TearDown() override { SetKernelIsa(previous_); }

  std::string previous_;
  std::mt19937 rng_{1234};
};

TEST_P(IsaTest, RmsNormMatchesHandComputedValues) {
  const float x[] = {1, 2, 3, 4, -2, 0, 0, 0};
  const float weight[] = {1, 0.5f, 2, 1};
  float out[8];
  RmsNorm(x, 2, 4, weight, 1e-5f, out);
  // Row 0: mean square 7.5; row 1: mean square 1.
  const float want[] = {
      0.365148128f, 0.365148128f, 2.190888769f, 1.460592513f, -1.999990000f, 0, 0, 0};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(out[i], want[i], 1e-6) << i;
}

TEST_P(IsaTest, RmsNormMatchesReference) {
  for (int n : kSizes) {
    for (int b : {1, 3}) {
      const std::vector<float> x = RandomFloats(size_t{1} * b * n, rng_, 3.0f);
      const std::vector<float> weight = RandomFloats(n, rng_);
      std::vector<float> got(x.size()), want(x.size());
      RmsNorm(x.data(), b, n, weight.data(), 1e-5f, got.data());
      reference::RmsNorm(x.data(), b, n, weight.data(), 1e-5f, want.data());
      EXPECT_LT(NormalisedError(got, want), 1e-5) << "b=" << b << " n=" << n;
    }
  }
}

TEST_P(IsaTest, RopeAtPositionZeroIsIdentity) {
  const std::vector<float> x = RandomFloats(6 * 64, rng_);
  std::vector<float> rotated = x;
  Rope(rotated.data(), 6, 64, 0, 10000.0f);
  EXPECT_EQ(rotated, x);
}

TEST_P(IsaTest, RopePreservesNormsOfEachPair) {
  const int heads = 6, head_dim = 64, half = head_dim / 2;
  const std::vector<float> x = RandomFloats(heads * head_dim, rng_);
  for (int pos : {1, 17, 4095}) {
    std::vector<float> rotated = x;
    Rope(rotated.data(), heads, head_dim, pos, 1e6f);
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < half; ++i) {
        const float* a = x.data() + h * head_dim;
        const float* r = rotated.data() + h * head_dim;
        EXPECT_NEAR(std::hypot(r[i], r[i + half]), std::hypot(a[i], a[i + half]), 1e-5)
            << "pos=" << pos << " head=" << h << " i=" << i;
      }
    }
  }
}

TEST_P(IsaTest, RopeRotatesFirstHalfAgainstSecondHalf) {
  // head_dim 8: pair (1, 5) turns by pos * 10000^(-2/8) = 3 * 0.1 radians.
  const float angle = 0.3f;
  std::vector<float> x(2 * 8, 0.0f);
  x[8 + 1] = 1.0f;  // Head 1, first half: (1, 0) -> (cos, sin).
  Rope(x.data(), 2, 8, 3, 10000.0f);
  for (int i = 0; i < 16; ++i) {
    const float want = i == 9 ? std::cos(angle) : i == 13 ? std::sin(angle) : 0.0f;
    EXPECT_NEAR(x[i], want, 1e-6) << i;
  }
  std::fill(x.begin(), x.end(), 0.0f);
  x[5] = 1.0f;  // Head 0, second half: (0, 1) -> (-sin, cos).
  Rope(x.data(), 2, 8, 3, 10000.0f);
  for (int i = 0; i < 16; ++i) {
    const float want = i == 1 ? -std::sin(angle) : i == 5 ? std::cos(angle) : 0.0f;
    EXPECT_NEAR(x[i], want, 1e-6) << i;
  }
}

TEST_P(IsaTest, RopeMatchesReference) {
  for (int head_dim : {2, 8, 64, 128}) {
    const std::vector<float> x = RandomFloats(6 * head_dim, rng_);
    std::vector<float> got = x, want = x;
    Rope(got.data(), 6, head_dim, 1234, 1e6f);
    const std::vector<float> inv_freq = DefaultRopeFrequencies(1e6f, head_dim);
    reference::Rope(want.data(), 6, head_dim, 1234, {inv_freq.data(), head_dim});
    EXPECT_LT(NormalisedError(got, want), 1e-6) << "head_dim=" << head_dim;
  }
}

TEST_P(IsaTest, SoftmaxSumsToOneAndMatchesReference) {
  for (int n : {1, 3, 7, 15, 16, 17, 31, 33, 127, 192, 1000, 32000}) {
    const std::vector<float> x = RandomFloats(n, rng_, 4.0f);
    std::vector<float> got = x, want = x;
    Softmax(got.data(), n);
    reference::Softmax(want.data(), n);
    EXPECT_NEAR(std::accumulate(got.begin(), got.end(), 0.0), 1.0, 1e-5) << "n=" << n;
    EXPECT_LT(NormalisedError(got, want), 1e-5) << "n=" << n;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5 * want[i] + 1e-12) << "n=" << n << " i=" << i;
    }
  }
}

TEST_P(IsaTest, LogSumExpMatchesADoubleReference) {
  for (int n : {1, 3, 7, 15, 16, 17, 31, 33, 127, 192, 1000, 8192, 32000, 151936}) {
    const std::vector<float> x = RandomFloats(n, rng_, 8.0f);
    double max = x[0];
    for (float v : x) max = std::max<double>(max, v);
    double sum = 0;
    for (float v : x) sum += std::exp(static_cast<double>(v) - max);
    const double want = max + std::log(sum);
    EXPECT_NEAR(LogSumExp(x.data(), n), want, 2e-6 * std::max(1.0, std::abs(want))) << "n=" << n;
    EXPECT_NEAR(reference::LogSumExp(x.data(), n), want, 2e-6 * std::max(1.0, std::abs(want)));
  }
}

TEST_P(IsaTest, TopKMatchesASortAtEveryLengthWithTies) {
  for (int n : {1, 2, 7, 8, 9, 15, 16, 17, 33, 100, 8192, 32000}) {
    for (int k : {1, 3, 5, 20}) {
      if (k > n) continue;
      std::vector<float> x = RandomFloats(n, rng_, 4.0f);
      // Ties and -inf: every value rounded to a quarter, a few -inf.
      for (float& v : x) v = std::round(v * 4) / 4;
      for (int i = 0; i < n; i += 7) x[i] = -INFINITY;
      std::vector<int32_t> want(n);
      for (int i = 0; i < n; ++i) want[i] = i;
      std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
      want.resize(k);
      std::vector<int32_t> got(k, -1), ref(k, -1);
      TopK(x.data(), n, k, got.data());
      reference::TopK(x.data(), n, k, ref.data());
      EXPECT_EQ(got, want) << "n=" << n << " k=" << k;
      EXPECT_EQ(ref, want) << "n=" << n << " k=" << k;
    }
  }
  // A rising sequence: every value beats the threshold.
  std::vector<float> rising(100);
  for (int i = 0; i < 100; ++i) rising[i] = static_cast<float>(i);
  std::vector<int32_t> top(4);
  TopK(rising.data(), 100, 4, top.data());
  EXPECT_EQ(top, (std::vector<int32_t>{99, 98, 97, 96}));
}

TEST_P(IsaTest, LogSumExpIsStableAndSaysWhenNothingIsFinite) {
  const std::vector<float> large = {1e4f, 1e4f - 1, -1e4f, 1e4f, -INFINITY};
  EXPECT_NEAR(LogSumExp(large.data(), 5), 1e4 + std::log(2 + std::exp(-1.0)), 1e-3);
  const std::vector<float> none(19, -INFINITY);
  EXPECT_EQ(LogSumExp(none.data(), 19), -INFINITY);
  std::vector<float> bad(40, 1.0f);
  bad[33] = NAN;
  EXPECT_FALSE(std::isfinite(LogSumExp(bad.data(), 40)));
  bad[33] = INFINITY;
  EXPECT_FALSE(std::isfinite(LogSumExp(bad.data(), 40)));
}

TEST_P(IsaTest, SoftmaxIsStableForLargeInputs) {
  std::vector<float> x = {1e4f, 1e4f - 1, -1e4f, 1e4f, -INFINITY};
  Softmax(x.data(), static_cast<int>(x.size()));
  const float e = std::exp(-1.0f);
  const float sum = 2 + e;
  EXPECT_NEAR(x[0], 1 / sum, 1e-6);
  EXPECT_NEAR(x[1], e / sum, 1e-6);
  EXPECT_EQ(x[2], 0.0f);
  EXPECT_NEAR(x[3], 1 / sum, 1e-6);
  EXPECT_EQ(x[4], 0.0f);
  std::vector<float> same(37, 1e4f);
  Softmax(same.data(), 37);
  for (float v : same) EXPECT_NEAR(v, 1.0f / 37, 1e-7);
}

TEST_P(IsaTest, SiluMulMatchesReference) {
  for (int n : {1, 3, 7, 15, 16, 17, 31, 33, 127, 192, 1000, 14336}) {
    std::vector<float> gate = RandomFloats(n, rng_, 4.0f);
    gate[0] = -100.0f;  // exp(100) overflows: silu is (-)0.
    if (n > 1) gate[1] = 100.0f;
    const std::vector<float> up = RandomFloats(n, rng_);
    std::vector<float> got(n), want(n);
    SiluMul(gate.data(), up.data(), n, got.data());
    reference::SiluMul(gate.data(), up.data(), n, want.data());
    EXPECT_LT(NormalisedError(got, want), 1e-5) << "n=" << n;
  }
}

TEST_P(IsaTest, AxpyMatchesReference) {
  for (int n : {1, 3, 7, 15, 16, 17, 31, 33, 127, 192, 1000}) {
    const std::vector<float> x = RandomFloats(n, rng_);
    std::vector<float> got = RandomFloats(n + 1, rng_);
    got[n] = 12345.0f;  // Past the end: must stay untouched.
    std::vector<float> want = got;
    Axpy(-0.75f, x.data(), n, got.data());
    reference::Axpy(-0.75f, x.data(), n, want.data());
    EXPECT_LT(NormalisedError(got, want), 1e-6) << "n=" << n;
    EXPECT_EQ(got[n], 12345.0f);
  }
}

// A DeltaNet's convolution over several calls (a prompt's chunks, then decoded tokens) equals
// the reference's over one, outputs and the tail it leaves.
TEST_P(IsaTest, CausalConvMatchesReferenceAcrossCalls) {
  for (int channels : {5, 40, 384}) {
    for (int kernel : {2, 4}) {
      const int m = 75, stride = channels + 3, keep = kernel - 1;
      const std::vector<float> x = RandomFloats(static_cast<size_t>(m) * stride, rng_);
      const std::vector<float> weight = RandomFloats(static_cast<size_t>(channels) * kernel, rng_);
      const std::vector<float> tail = RandomFloats(static_cast<size_t>(channels) * keep, rng_);
      std::vector<float> want = x, want_tail = tail;
      reference::CausalConv(want.data(), m, channels, stride, weight.data(), kernel,
                            want_tail.data());
      std::vector<float> got = x, got_tail = tail;
      int done = 0;
      for (int part : {1, 2, 40, 1, 31}) {
        CausalConv(got.data() + static_cast<size_t>(done) * stride, part, channels, stride,
                   weight.data(), kernel, got_tail.data());
        done += part;
      }
      ASSERT_EQ(done, m);
      EXPECT_LT(NormalisedError(got, want), 1e-6)
          << "channels " << channels << " kernel " << kernel;
      EXPECT_EQ(got_tail, want_tail) << "channels " << channels << " kernel " << kernel;
      for (int t = 0; t < m; ++t) {  // the padding between rows is untouched
        for (int c = channels; c < stride; ++c) {
          ASSERT_EQ(got[static_cast<size_t>(t) * stride + c],
                    x[static_cast<size_t>(t) * stride + c]);
        }
      }
    }
  }
}

// Random inputs of one DeltaNet head as a layer makes them: q and k L2-normed (q also scaled),
// beta in (0, 1), the decay's log in [-max_decay, 0].
struct DeltaInputs {
  int m, dk, dv, stride;
  std::vector<float> qk, v, g, beta, state;

  DeltaInputs(int m_, int dk_, int dv_, float max_decay, std::mt19937& rng)
      : m(m_), dk(dk_), dv(dv_), stride(2 * dk_ + 1) {
    qk = RandomFloats(static_cast<size_t>(m) * stride, rng);
    for (int t = 0; t < m; ++t) {
      for (int part = 0; part < 2; ++part) {
        float* x = qk.data() + static_cast<size_t>(t) * stride + part * dk;
        double sum = 0;
        for (int i = 0; i < dk; ++i) sum += double{x[i]} * x[i];
        const float scale = static_cast<float>(1 / std::sqrt(sum)) *
                            (part == 0 ? 1.0f / std::sqrt(static_cast<float>(dk)) : 1.0f);
        for (int i = 0; i < dk; ++i) x[i] *= scale;
      }
    }
    v = RandomFloats(static_cast<size_t>(m) * dv, rng);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    for (int t = 0; t < m; ++t) {
      g.push_back(-max_decay * unit(rng));
      beta.push_back(0.02f + 0.96f * unit(rng));
    }
    state = RandomFloats(static_cast<size_t>(dk) * dv, rng, 0.5f);
  }

  // Tokens [first, first + count) on `state`, outputs to out (m, dv).
  GatedDeltaHead Head(int first, int count, float* s, float* out) const {
    return GatedDeltaHead{.q = qk.data() + static_cast<size_t>(first) * stride,
                          .k = qk.data() + static_cast<size_t>(first) * stride + dk,
                          .qk_stride = stride,
                          .v = v.data() + static_cast<size_t>(first) * dv,
                          .v_stride = dv,
                          .g = g.data() + first,
                          .beta = beta.data() + first,
                          .gb_stride = 1,
                          .m = count,
                          .dk = dk,
                          .dv = dv,
                          .state = s,
                          .out = out + static_cast<size_t>(first) * dv,
                          .out_stride = dv};
  }
};

// One call over a prompt (chunks of 64, the last partial) and token-by-token calls both equal
// the reference recurrence, outputs and final state, for the shapes of the shipped tiny model,
// the published Qwen3.6 (128 x 128) and the goldens' small heads.
TEST_P(IsaTest, GatedDeltaChunkedAndTokenByTokenMatchTheRecurrence) {
  for (auto [dk, dv] : {std::pair{16, 8}, std::pair{48, 48}, std::pair{128, 128}}) {
    for (int m : {1, 2, 63, 64, 150}) {
      const DeltaInputs in(m, dk, dv, 2.0f, rng_);
      std::vector<float> want_state = in.state, want(static_cast<size_t>(m) * dv);
      reference::GatedDelta(in.Head(0, m, want_state.data(), want.data()));
      std::vector<float> state = in.state, out(want.size());
      GatedDelta(in.Head(0, m, state.data(), out.data()));
      const std::string what =
          "dk " + std::to_string(dk) + " dv " + std::to_string(dv) + " m " + std::to_string(m);
      EXPECT_LT(NormalisedError(out, want), 2e-5) << what;
      EXPECT_LT(NormalisedError(state, want_state), 2e-5) << what;
      std::vector<float> token_state = in.state, token_out(want.size());
      for (int t = 0; t < m; ++t) GatedDelta(in.Head(t, 1, token_state.data(), token_out.data()));
      EXPECT_LT(NormalisedError(token_out, want), 2e-5) << what;
      EXPECT_LT(NormalisedError(token_state, want_state), 2e-5) << what;
    }
  }
}

// A state that decays to nothing within a chunk (exp(G) underflows to 0) gives finite outputs
// equal to the recurrence's: the chunked form only ever exponentiates differences <= 0.
TEST_P(IsaTest, GatedDeltaStaysFiniteUnderStrongDecay) {
  const DeltaInputs in(130, 32, 32, 60.0f, rng_);
  std::vector<float> want_state = in.state, want(static_cast<size_t>(in.m) * in.dv);
  reference::GatedDelta(in.Head(0, in.m, want_state.data(), want.data()));
  std::vector<float> state = in.state, out(want.size());
  GatedDelta(in.Head(0, in.m, state.data(), out.data()));
  for (float x : out) ASSERT_TRUE(std::isfinite(x));
  for (float x : state) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LT(NormalisedError(out, want), 2e-5);
  EXPECT_LT(NormalisedError(state, want_state), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(
    AllIsas, IsaTest, ::testing::Values("reference", "avx2", "avx512", "avx512vnni", "avx512bf16"),
    [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
}  // namespace tandem::kernels::cpu
