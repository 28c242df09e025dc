// Decode and prefill attention over a paged KV cache in any KvDtype, written once over a small
// vector interface `S` and compiled for each instruction set: kernels_avx2.cc and
// kernels_avx512.cc include this file inside their target region and anonymous namespace, after
// defining S (S::Vec, S::kLanes, Zero, Load, Store, Set1, Mul, Sub, Fma, ReduceAdd,
// ReduceLanes, Exp and ConvertRow<dtype>).
//
// The context is walked once, in tiles of kAttentionTile positions (flash attention's online
// softmax), every KV head of the range within each tile, so that memory is read in order (a
// position's KV heads are adjacent): each tile's keys and values are converted to float32 once
// (int8 scales folded in), every query head sharing a KV head scores the tile, and its running
// output is rescaled by exp(old max - new max) before the tile's values are added. Nothing the size
// of the context is held, so a 32k-token context costs no more scratch than a 32-token one; the
// range [context_begin, context_end) and the log-sum-exp output let a caller split a long context
// over threads and merge the parts (flash-decoding). Not a standalone header: the includer has
// already included <algorithm>, <cmath>, <cstring>, <vector> and common/kernels/kv_format.h (this
// file is read inside its namespace).
#pragma once

constexpr int kAttentionTile = 32;
// The most positions a kernel takes as one tile (kernels_avx512.cc's bf16 decode: 64).
constexpr int kMaxAttentionTile = 64;
// Chunks of a head's row kept in registers while values accumulate (AttendTiles).
constexpr int kMaxRegisterChunks = 8;

// Where a context range's positions lie in a paged pool, a tile at a time: Advance(n) gives the
// next n (<= kMaxAttentionTile) positions' slots (bytes from a pool's start, and offsets within
// their blocks) and the slots of the tile after them, for prefetching.
class TileSlots {
 public:
  TileSlots(const PagedKv& kv, size_t row_bytes, int context_begin)
      : kv_(kv),
        row_bytes_(row_bytes),
        block_index_(context_begin / kv.block_size),
        offset_(context_begin % kv.block_size) {}

  void Advance(int n, int n_next) {
    for (int j = 0; j < n; ++j) {
      at[j] = Slot(block_index_, offset_);
      offset[j] = offset_;
      Step(block_index_, offset_);
    }
    int b = block_index_, o = offset_;
    for (int j = 0; j < n_next; ++j) {
      next[j] = Slot(b, o);
      next_offset[j] = o;
      Step(b, o);
    }
  }

  size_t at[kMaxAttentionTile];
  int offset[kMaxAttentionTile];
  size_t next[kMaxAttentionTile];
  int next_offset[kMaxAttentionTile];

 private:
  size_t Slot(int block_index, int offset) const {
    return static_cast<size_t>(kv_.block_table[block_index]) * kv_.block_bytes +
           offset * row_bytes_;
  }
  void Step(int& block_index, int& offset) const {
    if (++offset == kv_.block_size) {
      offset = 0;
      ++block_index;
    }
  }

  const PagedKv& kv_;
  const size_t row_bytes_;
  int block_index_, offset_;
};

// Where the int8 scale of (the position at `slot`, `offset` within its block; `kv_head`) lies,
// from the same pool's start.
inline size_t Int8ScaleAt(const PagedKv& kv, size_t slot, int offset, size_t row_bytes,
                          size_t scales_offset, int kv_head) {
  return slot - offset * row_bytes + scales_offset +
         (static_cast<size_t>(offset) * kv.num_kv_heads + kv_head) * sizeof(float);
}

// Asks for the next tile's K and V rows of a KV head range into L2, a K line and the V line beside
// it a call, in address order: position by position, line by line of the range's part of the row
// (and, kScales, an int8 cache's scale lines as a position's first lines are asked for). A decode
// kernel reads its tile one KV head at a time, key rows then value rows; asked for in that order,
// the next tile's lines came from DRAM at 12.6 GB/s on one thread of an Intel Xeon, against 18.5 in
// address order with the reads unchanged (two threads: 25.3 against 35.7 GB/s; a 4k-position bf16
// cache of the dummy-3b layout): pages read along their rows keep the hardware's streams going. The
// kernel calls One() about as often as the tile has lines of a pool to ask for (the avx512bf16
// kernel over bf16: half a pair per key or value line it reads; the others a pair per value line),
// so that the asking is spread evenly over its arithmetic: a whole tile's prefetches in one burst
// hold the core until the memory queue drains, and memory and arithmetic then add up rather than
// overlap (measured: a bf16 decode query over 4k positions read 8-10 GB/s of KV on one thread with
// the burst, 11-12 with the spread; tandem_kernels_bench --benchmark_filter=Attention). Into L2
// rather than L1 (T1, not T0; the likely reason: a tile's lines outnumber L1's few miss buffers,
// which a T0 prefetch waits for) (measured on Zen 4, DRAM, five interleaved rounds: 1.85x faster at
// avx512bf16 over bf16, 1.25x over int8, 1.52x at avx512 over f32, 1.68x at avx2 over bf16). Past
// the tile's last line One() does nothing.
template <bool kScales>
class NextTileLines {
 public:
  // `first`, `bytes`: the range's part of a row; `scales_offset`: an int8 pool's scales.
  NextTileLines(const PagedKv& kv, const TileSlots& slots, int n_next, size_t first, size_t bytes,
                size_t row_bytes, size_t scales_offset, int kv_head_begin)
      : kv_(kv),
        slots_(slots),
        n_next_(n_next),
        first_(first),
        lines_(static_cast<int>((bytes + 63) / 64)),
        row_bytes_(row_bytes),
        scales_offset_(scales_offset),
        kv_head_begin_(kv_head_begin) {
    if (n_next_ > 0) StartRow();
  }

  void One() {
    if (j_ == n_next_) return;
    _mm_prefetch(reinterpret_cast<const char*>(kv_.k + at_), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(kv_.v + at_), _MM_HINT_T1);
    at_ += 64;
    if (--left_ == 0 && ++j_ < n_next_) StartRow();
  }

 private:
  void StartRow() {
    at_ = slots_.next[j_] + first_;
    left_ = lines_;
    if constexpr (kScales) {
      const size_t at = Int8ScaleAt(kv_, slots_.next[j_], slots_.next_offset[j_], row_bytes_,
                                    scales_offset_, kv_head_begin_);
      if (at / 64 != last_scale_line_) {
        last_scale_line_ = at / 64;
        _mm_prefetch(reinterpret_cast<const char*>(kv_.k + at), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(kv_.v + at), _MM_HINT_T1);
      }
    }
  }

  const PagedKv& kv_;
  const TileSlots& slots_;
  const int n_next_;
  const size_t first_;
  const int lines_;
  const size_t row_bytes_, scales_offset_;
  const int kv_head_begin_;
  int j_ = 0, left_ = 0;
  size_t at_ = 0;
  size_t last_scale_line_ = SIZE_MAX;
};

// Prefetches `bytes` at `within` of `slot` of one pool (`pool`: kv.k or kv.v) into L2: a
// tile's first rows, which nothing asked for ahead.
inline void PrefetchPoolSlot(const std::byte* pool, size_t slot, size_t within, size_t bytes) {
  for (size_t line = 0; line < bytes; line += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(pool + slot + within + line), _MM_HINT_T1);
  }
}

// Prefetches `bytes` of K and V at `within` of each of `slots`' first `n` slots into L2, for a
// kernel that reuses each tile many times (the prefill blocks): its arithmetic, not memory,
// sets its pace.
inline void PrefetchRows(const PagedKv& kv, const size_t* slots, int n, size_t within,
                         size_t bytes) {
  for (int j = 0; j < n; ++j) {
    for (size_t line = 0; line < bytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(kv.k + slots[j] + within + line), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(kv.v + slots[j] + within + line), _MM_HINT_T1);
    }
  }
}

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
  const int first_head = kv_head_begin * group;
  const int heads = (kv_head_end - kv_head_begin) * group;  // query heads in the range
  const size_t row_bytes = static_cast<size_t>(kv.num_kv_heads) * hd * kValueBytes;
  const size_t scales_offset =
      D == KvDtype::kInt8 ? Int8ScalesOffset(kv.block_size, kv.num_kv_heads, hd) : 0;
  // Lines of a position's row of one KV head: as many line pairs of the next tile are asked for
  // each time a value row of this one is summed.
  const int row_lines = static_cast<int>((hd * kValueBytes + 63) / 64);
  float* o = out + static_cast<size_t>(first_head) * hd;
  if (context_begin >= context_end) {
    std::fill(o, o + static_cast<size_t>(heads) * hd, 0.0f);
    if (lse != nullptr) std::fill(lse + first_head, lse + first_head + heads, -INFINITY);
    return;
  }

  thread_local std::vector<float> scratch;
  const size_t need = static_cast<size_t>(padded) * (2 * heads + 2 * kAttentionTile) +
                      static_cast<size_t>(group) * kAttentionTile + 3 * heads + L;
  if (scratch.size() < need) scratch.resize(need);
  float* qs = scratch.data();                                         // (heads, padded), scaled
  float* acc = qs + static_cast<size_t>(heads) * padded;              // (heads, padded)
  float* kt = acc + static_cast<size_t>(heads) * padded;              // (tile, padded)
  float* vt = kt + static_cast<size_t>(kAttentionTile) * padded;      // (tile, padded)
  float* scores = vt + static_cast<size_t>(kAttentionTile) * padded;  // (group, tile)
  float* running_max = scores + static_cast<size_t>(group) * kAttentionTile;  // (heads,)
  float* running_sum = running_max + heads;                                   // (heads,)
  float* alphas = running_sum + heads;  // (heads,): each head's rescaling of this tile

  for (int h = 0; h < heads; ++h) {
    const float* qh = q + static_cast<size_t>(first_head + h) * hd;
    float* qh_scaled = qs + static_cast<size_t>(h) * padded;
    for (int i = 0; i < hd; ++i) qh_scaled[i] = qh[i] * scale;
    std::fill(qh_scaled + hd, qh_scaled + padded, 0.0f);
    std::fill(acc + static_cast<size_t>(h) * padded, acc + static_cast<size_t>(h + 1) * padded,
              0.0f);
    running_max[h] = -INFINITY;
    running_sum[h] = 0;
  }
  // Each tile position's key and value row as float32: converted into kt / vt, or (float32
  // pools) in the pool itself. Rows past a short tile's end keep pointing at scratch.
  const float* krow[kAttentionTile];
  const float* vrow[kAttentionTile];
  for (int j = 0; j < kAttentionTile; ++j) {
    krow[j] = kt + static_cast<size_t>(j) * padded;
    vrow[j] = vt + static_cast<size_t>(j) * padded;
  }
  TileSlots slots(kv, row_bytes, context_begin);
  for (int t0 = context_begin; t0 < context_end; t0 += kAttentionTile) {
    const int n = std::min(kAttentionTile, context_end - t0);
    // The next tile's rows are asked for while the values accumulate, as many line pairs a
    // position as its row of the KV head has, in address order (NextTileLines).
    const int n_next = std::clamp(context_end - t0 - kAttentionTile, 0, kAttentionTile);
    slots.Advance(n, n_next);
    NextTileLines<D == KvDtype::kInt8> ahead(
        kv, slots, n_next, static_cast<size_t>(kv_head_begin) * hd * kValueBytes,
        static_cast<size_t>(kv_head_end - kv_head_begin) * hd * kValueBytes, row_bytes,
        scales_offset, kv_head_begin);
    for (int kv_head = kv_head_begin; kv_head < kv_head_end; ++kv_head) {
      const int h0 = (kv_head - kv_head_begin) * group;  // this KV head's first query head
      const size_t within = static_cast<size_t>(kv_head) * hd * kValueBytes;
      for (int j = 0; j < n; ++j) {
        const size_t at = slots.at[j] + within;
        if (D == KvDtype::kF32 && hd == padded) {  // float32 rows are read where they lie
          krow[j] = reinterpret_cast<const float*>(kv.k + at);
          vrow[j] = reinterpret_cast<const float*>(kv.v + at);
          continue;
        }
        float k_scale = 1, v_scale = 1;
        if constexpr (D == KvDtype::kInt8) {
          const size_t scale_at =
              Int8ScaleAt(kv, slots.at[j], slots.offset[j], row_bytes, scales_offset, kv_head);
          std::memcpy(&k_scale, kv.k + scale_at, sizeof(float));
          std::memcpy(&v_scale, kv.v + scale_at, sizeof(float));
        }
        S::template ConvertRow<D>(kv.k + at, k_scale, hd, padded,
                                  kt + static_cast<size_t>(j) * padded);
        S::template ConvertRow<D>(kv.v + at, v_scale, hd, padded,
                                  vt + static_cast<size_t>(j) * padded);
      }
      for (int g = 0; g < group; ++g) {
        const float* qg = qs + static_cast<size_t>(h0 + g) * padded;
        float* s = scores + static_cast<size_t>(g) * kAttentionTile;
        // L positions at a time: L partial sums, then one transposing reduction gives their L
        // scores in one vector (rows past n hold stale values; their scores are overwritten).
        for (int j0 = 0; j0 < n; j0 += L) {
          Vec a[L];
          for (int j = 0; j < L; ++j) a[j] = S::Zero();
          for (int c = 0; c < padded; c += L) {
            const Vec qc = S::Load(qg + c);
            for (int j = 0; j < L; ++j) a[j] = S::Fma(qc, S::Load(krow[j0 + j] + c), a[j]);
          }
          S::Store(s + j0, S::ReduceLanes(a));
        }
        float tile_max = -INFINITY;
        for (int j = 0; j < n; ++j) tile_max = std::max(tile_max, s[j]);
        const int h = h0 + g;
        const float new_max = std::max(running_max[h], tile_max);
        if (new_max == -INFINITY) {  // every score so far -inf: nothing to add
          std::fill(s, s + kAttentionTile, 0.0f);
          alphas[h] = 1;
          continue;
        }
        alphas[h] = std::exp(running_max[h] - new_max);
        std::fill(s + n, s + kAttentionTile, -INFINITY);
        float tile_sum = 0;
        for (int j = 0; j < kAttentionTile; j += L) {
          const Vec p = S::Exp(S::Sub(S::Load(s + j), S::Set1(new_max)));
          S::Store(s + j, p);
          tile_sum += S::ReduceAdd(p);
        }
        running_sum[h] = running_sum[h] * alphas[h] + tile_sum;
        running_max[h] = new_max;
      }
      // acc = acc * alpha + p @ V, two query heads at a time over every chunk of the row, so
      // that 2 * chunks independent accumulators hide the multiply-add latency and each value
      // row is loaded once for both heads.
      const int chunks = padded / L;
      for (int g = 0; g < group; g += 2) {
        const bool pair = g + 1 < group;
        const int h = h0 + g;
        float* a0p = acc + static_cast<size_t>(h) * padded;
        float* a1p = pair ? a0p + padded : a0p;
        const float* p0 = scores + static_cast<size_t>(g) * kAttentionTile;
        const float* p1 = pair ? p0 + kAttentionTile : p0;
        if (chunks <= kMaxRegisterChunks) {
          Vec a0[kMaxRegisterChunks], a1[kMaxRegisterChunks];
          for (int c = 0; c < chunks; ++c) {
            a0[c] = S::Mul(S::Load(a0p + c * L), S::Set1(alphas[h]));
            a1[c] = S::Mul(S::Load(a1p + c * L), S::Set1(pair ? alphas[h + 1] : 1.0f));
          }
          for (int j = 0; j < n; ++j) {
            if (g == 0) {
              for (int l = 0; l < row_lines; ++l) ahead.One();
            }
            const Vec w0 = S::Set1(p0[j]), w1 = S::Set1(p1[j]);
            const float* vj = vrow[j];
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
          for (int k = 0; k < (pair ? 2 : 1); ++k) {
            float* ag = k == 0 ? a0p : a1p;
            const float* pg = k == 0 ? p0 : p1;
            if (g == 0 && k == 0) {
              for (int l = 0; l < n * row_lines; ++l) ahead.One();
            }
            for (int c = 0; c < padded; c += L) {
              Vec a = S::Mul(S::Load(ag + c), S::Set1(alphas[h + k]));
              for (int j = 0; j < n; ++j) a = S::Fma(S::Set1(pg[j]), S::Load(vrow[j] + c), a);
              S::Store(ag + c, a);
            }
          }
        }
      }
    }
  }
  for (int h = 0; h < heads; ++h) {
    const float* ah = acc + static_cast<size_t>(h) * padded;
    const float inverse = 1.0f / running_sum[h];
    for (int i = 0; i < hd; ++i) o[static_cast<size_t>(h) * hd + i] = ah[i] * inverse;
    if (lse != nullptr) lse[first_head + h] = running_max[h] + std::log(running_sum[h]);
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
