// The step's batched ops (Backend::embed .. kv_store, and rope over positions) at every level
// this CPU has, each against its definition computed here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/kernels/cpu/kernels.h"
#include "common/kernels/kv_format.h"

namespace tandem::kernels::cpu {
namespace {

std::vector<float> RandomFloats(size_t count, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

class StepOpsTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    ops_ = FindBackend(GetParam());
    if (ops_ == nullptr) GTEST_SKIP() << "this CPU cannot run the " << GetParam() << " kernels";
  }

  const Backend* ops_ = nullptr;
  std::mt19937 rng_{99};
};

TEST_P(StepOpsTest, EmbedGathersBf16RowsAsFloat32) {
  const int vocab = 7, cols = 19;
  std::vector<uint16_t> table(vocab * cols);
  for (size_t i = 0; i < table.size(); ++i) table[i] = F32ToBf16(static_cast<float>(i) * 0.25f);
  const int32_t ids[] = {6, 0, 6, 3};
  std::vector<float> out(4 * cols, -1.0f);
  ops_->embed(table.data(), cols, ids, 4, out.data());
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < cols; ++i) {
      ASSERT_EQ(out[r * cols + i], Bf16ToF32(table[ids[r] * cols + i])) << r << "," << i;
    }
  }
}

TEST_P(StepOpsTest, GatherRowsByIndexOrInOrderWithStrides) {
  const std::vector<float> x = RandomFloats(5 * 12, rng_);
  const int32_t rows[] = {4, 1, 1};
  std::vector<float> out(3 * 6, 0.0f);
  ops_->gather_rows(x.data() + 2, 12, rows, 3, 5, out.data(), 6);  // columns [2, 7) of 3 rows
  for (int i = 0; i < 3; ++i) {
    for (int c = 0; c < 5; ++c) ASSERT_EQ(out[i * 6 + c], x[rows[i] * 12 + 2 + c]);
    ASSERT_EQ(out[i * 6 + 5], 0.0f);  // past `cols`: untouched
  }
  std::vector<float> split(5 * 4);
  ops_->gather_rows(x.data() + 8, 12, nullptr, 5, 4, split.data(), 4);  // the last 4 columns
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 4; ++c) ASSERT_EQ(split[r * 4 + c], x[r * 12 + 8 + c]);
  }
}

TEST_P(StepOpsTest, AddRowsResidualScaledAndScatteredWithRepeats) {
  const int n = 37;
  const std::vector<float> x = RandomFloats(3 * n, rng_);
  const std::vector<float> y0 = RandomFloats(4 * n, rng_);
  std::vector<float> y = y0;
  ops_->add_rows(x.data(), 3, n, nullptr, nullptr, y.data());
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < n; ++i) {
      const float want = r < 3 ? y0[r * n + i] + x[r * n + i] : y0[r * n + i];
      ASSERT_EQ(y[r * n + i], want) << r << "," << i;
    }
  }
  const float scales[] = {0.5f, -2.0f, 0.25f};
  const int32_t to[] = {3, 0, 3};  // two rows into row 3
  y = y0;
  ops_->add_rows(x.data(), 3, n, scales, to, y.data());
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(y[0 * n + i], y0[i] - 2.0f * x[n + i], 1e-6);
    EXPECT_EQ(y[1 * n + i], y0[n + i]);
    EXPECT_EQ(y[2 * n + i], y0[2 * n + i]);
    EXPECT_NEAR(y[3 * n + i], y0[3 * n + i] + 0.5f * x[i] + 0.25f * x[2 * n + i], 1e-6);
  }
}

TEST_P(StepOpsTest, BiasSigmoidAndMul) {
  const int rows = 3, n = 11;
  const std::vector<float> bias = RandomFloats(n, rng_);
  const std::vector<float> x0 = RandomFloats(rows * n, rng_, 4.0f);
  std::vector<float> x = x0;
  ops_->add_bias(bias.data(), rows, n, x.data());
  for (int i = 0; i < rows * n; ++i) ASSERT_EQ(x[i], x0[i] + bias[i % n]);
  x = x0;
  ops_->sigmoid(x.data(), rows * n);
  for (int i = 0; i < rows * n; ++i)
    EXPECT_NEAR(x[i], 1.0 / (1.0 + std::exp(-double{x0[i]})), 1e-6);
  std::vector<float> y = x0;
  ops_->mul(x.data(), rows * n, y.data());
  for (int i = 0; i < rows * n; ++i) ASSERT_EQ(y[i], x0[i] * x[i]);
}

TEST_P(StepOpsTest, ClampedSwigluIsGptOssActivation) {
  // Values on both sides of the clamp, and exactly on it.
  std::vector<float> gate = RandomFloats(37, rng_, 6.0f), up = RandomFloats(37, rng_, 6.0f);
  gate[0] = 7.0f;
  gate[1] = 30.0f;
  up[2] = -30.0f;
  std::vector<float> out(37);
  ops_->clamped_swiglu(gate.data(), up.data(), 37, 1.702f, 7.0f, out.data());
  for (int i = 0; i < 37; ++i) {
    const double g = std::min<double>(gate[i], 7.0);
    const double u = std::clamp<double>(up[i], -7.0, 7.0);
    const double want = (u + 1) * g / (1 + std::exp(-1.702 * g));
    ASSERT_NEAR(out[i], want, 1e-5 * (1 + std::abs(want))) << i;
  }
}

// Gemma's GeGLU against the tanh form written out in double, over values where the tanh
// saturates both ways; its soft cap and scale likewise.
TEST_P(StepOpsTest, GeluTanhSoftCapAndScaleAreGemmas) {
  std::vector<float> gate = RandomFloats(37, rng_, 8.0f), up = RandomFloats(37, rng_, 3.0f);
  gate[0] = 0.0f;
  gate[1] = -12.0f;
  gate[2] = 12.0f;
  std::vector<float> out(37);
  ops_->gelu_tanh_mul(gate.data(), up.data(), 37, out.data());
  for (int i = 0; i < 37; ++i) {
    const double g = gate[i];
    const double gelu = 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
    const double want = gelu * up[i];
    ASSERT_NEAR(out[i], want, 1e-5 * (1 + std::abs(want))) << i;
  }
  std::vector<float> x = RandomFloats(37, rng_, 100.0f);
  const std::vector<float> x0 = x;
  ops_->soft_cap(x.data(), 37, 30.0f);
  for (int i = 0; i < 37; ++i) {
    ASSERT_NEAR(x[i], 30.0 * std::tanh(double{x0[i]} / 30.0), 2e-5) << i;
    ASSERT_LE(std::abs(x[i]), 30.0f);
  }
  x = x0;
  ops_->scale(x.data(), 37, 0.25f);
  for (int i = 0; i < 37; ++i) ASSERT_EQ(x[i], x0[i] * 0.25f) << i;
}

TEST_P(StepOpsTest, AttentionSinksDropEachHeadsSinkShare) {
  // Attention over scores s with one more logit, the sink: out * sum(e^s) / (sum(e^s) + e^sink)
  // = out / (1 + e^(sink - lse)).
  const int rows = 3, heads = 4, head_dim = 5;
  std::vector<float> out = RandomFloats(rows * heads * head_dim, rng_);
  const std::vector<float> lse = RandomFloats(rows * heads, rng_, 3.0f);
  const std::vector<float> sinks = RandomFloats(heads, rng_, 3.0f);
  std::vector<float> got = out;
  ops_->attention_sinks(got.data(), lse.data(), sinks.data(), rows, heads, head_dim);
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      const double mass = std::exp(double{lse[r * heads + h]});
      const double keep = mass / (mass + std::exp(double{sinks[h]}));
      for (int d = 0; d < head_dim; ++d) {
        const int i = (r * heads + h) * head_dim + d;
        ASSERT_NEAR(got[i], out[i] * keep, 1e-6) << r << "," << h << "," << d;
      }
    }
  }
}

TEST_P(StepOpsTest, L2NormScalesEachHeadOfEachStridedRow) {
  const int rows = 3, heads = 2, n = 16, stride = 50;
  const std::vector<float> x0 = RandomFloats(rows * stride, rng_, 3.0f);
  std::vector<float> x = x0;
  ops_->l2_norm(x.data() + 5, rows, heads, n, stride, 0.5f);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < stride; ++c) {
      const int head = (c - 5) / n;
      if (c < 5 || head >= heads) {
        ASSERT_EQ(x[r * stride + c], x0[r * stride + c]);  // outside the heads: untouched
        continue;
      }
      double sum = 0;
      for (int i = 0; i < n; ++i) {
        const double v = x0[r * stride + 5 + head * n + i];
        sum += v * v;
      }
      EXPECT_NEAR(x[r * stride + c], x0[r * stride + c] * 0.5 / std::sqrt(sum + 1e-6), 1e-6);
    }
  }
}

TEST_P(StepOpsTest, DeltaGatesAreSigmoidAndTheLogOfTheDecay) {
  const int rows = 4, heads = 3;
  const std::vector<float> a0 = {-30, -1, 0, 0.5f, 2, 19.9f, 20.1f, 25, -3, 1, 4, -0.5f};
  const std::vector<float> b0 = RandomFloats(rows * heads, rng_, 3.0f);
  const float a_log[] = {0.0f, -1.5f, 1.0f};
  const float dt_bias[] = {0.25f, 0.0f, -1.0f};
  std::vector<float> a = a0, b = b0;
  ops_->delta_gates(a.data(), b.data(), rows, heads, a_log, dt_bias);
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      const int i = r * heads + h;
      const double x = double{a0[i]} + dt_bias[h];
      const double softplus = x > 20 ? x : std::log1p(std::exp(x));
      EXPECT_NEAR(a[i], -std::exp(double{a_log[h]}) * softplus, 1e-5 * (1 + std::fabs(softplus)))
          << i;
      EXPECT_NEAR(b[i], 1.0 / (1.0 + std::exp(-double{b0[i]})), 1e-6) << i;
    }
  }
}

TEST_P(StepOpsTest, RouteIsSoftmaxTopKAndWeightsMaskedAndRenormalised) {
  const int rows = 5, n = 24, k = 4;
  std::vector<float> logits0 = RandomFloats(rows * n, rng_, 2.0f);
  logits0[2 * n + 7] = logits0[2 * n + 3] = 9.0f;  // a tie: the lower index first
  std::vector<float> bias(n, 0.0f);
  bias[5] = bias[11] = -std::numeric_limits<float>::infinity();
  logits0[4 * n + 5] = 20.0f;  // the strongest logit, masked out
  for (const bool renormalize : {false, true}) {
    for (const bool masked : {false, true}) {
      std::vector<float> p = logits0;
      std::vector<int32_t> experts(rows * k);
      std::vector<float> weights(rows * k);
      RouteSpec spec{.k = k, .renormalize = renormalize};
      spec.mask = masked ? bias.data() : nullptr;
      ops_->route(p.data(), rows, n, spec, experts.data(), weights.data());
      for (int r = 0; r < rows; ++r) {
        std::vector<double> want(n);
        double max = -INFINITY, sum = 0;
        for (int e = 0; e < n; ++e) {
          want[e] = double{logits0[r * n + e]} + (masked ? bias[e] : 0.0f);
          max = std::max(max, want[e]);
        }
        for (double& v : want) sum += (v = std::exp(v - max));
        for (double& v : want) v /= sum;
        std::vector<int32_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return want[a] > want[b]; });
        double mass = 0;
        for (int j = 0; j < k; ++j) mass += want[order[j]];
        for (int e = 0; e < n; ++e) EXPECT_NEAR(p[r * n + e], want[e], 1e-6) << r << "," << e;
        for (int j = 0; j < k; ++j) {
          EXPECT_EQ(experts[r * k + j], order[j]) << "row " << r << " rank " << j;
          EXPECT_NEAR(weights[r * k + j], want[order[j]] / (renormalize ? mass : 1.0), 1e-6);
          if (masked) {
            EXPECT_TRUE(order[j] != 5 && order[j] != 11);
          }
        }
      }
    }
  }
}

// DeepSeek-V3's router: sigmoid scores, chosen by score + selection bias among the experts of
// the best groups (a group scored by its best two), weights the chosen scores renormalised and
// scaled; DeepSeek-V2's group-limited greedy: softmax, groups by their best. By definition, in
// double, with a plan's mask that drops an expert of the best group.
TEST_P(StepOpsTest, GroupedRoutingChoosesWithinTheBestGroupsByScorePlusBias) {
  const int rows = 6, n = 32, k = 3, groups = 4, top_groups = 2, per = n / groups;
  const std::vector<float> logits0 = RandomFloats(rows * n, rng_, 2.0f);
  const std::vector<float> bias = RandomFloats(n, rng_, 0.5f);
  std::vector<float> mask(n, 0.0f);
  mask[9] = -std::numeric_limits<float>::infinity();
  for (const bool sigmoid : {true, false}) {
    for (const bool masked : {false, true}) {
      std::vector<float> p = logits0;
      std::vector<int32_t> experts(rows * k);
      std::vector<float> weights(rows * k);
      RouteSpec spec{.k = k, .renormalize = sigmoid};
      spec.mask = masked ? mask.data() : nullptr;
      spec.sigmoid = sigmoid;
      spec.selection_bias = sigmoid ? bias.data() : nullptr;
      spec.groups = groups;
      spec.top_groups = top_groups;
      spec.group_top_two = sigmoid;
      spec.scaling = sigmoid ? 2.5f : 1.0f;
      ops_->route(p.data(), rows, n, spec, experts.data(), weights.data());
      for (int r = 0; r < rows; ++r) {
        std::vector<double> score(n), choice(n);
        double max = -INFINITY, sum = 0;
        for (int e = 0; e < n; ++e) {
          score[e] = double{logits0[r * n + e]} + (masked ? mask[e] : 0.0f);
          max = std::max(max, score[e]);
        }
        for (double& v : score) {
          if (sigmoid) {
            v = 1.0 / (1.0 + std::exp(-v));
          } else {
            sum += (v = std::exp(v - max));
          }
        }
        if (!sigmoid) {
          for (double& v : score) v /= sum;
        }
        for (int e = 0; e < n; ++e) choice[e] = score[e] + (sigmoid ? bias[e] : 0.0f);
        std::vector<std::pair<double, int>> group(groups);
        for (int g = 0; g < groups; ++g) {
          std::vector<double> c(choice.begin() + g * per, choice.begin() + (g + 1) * per);
          std::sort(c.rbegin(), c.rend());
          group[g] = {sigmoid ? c[0] + c[1] : c[0], g};
        }
        std::stable_sort(group.begin(), group.end(),
                         [](const auto& a, const auto& b) { return a.first > b.first; });
        for (int g = top_groups; g < groups; ++g) {
          std::fill_n(choice.begin() + group[g].second * per, per, 0.0);
        }
        if (masked) choice[9] = -INFINITY;
        std::vector<int32_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
        double mass = 0;
        for (int j = 0; j < k; ++j) mass += score[order[j]];
        for (int e = 0; e < n; ++e) EXPECT_NEAR(p[r * n + e], score[e], 1e-6) << r << "," << e;
        for (int j = 0; j < k; ++j) {
          EXPECT_EQ(experts[r * k + j], order[j]) << "row " << r << " rank " << j;
          EXPECT_NEAR(weights[r * k + j],
                      score[order[j]] / (sigmoid ? mass : 1.0) * (sigmoid ? 2.5 : 1.0), 1e-5);
          if (masked) {
            EXPECT_NE(order[j], 9);
          }
        }
      }
    }
  }
}

TEST_P(StepOpsTest, RopeOverPositionsIsEachTokensRotationAndPartialRotaryPassesTheRest) {
  const int rows = 4, heads = 3;
  const int32_t positions[] = {0, 7, 1234, 5};
  for (const int head_dim : {8, 64}) {
    for (const int rotary_dim : {head_dim, head_dim / 4}) {
      const std::vector<float> x = RandomFloats(rows * heads * head_dim, rng_);
      std::vector<float> got = x, want = x;
      const std::vector<float> inv_freq = DefaultRopeFrequencies(1e4f, rotary_dim);
      const RopeSpec rope{inv_freq.data(), rotary_dim};
      ops_->rope(got.data(), rows, heads, head_dim, rope, positions);
      for (int r = 0; r < rows; ++r) {
        for (int h = 0; h < heads; ++h) {
          reference::Rope(want.data() + (r * heads + h) * head_dim, 1, rotary_dim, positions[r],
                          rope);
        }
      }
      for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 2e-6) << "head_dim " << head_dim << " rotary " << rotary_dim;
        if (static_cast<int>(i % head_dim) >= rotary_dim) {
          ASSERT_EQ(got[i], x[i]);
        }
      }
    }
  }
}

// DeepSeek's interleaved pairs (2i, 2i + 1) are rotate_half's pairs (i, i + d/2) on the head's
// values de-interleaved (Hugging Face's apply_rotary_pos_emb_interleave), here with frequencies
// of no closed form (YaRN's blend), a rotary part before the head's pass-through rest.
TEST_P(StepOpsTest, InterleavedRopeIsRotateHalfOverDeinterleavedValues) {
  const int rows = 3, heads = 2, head_dim = 24, rotary_dim = 16, half = rotary_dim / 2;
  const int32_t positions[] = {0, 9, 3000};
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = 1.0f / (1.0f + 3.0f * static_cast<float>(i * i));
  const std::vector<float> x = RandomFloats(rows * heads * head_dim, rng_);
  std::vector<float> got = x;
  ops_->rope(got.data(), rows, heads, head_dim, {inv_freq.data(), rotary_dim, true}, positions);
  std::vector<float> want = x;
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      float* head = want.data() + (r * heads + h) * head_dim;
      std::vector<float> split(rotary_dim);
      for (int i = 0; i < half; ++i) {
        split[i] = head[2 * i];
        split[i + half] = head[2 * i + 1];
      }
      reference::Rope(split.data(), 1, rotary_dim, positions[r], {inv_freq.data(), rotary_dim});
      for (int i = 0; i < half; ++i) {
        head[2 * i] = split[i];
        head[2 * i + 1] = split[i + half];
      }
    }
  }
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 2e-6) << i;
    if (static_cast<int>(i % head_dim) >= rotary_dim) {
      ASSERT_EQ(got[i], x[i]);
    }
  }
}

TEST_P(StepOpsTest, KvStoreWritesEachPositionIntoItsBlockInEveryDtype) {
  const int block_size = 4, kv_heads = 2, head_dim = 8, blocks = 5;
  const int row = kv_heads * head_dim;
  for (const KvDtype dtype : {KvDtype::kF32, KvDtype::kBf16, KvDtype::kInt8}) {
    const size_t block_bytes = KvBlockBytes(dtype, block_size, kv_heads, head_dim);
    std::vector<std::byte> k_pool(blocks * block_bytes), v_pool(blocks * block_bytes);
    const int32_t table[] = {3, 0, 4};  // positions 0-3 in block 3, 4-7 in 0, 8-11 in 4
    const int32_t positions[] = {2, 3, 4, 9};
    const std::vector<float> k = RandomFloats(4 * row, rng_), v = RandomFloats(4 * row, rng_);
    ops_->kv_store(PagedKvOut{k_pool.data(), v_pool.data(), dtype, block_size, kv_heads, head_dim,
                              block_bytes, table},
                   4, positions, k.data(), v.data());
    const PagedKv view{k_pool.data(), v_pool.data(), dtype,       block_size,
                       kv_heads,      head_dim,      block_bytes, table};
    const double tolerance = dtype == KvDtype::kF32 ? 0 : dtype == KvDtype::kBf16 ? 1e-2 : 3e-2;
    for (int r = 0; r < 4; ++r) {
      for (int h = 0; h < kv_heads; ++h) {
        float got_k[head_dim], got_v[head_dim];
        LoadKvRow(view, false, positions[r], h, got_k);
        LoadKvRow(view, true, positions[r], h, got_v);
        for (int i = 0; i < head_dim; ++i) {
          EXPECT_NEAR(got_k[i], k[r * row + h * head_dim + i], tolerance) << KvDtypeName(dtype);
          EXPECT_NEAR(got_v[i], v[r * row + h * head_dim + i], tolerance) << KvDtypeName(dtype);
        }
      }
    }
    // Block 1 and 2 are not in the table: nothing lands there.
    for (size_t i = block_bytes; i < 3 * block_bytes; ++i) {
      ASSERT_EQ(k_pool[i], std::byte{0});
      ASSERT_EQ(v_pool[i], std::byte{0});
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, StepOpsTest,
                         ::testing::Values("reference", "avx2", "avx512", "avx512vnni",
                                           "avx512bf16"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace tandem::kernels::cpu
