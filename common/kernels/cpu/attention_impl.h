// Decode and prefill attention over a paged KV cache in any KvDtype, written once over a small
// vector interface `S` and compiled for each instruction set: kernels_avx2.cc and
// kernels_avx512.cc include this file inside their target region and anonymous namespace, after
// defining S (S::Vec, S::kLanes, Zero, Load, Store, Set1, Mul, Fma, ReduceAdd, Exp and
// ConvertRow<dtype>).
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
                      static_cast<size_t>(group) * (kAttentionTile + 2) + L;
  if (scratch.size() < need) scratch.resize(need);
  float* qs = scratch.data();                                         // (group, padded), scaled
  float* acc = qs + static_cast<size_t>(group) * padded;              // (group, padded)
  float* kt = acc + static_cast<size_t>(group) * padded;              // (tile, padded)
  float* vt = kt + static_cast<size_t>(kAttentionTile) * padded;      // (tile, padded)
  float* scores = vt + static_cast<size_t>(kAttentionTile) * padded;  // (group, tile)
  float* running_max = scores + static_cast<size_t>(group) * kAttentionTile;
  float* running_sum = running_max + group;

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
    for (int t0 = context_begin; t0 < context_end; t0 += kAttentionTile) {
      const int n = std::min(kAttentionTile, context_end - t0);
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
        float tile_max = -INFINITY;
        for (int j = 0; j < n; ++j) {
          const float* kj = kt + static_cast<size_t>(j) * padded;
          Vec a = S::Zero();
          for (int c = 0; c < padded; c += L) a = S::Fma(S::Load(qg + c), S::Load(kj + c), a);
          s[j] = S::ReduceAdd(a);
          tile_max = std::max(tile_max, s[j]);
        }
        const float new_max = std::max(running_max[g], tile_max);
        if (new_max == -INFINITY) continue;  // every score so far -inf: nothing to add
        const float alpha = std::exp(running_max[g] - new_max);
        std::fill(s + n, s + kAttentionTile, -INFINITY);
        float tile_sum = 0;
        for (int j = 0; j < kAttentionTile; j += L) {
          const Vec p = S::Exp(S::Sub(S::Load(s + j), S::Set1(new_max)));
          S::Store(s + j, p);
          tile_sum += S::ReduceAdd(p);
        }
        running_sum[g] = running_sum[g] * alpha + tile_sum;
        running_max[g] = new_max;
        float* ag = acc + static_cast<size_t>(g) * padded;
        for (int c = 0; c < padded; c += L) {
          Vec a = S::Mul(S::Load(ag + c), S::Set1(alpha));
          for (int j = 0; j < n; ++j) {
            a = S::Fma(S::Set1(s[j]), S::Load(vt + static_cast<size_t>(j) * padded + c), a);
          }
          S::Store(ag + c, a);
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
