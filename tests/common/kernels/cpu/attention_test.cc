// Paged attention at every kernel level against the reference and a dense computation, over
// KV pools of every dtype (common/kernels/kv_format.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/kernels/cpu/kernels.h"
#include "common/kernels/kv_format.h"

namespace tandem::kernels::cpu {
namespace {

constexpr KvDtype kDtypes[] = {KvDtype::kF32, KvDtype::kBf16, KvDtype::kInt8};

std::vector<float> RandomFloats(size_t count, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

// max |got - want| / max |want|; NaN anywhere is infinitely wrong.
double NormalisedError(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double{got[i]} - want[i]);
    if (std::isnan(d)) return INFINITY;
    diff = std::max(diff, d);
    scale = std::max(scale, std::fabs(double{want[i]}));
  }
  return diff / scale;
}

// K and V for context_len positions stored in `dtype` over a pool's blocks in shuffled order.
// Every other block holds NaN (for int8, NaN scales), so reading outside the context poisons
// the result. `k` and `v` hold what the pool holds, read back as float32 (contiguous, for the
// dense check). `shape`, when given, rewrites the drawn keys and values (context_len,
// num_kv_heads, head_dim) before they are stored.
struct ScatteredKv {
  using Shape = std::function<void(std::vector<float>& k, std::vector<float>& v)>;
  ScatteredKv(KvDtype dtype, int num_kv_heads, int head_dim, int block_size, int context_len,
              std::mt19937& rng, const Shape& shape = {})
      : row(size_t{1} * num_kv_heads * head_dim) {
    std::vector<float> k_in = RandomFloats(context_len * row, rng);
    std::vector<float> v_in = RandomFloats(context_len * row, rng);
    if (shape) shape(k_in, v_in);
    const int used = (context_len + block_size - 1) / block_size;
    const int num_blocks = 2 * used + 3;
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    block_table.assign(ids.begin(), ids.begin() + used);
    const size_t block_bytes = KvBlockBytes(dtype, block_size, num_kv_heads, head_dim);
    // NaN rows in every slot of every block first, then the context's rows.
    k_pool.resize(num_blocks * block_bytes / sizeof(float) + 1);
    v_pool.resize(k_pool.size());
    const std::vector<float> nan_row(row, NAN);
    for (int b = 0; b < num_blocks; ++b) {
      for (int o = 0; o < block_size; ++o) {
        StoreKvToken(nan_row.data(), dtype, block_size, num_kv_heads, head_dim, o,
                     Bytes(k_pool) + b * block_bytes);
        StoreKvToken(nan_row.data(), dtype, block_size, num_kv_heads, head_dim, o,
                     Bytes(v_pool) + b * block_bytes);
      }
    }
    for (int t = 0; t < context_len; ++t) {
      const size_t block = size_t{1} * block_table[t / block_size] * block_bytes;
      StoreKvToken(k_in.data() + t * row, dtype, block_size, num_kv_heads, head_dim, t % block_size,
                   Bytes(k_pool) + block);
      StoreKvToken(v_in.data() + t * row, dtype, block_size, num_kv_heads, head_dim, t % block_size,
                   Bytes(v_pool) + block);
    }
    view = PagedKv{.k = Bytes(k_pool),
                   .v = Bytes(v_pool),
                   .dtype = dtype,
                   .block_size = block_size,
                   .num_kv_heads = num_kv_heads,
                   .head_dim = head_dim,
                   .block_bytes = block_bytes,
                   .block_table = block_table.data()};
    k.resize(context_len * row);
    v.resize(context_len * row);
    for (int t = 0; t < context_len; ++t) {
      for (int h = 0; h < num_kv_heads; ++h) {
        LoadKvRow(view, false, t, h, k.data() + t * row + h * head_dim);
        LoadKvRow(view, true, t, h, v.data() + t * row + h * head_dim);
      }
    }
  }
  static std::byte* Bytes(std::vector<float>& pool) {
    return reinterpret_cast<std::byte*>(pool.data());
  }

  size_t row;
  std::vector<float> k, v;            // (context_len, num_kv_heads, head_dim), as stored
  std::vector<float> k_pool, v_pool;  // float-typed for alignment; bytes in the dtype's layout
  std::vector<int32_t> block_table;
  PagedKv view;
};

// Attention over contiguous K/V (context_len, num_kv_heads, head_dim), in double.
std::vector<float> DenseAttention(const std::vector<float>& q, int num_heads, int num_kv_heads,
                                  int head_dim, const std::vector<float>& k,
                                  const std::vector<float>& v, int context_len, float scale) {
  std::vector<float> out(size_t{1} * num_heads * head_dim);
  for (int h = 0; h < num_heads; ++h) {
    const int kv = h / (num_heads / num_kv_heads);
    std::vector<double> p(context_len);
    for (int t = 0; t < context_len; ++t) {
      const float* kt = k.data() + (size_t{1} * t * num_kv_heads + kv) * head_dim;
      double dot = 0;
      for (int i = 0; i < head_dim; ++i) dot += double{q[h * head_dim + i]} * kt[i];
      p[t] = dot * scale;
    }
    const double max = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& s : p) sum += (s = std::exp(s - max));
    for (int i = 0; i < head_dim; ++i) {
      double acc = 0;
      for (int t = 0; t < context_len; ++t) {
        acc += p[t] / sum * v[(size_t{1} * t * num_kv_heads + kv) * head_dim + i];
      }
      out[h * head_dim + i] = static_cast<float>(acc);
    }
  }
  return out;
}

class AttentionTest : public ::testing::TestWithParam<const char*> {
 protected:
  // The avx512bf16 level multiplies a bf16 or int8 cache's keys and values by the query and
  // the softmax weights rounded to bf16 (vdpbf16ps); every other (level, dtype) computes in
  // float32.
  double Tolerance(KvDtype dtype, double exact) const {
    return std::string(GetParam()) == "avx512bf16" && dtype != KvDtype::kF32 ? 2e-2 : exact;
  }

  void SetUp() override {
    previous_ = KernelIsa();
    if (!SetKernelIsa(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << GetParam() << " kernels";
    }
  }
  void TearDown() override { SetKernelIsa(previous_); }

  std::string previous_;
  std::mt19937 rng_{1234};
};

TEST_P(AttentionTest, MatchesDenseAttentionForEveryDtype) {
  const int num_heads = 6, num_kv_heads = 2;
  for (KvDtype dtype : kDtypes) {
    for (int head_dim : {16, 33, 64}) {
      for (int block_size : {5, 16}) {
        // Lengths below, at and past the 32-position tile, and not multiples of the block.
        for (int context_len : {1, 5, 16, 31, 32, 33, 37, 100, 300}) {
          ScatteredKv kv(dtype, num_kv_heads, head_dim, block_size, context_len, rng_);
          const std::vector<float> q = RandomFloats(num_heads * head_dim, rng_);
          const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
          const std::vector<float> want =
              DenseAttention(q, num_heads, num_kv_heads, head_dim, kv.k, kv.v, context_len, scale);
          std::vector<float> got(want.size(), NAN), ref(want.size(), NAN);
          PagedAttention(q.data(), num_heads, kv.view, context_len, scale, got.data());
          reference::PagedAttention(q.data(), num_heads, kv.view, context_len, scale, ref.data());
          const std::string where = std::string(KvDtypeName(dtype)) +
                                    " head_dim=" + std::to_string(head_dim) +
                                    " block_size=" + std::to_string(block_size) +
                                    " context_len=" + std::to_string(context_len);
          EXPECT_LT(NormalisedError(got, want), Tolerance(dtype, 1e-5)) << where;
          EXPECT_LT(NormalisedError(ref, want), 1e-6) << where;
        }
      }
    }
  }
}

TEST_P(AttentionTest, LongContextsMatchTheReference) {
  const int num_heads = 8, num_kv_heads = 2, head_dim = 64, block_size = 16;
  for (KvDtype dtype : kDtypes) {
    for (int context_len : {1000, 4099}) {
      ScatteredKv kv(dtype, num_kv_heads, head_dim, block_size, context_len, rng_);
      // Larger queries make the softmax peaked, so the online rescaling matters.
      const std::vector<float> q = RandomFloats(num_heads * head_dim, rng_, 3.0f);
      std::vector<float> got(num_heads * head_dim, NAN), ref(got.size(), NAN);
      PagedAttention(q.data(), num_heads, kv.view, context_len, 0.125f, got.data());
      reference::PagedAttention(q.data(), num_heads, kv.view, context_len, 0.125f, ref.data());
      EXPECT_LT(NormalisedError(got, ref), Tolerance(dtype, 1e-5))
          << KvDtypeName(dtype) << " context_len=" << context_len;
    }
  }
}

// An attention sink (one position scoring far above the rest, as trained models' first token
// does) must not drown the other positions of its tile: with every value 1 the output is 1 for
// any weights, unless weights quantized against their tile's largest lose the small ones (8-bit
// weights lose every weight under 1/510 of the sink's: 0.7% of the mass here; an avx512bf16
// int8 path that had them was measured at 0.993).
TEST_P(AttentionTest, ASinkKeepsTheRestOfItsTile) {
  const int num_kv_heads = 2, head_dim = 64, block_size = 16, context_len = 1000;
  for (KvDtype dtype : kDtypes) {
    for (int group : {2, 4}) {
      const int num_heads = num_kv_heads * group;
      // Every query head 3 u (u a unit vector): keys N(0, 1) score N(0, 0.375^2) at scale
      // 0.125, the sink's key 24 u scores 9.
      std::vector<float> u = RandomFloats(head_dim, rng_);
      const float norm = std::sqrt(std::inner_product(u.begin(), u.end(), u.begin(), 0.0f));
      for (float& x : u) x /= norm;
      std::vector<float> q(static_cast<size_t>(num_heads) * head_dim);
      for (size_t i = 0; i < q.size(); ++i) q[i] = 3 * u[i % head_dim];
      const int sink = 37;  // inside the second block and the first tile
      ScatteredKv kv(dtype, num_kv_heads, head_dim, block_size, context_len, rng_,
                     [&](std::vector<float>& k, std::vector<float>& v) {
                       std::fill(v.begin(), v.end(), 1.0f);
                       for (int i = 0; i < num_kv_heads * head_dim; ++i) {
                         k[static_cast<size_t>(sink) * num_kv_heads * head_dim + i] =
                             24 * u[i % head_dim];
                       }
                     });
      std::vector<float> got(q.size(), NAN);
      PagedAttention(q.data(), num_heads, kv.view, context_len, 0.125f, got.data());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], 1.0f, 1e-3) << KvDtypeName(dtype) << " group=" << group << " at " << i;
      }
    }
  }
}

// Decode with 8 and 16 query heads a KV head (gpt-oss's 8 of 64 dims; 16 of 128; Gemma 4's
// global layers' 8 of 512), which the avx512bf16 level runs as the rows of its query-block
// kernel, with 4 (Mixtral's 4 of 128), whose four heads it scores together, and with 2 (Gemma
// 4's sliding layers: 2 of 256), which it runs head by head: whole contexts and parts (one
// position, empty, inside, to the end), outputs and log-sum-exps, against the reference level.
TEST_P(AttentionTest, GroupedHeadsDecodeMatchesTheReference) {
  const int num_kv_heads = 2, block_size = 16, context_len = 300;
  for (KvDtype dtype : kDtypes) {
    for (int head_dim : {64, 128, 256, 512}) {
      for (int group : {2, 4, 8, 16}) {
        if (head_dim >= 256 && (group == 4 || group == 16)) continue;  // Gemma 4's are 2 and 8
        const int num_heads = num_kv_heads * group;
        ScatteredKv kv(dtype, num_kv_heads, head_dim, block_size, context_len, rng_);
        const std::vector<float> q = RandomFloats(num_heads * head_dim, rng_, 2.0f);
        const int bounds[][2] = {{0, context_len}, {0, 1}, {1, 1}, {1, 137}, {137, context_len}};
        for (const auto& [begin, end] : bounds) {
          std::vector<float> got(num_heads * head_dim, NAN), ref(got.size(), NAN);
          std::vector<float> got_lse(num_heads, NAN), ref_lse(num_heads, NAN);
          PagedAttentionRange(q.data(), num_heads, kv.view, begin, end, 0.125f, 0, num_kv_heads,
                              got.data(), got_lse.data());
          reference::PagedAttentionRange(q.data(), num_heads, kv.view, begin, end, 0.125f, 0,
                                         num_kv_heads, ref.data(), ref_lse.data());
          const std::string where = std::string(KvDtypeName(dtype)) +
                                    " head_dim=" + std::to_string(head_dim) +
                                    " group=" + std::to_string(group) + " [" +
                                    std::to_string(begin) + "," + std::to_string(end) + ")";
          if (begin == end) {
            for (int h = 0; h < num_heads; ++h) ASSERT_EQ(got_lse[h], -INFINITY) << where;
            continue;
          }
          EXPECT_LT(NormalisedError(got, ref), Tolerance(dtype, 1e-5)) << where;
          // A score rounds with the query (bf16 at avx512bf16): the log-sum-exp's error scales
          // with the scores, not with itself (one position's may be near 0).
          for (int h = 0; h < num_heads; ++h) {
            EXPECT_NEAR(got_lse[h], ref_lse[h],
                        Tolerance(dtype, 1e-4) * (std::fabs(ref_lse[h]) + 1))
                << where << " head " << h;
          }
        }
      }
    }
  }
}

// Parts of a context, merged by their log-sum-exps, equal the whole; an empty part counts for
// nothing.
TEST_P(AttentionTest, ContextPartsMergeToTheWhole) {
  const int num_heads = 4, num_kv_heads = 2, head_dim = 40, block_size = 7, context_len = 203;
  for (KvDtype dtype : kDtypes) {
    ScatteredKv kv(dtype, num_kv_heads, head_dim, block_size, context_len, rng_);
    const std::vector<float> q = RandomFloats(num_heads * head_dim, rng_, 2.0f);
    std::vector<float> whole(num_heads * head_dim, NAN), whole_lse(num_heads, NAN);
    PagedAttentionRange(q.data(), num_heads, kv.view, 0, context_len, 0.2f, 0, num_kv_heads,
                        whole.data(), whole_lse.data());
    std::vector<float> ref_lse(num_heads, NAN), ref_out(whole.size(), NAN);
    reference::PagedAttentionRange(q.data(), num_heads, kv.view, 0, context_len, 0.2f, 0,
                                   num_kv_heads, ref_out.data(), ref_lse.data());
    for (int h = 0; h < num_heads; ++h) {
      EXPECT_NEAR(whole_lse[h], ref_lse[h], Tolerance(dtype, 1e-4) * std::fabs(ref_lse[h]) + 1e-4)
          << h;
    }

    const int bounds[] = {0, 1, 1, 64, 150, context_len};  // parts [0,1) [1,1) [1,64) ...
    const int parts = 5;
    std::vector<std::vector<float>> out(parts, std::vector<float>(whole.size(), NAN));
    std::vector<std::vector<float>> lse(parts, std::vector<float>(num_heads, NAN));
    for (int p = 0; p < parts; ++p) {
      PagedAttentionRange(q.data(), num_heads, kv.view, bounds[p], bounds[p + 1], 0.2f, 0,
                          num_kv_heads, out[p].data(), lse[p].data());
    }
    for (int h = 0; h < num_kv_heads * 2; ++h) EXPECT_EQ(lse[1][h], -INFINITY);
    std::vector<float> merged(whole.size(), NAN);
    for (int h = 0; h < num_heads; ++h) {
      std::vector<const float*> part_out;
      std::vector<float> part_lse;
      for (int p = 0; p < parts; ++p) {
        part_out.push_back(out[p].data() + h * head_dim);
        part_lse.push_back(lse[p][h]);
      }
      MergeAttentionParts(part_out.data(), part_lse.data(), parts, head_dim,
                          merged.data() + h * head_dim);
    }
    EXPECT_LT(NormalisedError(merged, whole), Tolerance(dtype, 1e-5)) << KvDtypeName(dtype);
  }
}

// Head ranges write only their own query heads, and together equal the whole call.
TEST_P(AttentionTest, HeadRangesPartitionTheHeads) {
  const int num_heads = 8, num_kv_heads = 4, head_dim = 24, block_size = 16, context_len = 45;
  for (KvDtype dtype : kDtypes) {
    ScatteredKv kv(dtype, num_kv_heads, head_dim, block_size, context_len, rng_);
    const std::vector<float> q = RandomFloats(num_heads * head_dim, rng_);
    std::vector<float> whole(num_heads * head_dim, NAN);
    PagedAttention(q.data(), num_heads, kv.view, context_len, 0.2f, whole.data());
    std::vector<float> parts(whole.size(), NAN);
    for (auto [begin, end] : {std::pair{0, 1}, std::pair{1, 3}, std::pair{3, 4}}) {
      PagedAttentionRange(q.data(), num_heads, kv.view, 0, context_len, 0.2f, begin, end,
                          parts.data(), nullptr);
      for (size_t i = static_cast<size_t>(end) * 2 * head_dim; i < parts.size(); ++i) {
        ASSERT_TRUE(std::isnan(parts[i])) << "range [" << begin << ", " << end << ") wrote " << i;
      }
    }
    EXPECT_EQ(parts, whole) << KvDtypeName(dtype);
  }
}

TEST_P(AttentionTest, MapsQueryHeadsToKvHeads) {
  // V is kv_head + 1 everywhere, so each output is the value of the KV head its query used:
  // query heads 0-2 read KV head 0, heads 3-5 read KV head 1. Exact in every dtype.
  const int num_heads = 6, num_kv_heads = 2, head_dim = 8, block_size = 4, context_len = 10;
  for (KvDtype dtype : kDtypes) {
    ScatteredKv kv(dtype, num_kv_heads, head_dim, block_size, context_len, rng_);
    std::vector<float> row(num_kv_heads * head_dim);
    for (int h = 0; h < num_kv_heads; ++h) std::fill_n(row.begin() + h * head_dim, head_dim, h + 1);
    for (int t = 0; t < context_len; ++t) {
      StoreKvToken(row.data(), dtype, block_size, num_kv_heads, head_dim, t % block_size,
                   ScatteredKv::Bytes(kv.v_pool) +
                       size_t{1} * kv.block_table[t / block_size] * kv.view.block_bytes);
    }
    const std::vector<float> q = RandomFloats(num_heads * head_dim, rng_);
    std::vector<float> out(num_heads * head_dim, NAN);
    PagedAttention(q.data(), num_heads, kv.view, context_len, 0.35f, out.data());
    for (int h = 0; h < num_heads; ++h) {
      for (int i = 0; i < head_dim; ++i) {
        EXPECT_NEAR(out[h * head_dim + i], h / 3 + 1, 1e-5) << KvDtypeName(dtype) << " " << h;
      }
    }
  }
}

// Latent attention's cache (DeepSeek-V2/V3): one KV head of 576 values whose values are its
// keys (the pool keeps keys only: v aliases k), read by 16 query heads, for decode
// (paged_attention, whole and in parts with their log-sum-exps) and a prompt's query blocks,
// against the reference.
TEST_P(AttentionTest, LatentCacheRowsMatchTheReference) {
  const Backend& backend = ActiveBackend();
  const int num_heads = 16, head_dim = 576, block_size = 16;
  for (KvDtype dtype : kDtypes) {
    for (int context_len : {1, 33, 300}) {
      ScatteredKv kv(dtype, 1, head_dim, block_size, context_len, rng_);
      PagedKv keys_only = kv.view;
      keys_only.v = keys_only.k;
      const std::vector<float> q = RandomFloats(num_heads * head_dim, rng_, 2.0f);
      const float scale = 0.1f;
      const std::string where =
          std::string(KvDtypeName(dtype)) + " context_len=" + std::to_string(context_len);
      for (int begin : {0, context_len / 3}) {
        std::vector<float> got(q.size(), NAN), want(q.size(), NAN);
        std::vector<float> got_lse(num_heads, NAN), want_lse(num_heads, NAN);
        backend.paged_attention(q.data(), num_heads, keys_only, begin, context_len, scale, 0, 1,
                                got.data(), got_lse.data());
        reference::PagedAttentionRange(q.data(), num_heads, keys_only, begin, context_len, scale, 0,
                                       1, want.data(), want_lse.data());
        EXPECT_LT(NormalisedError(got, want), Tolerance(dtype, 1e-5)) << where << " from " << begin;
        for (int h = 0; h < num_heads; ++h) {
          EXPECT_NEAR(got_lse[h], want_lse[h],
                      Tolerance(dtype, 1e-4) * (std::fabs(want_lse[h]) + 1))
              << where << " head " << h;
        }
      }
      const int m = std::min(context_len, 16);  // the last m positions as a query block
      const std::vector<float> block = RandomFloats(m * num_heads * head_dim, rng_, 2.0f);
      std::vector<float> got(block.size(), NAN);
      backend.causal_attention(block.data(), m, num_heads, keys_only, context_len - m, 0,
                               context_len, /*window=*/0, scale, got.data(), nullptr);
      for (int i = 0; i < m; ++i) {
        const size_t q_dim = size_t{num_heads} * head_dim;
        std::vector<float> want(q_dim, NAN);
        reference::PagedAttentionRange(block.data() + i * q_dim, num_heads, keys_only, 0,
                                       context_len - m + i + 1, scale, 0, 1, want.data(), nullptr);
        const std::vector<float> row(got.begin() + i * q_dim, got.begin() + (i + 1) * q_dim);
        EXPECT_LT(NormalisedError(row, want), Tolerance(dtype, 1e-5)) << where << " query " << i;
      }
    }
  }
}

// Blocks of consecutive queries (causal_attention, the prefill path): every query of the block
// against the reference over its own causal range, for block sizes around the 16-lane row
// vectors, group sizes 1 to 8, block starts inside and at the edges of tiles and blocks, and
// context ranges that cut the block (parts of a split context, one of them empty for some
// queries), without a window and with sliding windows shorter and longer than a tile (each
// query its own first position), with the log-sum-exps.
TEST_P(AttentionTest, QueryBlocksMatchTheReferencePerQuery) {
  const Backend& backend = ActiveBackend();
  const int num_kv_heads = 2, block_size = 16;
  for (KvDtype dtype : kDtypes) {
    for (int head_dim : {32, 64, 40, 256, 512}) {
      for (int group : {1, 2, 4, 8}) {
        // Gemma 4's wide heads only as it has them (2 query heads a KV head of 256, 8 of 512):
        // the per-query reference is slow at these widths.
        if (head_dim < 256 ? group == 2 : group != (head_dim == 256 ? 2 : 8)) continue;
        const int num_heads = num_kv_heads * group;
        const size_t q_dim = static_cast<size_t>(num_heads) * head_dim;
        for (auto [m, first_position, context_begin, context_end, window] :
             {std::array{1, 0, 0, 1, 0}, std::array{2, 0, 0, 2, 0}, std::array{5, 30, 0, 35, 0},
              std::array{16, 0, 0, 16, 0}, std::array{16, 47, 0, 63, 0},
              std::array{7, 100, 0, 107, 0}, std::array{16, 200, 0, 216, 0},
              std::array{16, 200, 0, 150, 0}, std::array{16, 200, 150, 210, 0},
              std::array{9, 60, 64, 69, 0}, std::array{3, 10, 20, 40, 0},
              std::array{16, 0, 0, 16, 5}, std::array{16, 47, 0, 63, 7},
              std::array{16, 200, 0, 216, 40}, std::array{16, 200, 150, 210, 20},
              std::array{16, 200, 0, 190, 9}, std::array{9, 60, 64, 69, 3}}) {
          const int stored = first_position + m;
          ScatteredKv kv(dtype, num_kv_heads, head_dim, block_size, stored, rng_);
          const std::vector<float> q = RandomFloats(m * q_dim, rng_, 2.0f);
          const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
          std::vector<float> got(m * q_dim, NAN), got_lse(m * num_heads, NAN);
          backend.causal_attention(q.data(), m, num_heads, kv.view, first_position, context_begin,
                                   context_end, window, scale, got.data(), got_lse.data());
          for (int i = 0; i < m; ++i) {
            const int end = std::max(context_begin, std::min(context_end, first_position + i + 1));
            const int begin =
                window > 0 ? std::min(end, std::max(context_begin, first_position + i + 1 - window))
                           : context_begin;
            std::vector<float> want(q_dim, NAN), want_lse(num_heads, NAN);
            reference::PagedAttentionRange(q.data() + i * q_dim, num_heads, kv.view, begin, end,
                                           scale, 0, num_kv_heads, want.data(), want_lse.data());
            const std::vector<float> row(got.begin() + i * q_dim, got.begin() + (i + 1) * q_dim);
            const std::string where =
                std::string(KvDtypeName(dtype)) + " head_dim=" + std::to_string(head_dim) +
                " group=" + std::to_string(group) + " m=" + std::to_string(m) +
                " first=" + std::to_string(first_position) + " range=[" +
                std::to_string(context_begin) + ", " + std::to_string(context_end) + ") window " +
                std::to_string(window) + " query " + std::to_string(i);
            if (end == begin) {  // nothing to attend: zeros and -inf
              for (float x : row) ASSERT_EQ(x, 0.0f) << where;
              for (int h = 0; h < num_heads; ++h) ASSERT_EQ(got_lse[i * num_heads + h], -INFINITY);
              continue;
            }
            EXPECT_LT(NormalisedError(row, want), Tolerance(dtype, 1e-5)) << where;
            for (int h = 0; h < num_heads; ++h) {
              EXPECT_NEAR(got_lse[i * num_heads + h], want_lse[h],
                          Tolerance(dtype, 1e-4) * (std::fabs(want_lse[h]) + 1))
                  << where << " head " << h;
            }
          }
        }
      }
    }
  }
}

// A query's result does not depend on the block it was computed in: the same query in a block
// of 16, a block of 3 and alone (where its lane in the row vectors differs) is bitwise equal,
// with and without a sliding window (whose queries each start elsewhere).
TEST_P(AttentionTest, QueryBlockRowsAreIndependentOfTheBlock) {
  const Backend& backend = ActiveBackend();
  const int num_heads = 8, num_kv_heads = 2, head_dim = 64, block_size = 16, first = 90;
  const size_t q_dim = static_cast<size_t>(num_heads) * head_dim;
  for (KvDtype dtype : kDtypes) {
    for (int window : {0, 50}) {
      ScatteredKv kv(dtype, num_kv_heads, head_dim, block_size, first + 16, rng_);
      const std::vector<float> q = RandomFloats(16 * q_dim, rng_, 2.0f);
      std::vector<float> block(16 * q_dim, NAN);
      backend.causal_attention(q.data(), 16, num_heads, kv.view, first, 0, first + 16, window,
                               0.125f, block.data(), nullptr);
      std::vector<float> three(3 * q_dim, NAN);
      backend.causal_attention(q.data() + 5 * q_dim, 3, num_heads, kv.view, first + 5, 0, first + 8,
                               window, 0.125f, three.data(), nullptr);
      std::vector<float> alone(q_dim, NAN);
      backend.causal_attention(q.data() + 7 * q_dim, 1, num_heads, kv.view, first + 7, 0, first + 8,
                               window, 0.125f, alone.data(), nullptr);
      for (size_t x = 0; x < 3 * q_dim; ++x) {
        ASSERT_EQ(three[x], block[5 * q_dim + x]) << KvDtypeName(dtype) << " " << x;
      }
      for (size_t x = 0; x < q_dim; ++x) {
        ASSERT_EQ(alone[x], block[7 * q_dim + x]) << KvDtypeName(dtype) << " " << x;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, AttentionTest,
                         ::testing::Values("reference", "avx2", "avx512", "avx512bf16"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// What storing costs: bf16 keeps 8 significant bits; int8 is within half a step (max|x| / 254)
// of each value of its head; an all-zero head stays zero; a head with a NaN reads back as NaN
// without touching the other heads.
TEST(KvFormatTest, StoredValuesAreWithinTheirRoundingBounds) {
  std::mt19937 rng(7);
  const int num_kv_heads = 3, head_dim = 37, block_size = 5;
  const int row = num_kv_heads * head_dim;
  for (KvDtype dtype : kDtypes) {
    std::vector<std::byte> block(KvBlockBytes(dtype, block_size, num_kv_heads, head_dim) + 4);
    auto* aligned =
        reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(block.data()) + 3) / 4 * 4);
    std::vector<float> x = RandomFloats(row, rng, 5.0f);
    std::fill_n(x.begin() + head_dim, head_dim, 0.0f);  // head 1 all zero
    StoreKvToken(x.data(), dtype, block_size, num_kv_heads, head_dim, 3, aligned);
    const int32_t table[] = {0};
    const PagedKv kv{.k = aligned,
                     .v = aligned,
                     .dtype = dtype,
                     .block_size = block_size,
                     .num_kv_heads = num_kv_heads,
                     .head_dim = head_dim,
                     .block_bytes = 0,
                     .block_table = table};
    for (int h = 0; h < num_kv_heads; ++h) {
      std::vector<float> back(head_dim);
      LoadKvRow(kv, false, 3, h, back.data());
      float amax = 0;
      for (int i = 0; i < head_dim; ++i) amax = std::max(amax, std::fabs(x[h * head_dim + i]));
      for (int i = 0; i < head_dim; ++i) {
        const float want = x[h * head_dim + i];
        const float bound = dtype == KvDtype::kF32    ? 0.0f
                            : dtype == KvDtype::kBf16 ? std::fabs(want) * 0x1p-8f
                                                      : amax / 254.0f * 1.0001f;
        ASSERT_LE(std::fabs(back[i] - want), bound)
            << KvDtypeName(dtype) << " head " << h << " value " << i;
      }
    }
    x[2 * head_dim + 4] = NAN;
    StoreKvToken(x.data(), dtype, block_size, num_kv_heads, head_dim, 1, aligned);
    std::vector<float> back(head_dim);
    LoadKvRow(kv, false, 1, 2, back.data());
    EXPECT_TRUE(std::isnan(back[4])) << KvDtypeName(dtype);
    LoadKvRow(kv, false, 1, 0, back.data());
    for (int i = 0; i < head_dim; ++i) ASSERT_FALSE(std::isnan(back[i])) << KvDtypeName(dtype);
  }
}

TEST(KvFormatTest, BlockBytesAndNames) {
  EXPECT_EQ(KvBlockBytes(KvDtype::kF32, 16, 4, 64), 16u * 4 * 64 * 4);
  EXPECT_EQ(KvBlockBytes(KvDtype::kBf16, 16, 4, 64), 16u * 4 * 64 * 2);
  EXPECT_EQ(KvBlockBytes(KvDtype::kInt8, 16, 4, 64), 16u * 4 * 64 + 16 * 4 * 4);
  // Int8 values padded to 4 bytes before the scales.
  EXPECT_EQ(Int8ScalesOffset(5, 1, 33), 168u);
  EXPECT_EQ(KvBlockBytes(KvDtype::kInt8, 5, 1, 33), 168u + 5 * 4);
  for (KvDtype dtype : kDtypes) EXPECT_EQ(*ParseKvDtype(KvDtypeName(dtype)), dtype);
  EXPECT_EQ(*ParseKvDtype("float32"), KvDtype::kF32);
  EXPECT_EQ(ParseKvDtype("fp8").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ParseKvDtype("fp8").status().message().find("fp8"), std::string::npos);
}

}  // namespace
}  // namespace tandem::kernels::cpu
