// Decode and prefill attention over a paged KV cache in any KvDtype, written once over a small
// vector interface `S` and compiled for each instruction set: kernels_avx2.cc and
// kernels_avx512.cc include this file inside their target region and anonymous namespace, after
// defining S (S::Vec, S::kLanes, Zero, Load, Store, Set1, Mul, Sub, Fma, ReduceAdd,
// ReduceLanes, Exp and ConvertRow<dtype>).
//
// The context is walked once, in tiles of kAttentionTile positions (flash attention's online
// softmax): each tile's keys and values are converted to float32 once (int8 scales folded in),
// every query head sharing the KV head scores the tile, and the running output is rescaled by
// exp(old max - new max) before the tile's values are added. Nothing the size of the context is
// held, so a 32k-token context costs no more scratch than a 32-token one; the range
// [context_begin, context_end) and the log-sum-exp output let a caller split a long context over
// threads and merge the parts (flash-decoding).
// Not a standalone header: the includer has already included <algorithm>, <cmath>, <cstring>,
// <vector> and common/kernels/kv_format.h (this file is read inside its namespace).
#pragma once

constexpr int kAttentionTile = 32;
// Chunks of a head's row kept in registers while values accumulate (AttendTiles).
constexpr int kMaxRegisterChunks = 8;

template <class S, KvDtype D>
void AttendTiles(const float* q, int num_heads, const PagedKv& kv, int context_begin,
                 int context_end, float scale, int kv_head_begin, int kv_head_end, float* out,
                 float* lse) {
  using Vec = typename S::Vec;
  constexpr int L = S::kLanes;
  constexpr size_t kValueBytes = D == KvDtype::kF32 ? 4 : D == KvDtype::kBf16 ? 2 : 1;
  const int hd = kv.head_dim;
  const int group = num_heads / kv.num_kv_heads;
  const int padded = (hd + L - 1) / L * L;
  const size_t row = static_cast<size_t>(kv.num_kv_heads) * hd;
  const size_t scales_offset =
      D == KvDtype::kInt8 ? Int8ScalesOffset(kv.block_size, kv.num_kv_heads, hd) : 0;

  thread_local std::vector<float> scratch;
  const size_t need = static_cast<size_t>(padded) * (2 * group + 2 * kAttentionTile) +
                      static_cast<size_t>(group) * (kAttentionTile + 3) + L;
  if (scratch.size() < need) scratch.resize(need);
  float* qs = scratch.data();                                         // (group, padded), scaled
  float* acc = qs + static_cast<size_t>(group) * padded;              // (group, padded)
  float* kt = acc + static_cast<size_t>(group) * padded;              // (tile, padded)
  float* vt = kt + static_cast<size_t>(kAttentionTile) * padded;      // (tile, padded)
  float* scores = vt + static_cast<size_t>(kAttentionTile) * padded;  // (group, tile)
  float* running_max = scores + static_cast<size_t>(group) * kAttentionTile;
  float* running_sum = running_max + group;
  float* alphas = running_sum + group;  // each head's rescaling of this tile

  for (int kv_head = kv_head_begin; kv_head < kv_head_end; ++kv_head) {
    float* o = out + static_cast<size_t>(kv_head) * group * hd;
    if (context_begin >= context_end) {
      std::fill(o, o + static_cast<size_t>(group) * hd, 0.0f);
      if (lse != nullptr) std::fill(lse + kv_head * group, lse + (kv_head + 1) * group, -INFINITY);
      continue;
    }
    for (int g = 0; g < group; ++g) {
      const float* qh = q + static_cast<size_t>(kv_head * group + g) * hd;
      float* qg = qs + static_cast<size_t>(g) * padded;
      for (int i = 0; i < hd; ++i) qg[i] = qh[i] * scale;
      std::fill(qg + hd, qg + padded, 0.0f);
      std::fill(acc + static_cast<size_t>(g) * padded, acc + static_cast<size_t>(g + 1) * padded,
                0.0f);
      running_max[g] = -INFINITY;
      running_sum[g] = 0;
    }
    int block_index = context_begin / kv.block_size;
    int offset = context_begin % kv.block_size;
    // The next tile's rows are prefetched while this one computes: a KV head's rows lie
    // num_kv_heads rows apart and in blocks scattered over the pool, a pattern the hardware
    // prefetchers do not follow, so without this every row waits for memory.
    int ahead_block = block_index, ahead_offset = offset;
    const auto prefetch = [&](int count) {
      for (int j = 0; j < count; ++j) {
        const size_t block = static_cast<size_t>(kv.block_table[ahead_block]) * kv.block_bytes;
        const size_t first = (ahead_offset * row + static_cast<size_t>(kv_head) * hd) * kValueBytes;
        for (size_t line = 0; line < hd * kValueBytes; line += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(kv.k + block + first + line), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(kv.v + block + first + line), _MM_HINT_T0);
        }
        if constexpr (D == KvDtype::kInt8) {
          const size_t at =
              scales_offset + (static_cast<size_t>(ahead_offset) * kv.num_kv_heads + kv_head) * 4;
          _mm_prefetch(reinterpret_cast<const char*>(kv.k + block + at), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(kv.v + block + at), _MM_HINT_T0);
        }
        if (++ahead_offset == kv.block_size) {
          ahead_offset = 0;
          ++ahead_block;
        }
      }
    };
    prefetch(std::min(kAttentionTile, context_end - context_begin));
    for (int t0 = context_begin; t0 < context_end; t0 += kAttentionTile) {
      const int n = std::min(kAttentionTile, context_end - t0);
      prefetch(std::clamp(context_end - t0 - kAttentionTile, 0, kAttentionTile));
      for (int j = 0; j < n; ++j) {
        const size_t block = static_cast<size_t>(kv.block_table[block_index]) * kv.block_bytes;
        const size_t first = (offset * row + static_cast<size_t>(kv_head) * hd) * kValueBytes;
        float k_scale = 1, v_scale = 1;
        if constexpr (D == KvDtype::kInt8) {
          const size_t at =
              scales_offset +
              (static_cast<size_t>(offset) * kv.num_kv_heads + kv_head) * sizeof(float);
          std::memcpy(&k_scale, kv.k + block + at, sizeof(float));
          std::memcpy(&v_scale, kv.v + block + at, sizeof(float));
        }
        S::template ConvertRow<D>(kv.k + block + first, k_scale, hd, padded,
                                  kt + static_cast<size_t>(j) * padded);
        S::template ConvertRow<D>(kv.v + block + first, v_scale, hd, padded,
                                  vt + static_cast<size_t>(j) * padded);
        if (++offset == kv.block_size) {
          offset = 0;
          ++block_index;
        }
      }
      for (int g = 0; g < group; ++g) {
        const float* qg = qs + static_cast<size_t>(g) * padded;
        float* s = scores + static_cast<size_t>(g) * kAttentionTile;
        // L positions at a time: L partial sums, then one transposing reduction gives their L
        // scores in one vector (rows past n hold stale values; their scores are overwritten).
        for (int j0 = 0; j0 < n; j0 += L) {
          Vec a[L];
          for (int j = 0; j < L; ++j) a[j] = S::Zero();
          for (int c = 0; c < padded; c += L) {
            const Vec qc = S::Load(qg + c);
            for (int j = 0; j < L; ++j) {
              a[j] = S::Fma(qc, S::Load(kt + static_cast<size_t>(j0 + j) * padded + c), a[j]);
            }
          }
          S::Store(s + j0, S::ReduceLanes(a));
        }
        float tile_max = -INFINITY;
        for (int j = 0; j < n; ++j) tile_max = std::max(tile_max, s[j]);
        const float new_max = std::max(running_max[g], tile_max);
        if (new_max == -INFINITY) {  // every score so far -inf: nothing to add
          std::fill(s, s + kAttentionTile, 0.0f);
          alphas[g] = 1;
          continue;
        }
        alphas[g] = std::exp(running_max[g] - new_max);
        std::fill(s + n, s + kAttentionTile, -INFINITY);
        float tile_sum = 0;
        for (int j = 0; j < kAttentionTile; j += L) {
          const Vec p = S::Exp(S::Sub(S::Load(s + j), S::Set1(new_max)));
          S::Store(s + j, p);
          tile_sum += S::ReduceAdd(p);
        }
        running_sum[g] = running_sum[g] * alphas[g] + tile_sum;
        running_max[g] = new_max;
      }
      // acc = acc * alpha + p @ V, two query heads at a time over every chunk of the row, so
      // that 2 * chunks independent accumulators hide the multiply-add latency and each value
      // row is loaded once for both heads.
      const int chunks = padded / L;
      for (int g = 0; g < group; g += 2) {
        const bool pair = g + 1 < group;
        float* a0p = acc + static_cast<size_t>(g) * padded;
        float* a1p = pair ? a0p + padded : a0p;
        const float* p0 = scores + static_cast<size_t>(g) * kAttentionTile;
        const float* p1 = pair ? p0 + kAttentionTile : p0;
        if (chunks <= kMaxRegisterChunks) {
          Vec a0[kMaxRegisterChunks], a1[kMaxRegisterChunks];
          for (int c = 0; c < chunks; ++c) {
            a0[c] = S::Mul(S::Load(a0p + c * L), S::Set1(alphas[g]));
            a1[c] = S::Mul(S::Load(a1p + c * L), S::Set1(pair ? alphas[g + 1] : 1.0f));
          }
          for (int j = 0; j < n; ++j) {
            const Vec w0 = S::Set1(p0[j]), w1 = S::Set1(p1[j]);
            const float* vj = vt + static_cast<size_t>(j) * padded;
            for (int c = 0; c < chunks; ++c) {
              const Vec v = S::Load(vj + c * L);
              a0[c] = S::Fma(w0, v, a0[c]);
              a1[c] = S::Fma(w1, v, a1[c]);
            }
          }
          for (int c = 0; c < chunks; ++c) {
            S::Store(a0p + c * L, a0[c]);
            if (pair) S::Store(a1p + c * L, a1[c]);
          }
        } else {  // wide heads: one chunk at a time
          for (int h = 0; h < (pair ? 2 : 1); ++h) {
            float* ag = h == 0 ? a0p : a1p;
            const float* pg = h == 0 ? p0 : p1;
            for (int c = 0; c < padded; c += L) {
              Vec a = S::Mul(S::Load(ag + c), S::Set1(alphas[g + h]));
              for (int j = 0; j < n; ++j) {
                a = S::Fma(S::Set1(pg[j]), S::Load(vt + static_cast<size_t>(j) * padded + c), a);
              }
              S::Store(ag + c, a);
            }
          }
        }
      }
    }
    for (int g = 0; g < group; ++g) {
      const float* ag = acc + static_cast<size_t>(g) * padded;
      const float inverse = 1.0f / running_sum[g];
      for (int i = 0; i < hd; ++i) o[static_cast<size_t>(g) * hd + i] = ag[i] * inverse;
      if (lse != nullptr) lse[kv_head * group + g] = running_max[g] + std::log(running_sum[g]);
    }
  }
}

template <class S>
void PagedAttentionTiles(const float* q, int num_heads, const PagedKv& kv, int context_begin,
                         int context_end, float scale, int kv_head_begin, int kv_head_end,
                         float* out, float* lse) {
  switch (kv.dtype) {
    case KvDtype::kF32:
      return AttendTiles<S, KvDtype::kF32>(q, num_heads, kv, context_begin, context_end, scale,
                                           kv_head_begin, kv_head_end, out, lse);
    case KvDtype::kBf16:
      return AttendTiles<S, KvDtype::kBf16>(q, num_heads, kv, context_begin, context_end, scale,
                                            kv_head_begin, kv_head_end, out, lse);
    case KvDtype::kInt8:
      return AttendTiles<S, KvDtype::kInt8>(q, num_heads, kv, context_begin, context_end, scale,
                                            kv_head_begin, kv_head_end, out, lse);
  }
}
