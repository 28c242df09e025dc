// CPU kernel microbenchmarks. Linear reports the weight traffic (the packed matrix's bytes per
// call) as bytes/s, to compare with the machine's memory bandwidth: for small b the product is
// memory-bound, so the dispatched kernel should come close to it. Each call reads a different
// copy of the weights from a 256 MiB pool, so they come from DRAM, as in decoding. Rates are
// per wall-clock second; ReadBandwidth gives the memory roofline under the same conditions.
// Pools are in huge pages, as the engine's weights; Linear/<format>/fast_4k_pages (batch 1)
// reads its weights through 4 KiB pages, to show what huge pages are worth. ExpertCopy is the
// copy an expert cache miss makes from an expert pack held in host memory (moe::HostBacking),
// its source in huge pages or in 4 KiB pages.
//
//   build/bin/tandem_kernels_bench --benchmark_min_time=0.1 --benchmark_filter=Linear/bf16
#include <benchmark/benchmark.h>

#include <sys/mman.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/engine/sampling.h"
#include "common/kernels/cpu/amx_tiles.h"
#include "common/kernels/cpu/kernels.h"
#include "common/kernels/cpu/thread_pool.h"
#include "common/kernels/kv_format.h"
#include "common/util/huge_pages.h"

namespace tandem::kernels::cpu {
namespace {

constexpr size_t kWeightPoolElements = (size_t{256} << 20) / sizeof(uint16_t);

uint64_t XorShift(uint64_t& state) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}

// Random bf16 weights of magnitude around 0.01-1, shared by all benchmarks; in huge pages as
// the engine's weights are, since the read loops over them are the roofline.
using WeightPoolVector = std::vector<uint16_t, util::HugePageAllocator<uint16_t>>;
const WeightPoolVector& WeightPool() {
  static const WeightPoolVector* const pool = [] {
    auto* weights = new WeightPoolVector(kWeightPoolElements);
    uint64_t state = 0x9e3779b97f4a7c15u;
    for (uint16_t& w : *weights) {
      const uint64_t r = XorShift(state);
      // Sign and mantissa random, exponent in [2^-7, 2^0).
      w = static_cast<uint16_t>((r & 0x807f) | ((120 + (r >> 8) % 7) << 7));
    }
    return weights;
  }();
  return *pool;
}

// `bytes` zeroed bytes in huge pages, as the engine's weights, or with `small_pages` in 4 KiB
// pages (what a buffer from plain malloc gets), to show what they cost.
using PoolBytes = std::vector<std::byte, util::HugePageAllocator<std::byte>>;
PoolBytes MakePoolBytes(size_t bytes, bool small_pages) {
  PoolBytes pool;
  pool.reserve(bytes);  // allocated, not yet touched
  if (small_pages) madvise(pool.data(), pool.capacity() / 4096 * 4096, MADV_NOHUGEPAGE);
  pool.resize(bytes);
  return pool;
}

// Copies of one packed matrix shape filling about 256 MiB, so that successive calls read
// different copies from DRAM, as decoding does: bf16 from the pool above; int8 / int4 with
// random levels and scales of 0.01. In huge pages, or in 4 KiB ones (MakePoolBytes).
struct PackedPool {
  PanelLayout layout;
  size_t copies = 0;
  PoolBytes bytes;
  PackedMatrix view(size_t call) const {
    return View(layout, bytes.data() + (call % copies) * layout.bytes());
  }
};

PackedPool MakePackedPool(WeightFormat format, int d, int n, bool small_pages) {
  PackedPool pool;
  pool.layout = {format, d, n, format == WeightFormat::kBf16 ? 0 : 32};
  pool.copies = std::max<size_t>(1, (size_t{256} << 20) / pool.layout.bytes());
  pool.bytes = MakePoolBytes(pool.copies * pool.layout.bytes(), small_pages);
  if (format == WeightFormat::kBf16) {
    const WeightPoolVector& weights = WeightPool();
    for (size_t c = 0; c < pool.copies; ++c) {
      PackBf16(weights.data() + (c * size_t{1} * d * n) % (weights.size() - size_t{1} * d * n), n,
               pool.layout, pool.bytes.data() + c * pool.layout.bytes());
    }
    return pool;
  }
  uint64_t state = 0x2545f4914f6cdd1du;
  for (std::byte& b : pool.bytes) b = static_cast<std::byte>(XorShift(state));
  const uint16_t scale = F32ToF16(0.01f);
  for (size_t c = 0; c < pool.copies; ++c) {
    for (int p = 0; p < pool.layout.panels(); ++p) {
      std::byte* scales = pool.bytes.data() + c * pool.layout.bytes() +
                          p * pool.layout.panel_bytes() + pool.layout.scale_offset();
      for (int i = 0; i < pool.layout.groups() * kPanelRows; ++i) {
        std::memcpy(scales + 2 * i, &scale, 2);
      }
    }
  }
  return pool;
}

// MakePackedPool's pool, kept while the benchmarks ask for the same one (google benchmark runs
// a benchmark's function several times to size its iterations): one shape at a time, 256 MiB.
const PackedPool& CachedPackedPool(WeightFormat format, int d, int n, bool small_pages) {
  using PoolKey = std::tuple<WeightFormat, int, int, bool>;
  static std::map<PoolKey, PackedPool>* pools = new std::map<PoolKey, PackedPool>();
  auto it = pools->find({format, d, n, small_pages});
  if (it == pools->end()) {
    pools->clear();
    it =
        pools
            ->emplace(PoolKey{format, d, n, small_pages}, MakePackedPool(format, d, n, small_pages))
            .first;
  }
  return it->second;
}

// Y (b, d) = X (b, n) @ W^T, W (d, n) packed in `format`. `impl`: "fast" (the level chosen for
// this CPU), "fast_4k_pages" (the same over weights in 4 KiB pages), or a level's name. Bytes
// are the packed weights' (scales included).
void BM_Linear(benchmark::State& state, const std::string& impl, WeightFormat format) {
  const bool small_pages = impl == "fast_4k_pages";
  const int d = static_cast<int>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const int b = static_cast<int>(state.range(2));
  const std::string previous = KernelIsa();
  if (!SetKernelIsa(impl == "fast" || small_pages ? "auto" : impl)) {
    state.SkipWithError("this CPU cannot run these kernels");
    return;
  }
  const PackedPool& pool = CachedPackedPool(format, d, n, small_pages);
  std::vector<float> x(size_t{1} * b * n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.125f - 1.0f;
  std::vector<float> y(size_t{1} * b * d);

  size_t call = 0;
  for (auto _ : state) {
    const PackedMatrix w = pool.view(call++);
    if (impl == "reference") {
      reference::Linear(x.data(), b, w, y.data());
    } else {
      Linear(x.data(), b, w, y.data());
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * pool.layout.bytes()));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * d * n * b * static_cast<double>(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate);
  state.SetLabel(KernelIsa());
  SetKernelIsa(previous);
}

// The roofline under the machine's current load: summing the same amount of weight memory,
// from the same rotating pool, with plain 64-bit loads (one thread).
void BM_ReadBandwidth(benchmark::State& state) {
  const WeightPoolVector& pool = WeightPool();
  const size_t matrix = static_cast<size_t>(state.range(0) * state.range(1));
  const size_t copies = std::max<size_t>(1, pool.size() / matrix);
  const size_t words = matrix * sizeof(uint16_t) / sizeof(uint64_t);
  size_t call = 0;
  for (auto _ : state) {
    const char* bytes = reinterpret_cast<const char*>(pool.data() + (call++ % copies) * matrix);
    uint64_t sum = 0;
    for (size_t i = 0; i < words; ++i) {
      uint64_t word;
      std::memcpy(&word, bytes + i * sizeof(word), sizeof(word));
      sum += word;
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * words * sizeof(uint64_t)));
}

// The same read loop on every thread of the kernels' pool, each summing its share of the
// matrix: the roofline of a product that uses both cores.
void BM_ReadBandwidthAllThreads(benchmark::State& state) {
  const WeightPoolVector& pool = WeightPool();
  const size_t matrix = static_cast<size_t>(state.range(0) * state.range(1));
  const size_t copies = std::max<size_t>(1, pool.size() / matrix);
  const int64_t words = static_cast<int64_t>(matrix * sizeof(uint16_t) / sizeof(uint64_t));
  ThreadPool& threads = DefaultThreadPool();
  size_t call = 0;
  for (auto _ : state) {
    const char* bytes = reinterpret_cast<const char*>(pool.data() + (call++ % copies) * matrix);
    std::atomic<uint64_t> total{0};
    threads.ParallelFor(words, words / threads.num_threads() + 1, [&](int64_t begin, int64_t end) {
      uint64_t sum = 0;
      for (int64_t i = begin; i < end; ++i) {
        uint64_t word;
        std::memcpy(&word, bytes + i * sizeof(word), sizeof(word));
        sum += word;
      }
      total += sum;
    });
    benchmark::DoNotOptimize(total.load());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * words * 8);
}

// A packed matrix's bytes (format, d, n as BM_Linear's, from the same kind of 256 MiB pool) read
// in the order the batch-1 products read them, with none of their arithmetic: both threads, each
// over its share of blocks of four panels, the four panels side by side one 64-byte line at a
// time (one 8-byte load a line). The floor a batch-1 product is measured against
// (docs/benchmarks.md): what its bytes cost in its order.
void BM_ReadPanels(benchmark::State& state, WeightFormat format) {
  const int d = static_cast<int>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const PackedPool& pool = CachedPackedPool(format, d, n, /*small_pages=*/false);
  const int64_t panel_bytes = pool.layout.panel_bytes();
  const int64_t blocks = (pool.layout.panels() + 3) / 4;
  ThreadPool& threads = DefaultThreadPool();
  size_t call = 0;
  for (auto _ : state) {
    const std::byte* bytes = pool.view(call++).data;
    std::atomic<uint64_t> total{0};
    threads.ParallelFor(blocks, (blocks + threads.num_threads() - 1) / threads.num_threads(),
                        [&](int64_t begin, int64_t end) {
                          uint64_t sum = 0;
                          for (int64_t block = begin; block < end; ++block) {
                            const int first = static_cast<int>(4 * block);
                            const int count = std::min(4, pool.layout.panels() - first);
                            for (int64_t line = 0; line < panel_bytes; line += 64) {
                              for (int q = 0; q < count; ++q) {
                                uint64_t word;
                                std::memcpy(&word, bytes + (first + q) * panel_bytes + line,
                                            sizeof(word));
                                sum += word;
                              }
                            }
                          }
                          total += sum;
                        });
    benchmark::DoNotOptimize(total.load());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * pool.layout.bytes()));
}

// An expert's bytes copied from a 256 MiB pool (the expert pack in host memory) into a 64 MiB one
// (the expert cache, in huge pages as the engine's is), a different place of each every call, as
// moe::HostBacking's Read does on a cache miss. `small_pages`: the pack in 4 KiB pages, as a
// plain std::vector gets them. Bytes are the expert's.
void BM_ExpertCopy(benchmark::State& state, bool small_pages) {
  const size_t expert = static_cast<size_t>(state.range(0));
  const PoolBytes pack = MakePoolBytes(size_t{256} << 20, small_pages);
  PoolBytes cache = MakePoolBytes(size_t{64} << 20, /*small_pages=*/false);
  const size_t sources = pack.size() / expert, slots = cache.size() / expert;
  size_t call = 0;
  for (auto _ : state) {
    std::memcpy(cache.data() + (call % slots) * expert, pack.data() + (call % sources) * expert,
                expert);
    ++call;
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * expert));
}

// The log-softmax normaliser over a vocabulary-sized row of logits (once per generated token
// with log-probabilities, and per prompt token when scoring), and the whole of one token's
// log-probabilities with k alternatives.
std::vector<float> Logits(int64_t n) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(n);
  for (float& x : logits) x = normal(rng);
  return logits;
}

void BM_LogSumExp(benchmark::State& state, bool fast) {
  const std::vector<float> logits = Logits(state.range(0));
  const int n = static_cast<int>(logits.size());
  for (auto _ : state) {
    benchmark::DoNotOptimize(fast ? LogSumExp(logits.data(), n)
                                  : reference::LogSumExp(logits.data(), n));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

// Gemma's elementwise ops over `state.range(0)` values (a vocabulary's logits for the soft cap,
// a layer's GeGLU values), at the level in use or the reference level's plain loops.
void BM_GemmaOps(benchmark::State& state, bool soft_cap, bool reference_level) {
  const Backend& backend = reference_level ? *FindBackend("reference") : ActiveBackend();
  std::vector<float> x = Logits(state.range(0)), up = Logits(state.range(0)), out(x.size());
  const int n = static_cast<int>(x.size());
  for (auto _ : state) {
    if (soft_cap) {
      backend.soft_cap(x.data(), n, 30.0f);
    } else {
      backend.gelu_tanh_mul(x.data(), up.data(), n, out.data());
    }
    benchmark::DoNotOptimize(x.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * n);
  state.SetLabel(backend.name);
}

void BM_ComputeLogprobs(benchmark::State& state) {
  const std::vector<float> logits = Logits(state.range(0));
  const int top = static_cast<int>(state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(engine::ComputeLogprobs(logits, 7, top));
}

// Attention of the dummy-3b layout's queries (16 heads over 4 KV heads of 64) over a paged
// cache in `dtype`, on one thread, at the level in use: one decode query (paged_attention) or a
// block of 16 consecutive prompt queries at the end of the context (causal_attention).
// `sequences` 1 reads the same context every call (in cache when it fits: the kernel's
// arithmetic alone); more rotate over that many contexts of ~256 MiB in all (from DRAM, as
// decoding reads them). Reports ns per (query, position, KV head) and the KV bytes per second.
// `walk`: no kernel, only the decode kernels' memory walk over the same cache (WalkKv): what
// its bytes cost in that order with those prefetches, the floor the decode case is measured
// against.
enum class AttentionCase { kDecode, kPrefillBlock, kWalk };

// Reads every K and V row of every KV head of positions [0, context) as the avx512bf16 decode
// kernel does, with none of its arithmetic: tiles of 64 positions, per tile and KV head its K
// rows then its V rows (and an int8 cache's scales), one 8-byte load a 64-byte line, and the
// next tile's lines asked for into L2 as the kernel asks for them (NextTileLines' T1
// prefetches, a K line and the V line beside it at a time, in address order: bf16 half a pair a
// K or V line read, int8 a pair a V line read).
uint64_t WalkKv(const PagedKv& kv, int context) {
  constexpr int kTile = 64;
  const size_t value_bytes = KvValueBytes(kv.dtype);
  const size_t head_bytes = static_cast<size_t>(kv.head_dim) * value_bytes;
  const size_t row_bytes = head_bytes * kv.num_kv_heads;
  const bool int8 = kv.dtype == KvDtype::kInt8;
  const size_t scales = int8 ? Int8ScalesOffset(kv.block_size, kv.num_kv_heads, kv.head_dim) : 0;
  const auto row_at = [&](int p) {
    return static_cast<size_t>(kv.block_table[p / kv.block_size]) * kv.block_bytes +
           static_cast<size_t>(p % kv.block_size) * row_bytes;
  };
  const auto scale_at = [&](int p, int h) {
    return static_cast<size_t>(kv.block_table[p / kv.block_size]) * kv.block_bytes + scales +
           (static_cast<size_t>(p % kv.block_size) * kv.num_kv_heads + h) * sizeof(float);
  };
  const auto read = [](const std::byte* at, size_t bytes) {
    uint64_t sum = 0;
    for (size_t line = 0; line < bytes; line += 64) {
      uint64_t x;
      std::memcpy(&x, at + line, sizeof(x));
      sum += x;
    }
    return sum;
  };
  const auto read_scale = [](const std::byte* at) {
    uint32_t x;
    std::memcpy(&x, at, sizeof(x));
    return x;
  };
  // The next tile's line pairs, position by position (an int8 cache's scale lines with a
  // position's first).
  const size_t row_lines = (row_bytes + 63) / 64, head_lines = (head_bytes + 63) / 64;
  const size_t pairs_a_row = int8 ? head_lines : (head_lines + 1) / 2;
  int next_j = 0;  // the next pair to ask for: position, line of its row
  size_t next_line = 0;
  const auto ask = [&](int next_t0, int n_next) {
    for (size_t i = 0; i < pairs_a_row && next_j < n_next; ++i) {
      const int p = next_t0 + next_j;
      if (int8 && next_line == 0) {
        __builtin_prefetch(kv.k + scale_at(p, 0), 0, 2);
        __builtin_prefetch(kv.v + scale_at(p, 0), 0, 2);
      }
      __builtin_prefetch(kv.k + row_at(p) + 64 * next_line, 0, 2);
      __builtin_prefetch(kv.v + row_at(p) + 64 * next_line, 0, 2);
      if (++next_line == row_lines) {
        next_line = 0;
        ++next_j;
      }
    }
  };
  uint64_t sum = 0;
  for (int t0 = 0; t0 < context; t0 += kTile) {
    const int n = std::min(kTile, context - t0);
    const int n_next = std::clamp(context - t0 - kTile, 0, kTile);
    next_j = 0;
    for (int h = 0; h < kv.num_kv_heads; ++h) {
      const size_t within = static_cast<size_t>(h) * head_bytes;
      for (int j = 0; j < n; ++j) {
        if (!int8) ask(t0 + kTile, n_next);
        sum += read(kv.k + row_at(t0 + j) + within, head_bytes);
        if (int8)
          sum += read_scale(kv.k + scale_at(t0 + j, h)) + read_scale(kv.v + scale_at(t0 + j, h));
      }
      for (int j = 0; j < n; ++j) {
        ask(t0 + kTile, n_next);
        sum += read(kv.v + row_at(t0 + j) + within, head_bytes);
      }
    }
  }
  return sum;
}

void BM_Attention(benchmark::State& state, KvDtype dtype, AttentionCase which) {
  const bool blocked = which == AttentionCase::kPrefillBlock;
  constexpr int kHeads = 16, kKvHeads = 4, kHeadDim = 64, kBlockSize = 16, kQueries = 16;
  const int context = static_cast<int>(state.range(0));
  const bool from_dram = state.range(1) != 0;
  const size_t block_bytes = KvBlockBytes(dtype, kBlockSize, kKvHeads, kHeadDim);
  const int seq_blocks = (context + kBlockSize - 1) / kBlockSize;
  const int sequences =
      from_dram ? std::max<int>(2, (size_t{256} << 20) / (2 * block_bytes * seq_blocks)) : 1;
  // On huge pages, as the engine's KV pool (KvBlockPool::Create) is.
  std::vector<std::byte, util::HugePageAllocator<std::byte>> k(block_bytes * seq_blocks *
                                                               sequences),
      v(k.size());
  std::vector<int32_t> tables(static_cast<size_t>(seq_blocks) * sequences);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(kKvHeads * kHeadDim);
  for (size_t b = 0; b < tables.size(); ++b) {
    for (int o = 0; o < kBlockSize; ++o) {
      for (float& x : row) x = normal(rng);
      StoreKvToken(row.data(), dtype, kBlockSize, kKvHeads, kHeadDim, o,
                   k.data() + b * block_bytes);
      StoreKvToken(row.data(), dtype, kBlockSize, kKvHeads, kHeadDim, o,
                   v.data() + b * block_bytes);
    }
  }
  const int queries = blocked ? kQueries : 1;
  std::vector<float> q(static_cast<size_t>(queries) * kHeads * kHeadDim);
  for (float& x : q) x = normal(rng);
  std::vector<float> out(q.size());
  const Backend& backend = ActiveBackend();
  size_t call = 0;
  for (auto _ : state) {
    const PagedKv kv{.k = k.data(),
                     .v = v.data(),
                     .dtype = dtype,
                     .block_size = kBlockSize,
                     .num_kv_heads = kKvHeads,
                     .head_dim = kHeadDim,
                     .block_bytes = block_bytes,
                     .block_table = tables.data() + (call++ % sequences) * seq_blocks};
    if (which == AttentionCase::kWalk) {
      benchmark::DoNotOptimize(WalkKv(kv, context));
    } else if (blocked) {
      backend.causal_attention(q.data(), queries, kHeads, kv, context - queries, 0, context,
                               /*window=*/0, 0.125f, out.data(), nullptr);
    } else {
      backend.paged_attention(q.data(), kHeads, kv, 0, context, 0.125f, 0, kKvHeads, out.data(),
                              nullptr);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const double pairs = static_cast<double>(state.iterations()) * queries * context * kKvHeads;
  state.counters["ns/pair"] =
      benchmark::Counter(pairs * 1e-9, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetBytesProcessed(static_cast<int64_t>(
      state.iterations() * 2 * KvBlockBytes(dtype, 1, kKvHeads, kHeadDim) * context));
  state.SetLabel(std::string(which == AttentionCase::kWalk ? "no kernel" : ActiveBackend().name) +
                 (from_dram ? ", DRAM" : ", in cache"));
}

#if defined(__x86_64__)
// `count` rounds of four independent tile products (two A tiles by two B tiles, into four C
// tiles of 16 x 16 int32 / float32): TDPBF16PS (bf16) or TDPBSSD, each A row `a_bytes` long
// (the product's depth: a_bytes / 2 bf16 or a_bytes int8 columns); `stored`: each C tile
// stored to memory after its product, as a quantized product's group sums are.
__attribute__((target("amx-tile,amx-int8,amx-bf16"), noinline)) void TileProducts(int64_t count,
                                                                                  bool bf16,
                                                                                  int a_bytes,
                                                                                  bool stored) {
  AmxTileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  for (int t : {2, 3}) config.colsb[t] = static_cast<uint16_t>(a_bytes);
  for (int t : {4, 5}) config.rows[t] = static_cast<uint8_t>(a_bytes / 4);
  // Operands of non-zero values (int8 63, bf16 0.75), in case a unit shortcuts zeros.
  alignas(64) static const std::array<uint8_t, 16 * 64> operands = [] {
    std::array<uint8_t, 16 * 64> bytes;
    bytes.fill(0x3f);
    return bytes;
  }();
  __asm__ volatile("" : : "r"(&config) : "memory");  // see linear_amx.cc's Configure
  _tile_loadconfig(&config);
  _tile_loadd(2, operands.data(), 64);
  _tile_loadd(3, operands.data(), 64);
  _tile_loadd(4, operands.data(), 64);
  _tile_loadd(5, operands.data(), 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(6);
  _tile_zero(7);
  alignas(64) std::byte c[4][16 * 64];
  for (int64_t i = 0; i < count; ++i) {
    if (stored) {
      _tile_dpbssd(0, 2, 4);
      _tile_stored(0, c[0], 64);
      _tile_dpbssd(1, 2, 5);
      _tile_stored(1, c[1], 64);
      _tile_dpbssd(6, 3, 4);
      _tile_stored(6, c[2], 64);
      _tile_dpbssd(7, 3, 5);
      _tile_stored(7, c[3], 64);
    } else if (bf16) {
      _tile_dpbf16ps(0, 2, 4);
      _tile_dpbf16ps(1, 2, 5);
      _tile_dpbf16ps(6, 3, 4);
      _tile_dpbf16ps(7, 3, 5);
    } else {
      _tile_dpbssd(0, 2, 4);
      _tile_dpbssd(1, 2, 5);
      _tile_dpbssd(6, 3, 4);
      _tile_dpbssd(7, 3, 5);
    }
  }
  _tile_stored(0, c[0], 64);
  benchmark::DoNotOptimize(c);
  _tile_release();
}
#endif

// The time of one AMX tile product (16 x 16 outputs) on one thread, by instruction and by the
// bytes of each A row it reads (state.range(0)): TDPBSSD over 32 int8 columns against 64,
// TDPBF16PS over 32 bf16 columns (64 bytes), and TDPBSSD with its C tile stored after each
// product. A quantized product in groups of 32 folds each group's sums apart, so its tile
// products are 32 columns deep and each is followed by a store: docs/benchmarks.md compares
// their time with bf16's. Runs only where the level in use is amx (Linux granted the tiles).
void BM_TileProduct(benchmark::State& state, bool bf16, bool stored) {
  const Backend& backend = ActiveBackend();
  if (std::string(backend.name) != "amx") {
    state.SkipWithError(
        (std::string("needs AMX tiles: this CPU's level is ") + backend.name).c_str());
    return;
  }
#if defined(__x86_64__)
  constexpr int64_t kRounds = 4096;
  const int a_bytes = static_cast<int>(state.range(0));
  for (auto _ : state) TileProducts(kRounds, bf16, a_bytes, stored);
  const double products = static_cast<double>(state.iterations()) * kRounds * 4;
  state.counters["ns/product"] = benchmark::Counter(
      products * 1e-9, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  // Multiply-adds a nanosecond: 16 x 16 outputs, each a_bytes / (2 or 1) columns deep.
  state.counters["macs/ns"] = benchmark::Counter(
      products * 256 * (bf16 ? a_bytes / 2 : a_bytes) * 1e-9, benchmark::Counter::kIsRate);
  state.SetLabel(bf16 ? "TDPBF16PS" : stored ? "TDPBSSD, then TILESTORED" : "TDPBSSD");
#endif
}

// One Gated DeltaNet value head (128 x 128, the published Qwen3.6's) over a prompt of
// state.range(0) tokens on one thread, at the level in use: in one call (chunks of 64, matrix
// products) or one call per token (the recurrence decode runs). Reports tokens per second.
void BM_GatedDelta(benchmark::State& state, bool chunked) {
  constexpr int kDk = 128, kDv = 128;
  const int m = static_cast<int>(state.range(0));
  const int stride = 2 * kDk;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> qk(static_cast<size_t>(m) * stride), v(static_cast<size_t>(m) * kDv);
  std::vector<float> g(m), beta(m), out(v.size()), s(static_cast<size_t>(kDk) * kDv);
  for (float& x : v) x = normal(rng);
  for (int t = 0; t < m; ++t) {
    for (int part = 0; part < 2; ++part) {  // unit rows, as a layer's L2 norm leaves them
      float* x = qk.data() + static_cast<size_t>(t) * stride + part * kDk;
      double sum = 0;
      for (int i = 0; i < kDk; ++i) {
        x[i] = normal(rng);
        sum += double{x[i]} * x[i];
      }
      for (int i = 0; i < kDk; ++i) x[i] /= static_cast<float>(std::sqrt(sum));
    }
    g[t] = -0.5f * unit(rng);
    beta[t] = unit(rng);
  }
  const Backend& backend = ActiveBackend();
  for (auto _ : state) {
    std::fill(s.begin(), s.end(), 0.0f);
    GatedDeltaHead head{.q = qk.data(),
                        .k = qk.data() + kDk,
                        .qk_stride = stride,
                        .v = v.data(),
                        .v_stride = kDv,
                        .g = g.data(),
                        .beta = beta.data(),
                        .gb_stride = 1,
                        .m = m,
                        .dk = kDk,
                        .dv = kDv,
                        .state = s.data(),
                        .out = out.data(),
                        .out_stride = kDv};
    if (chunked) {
      backend.gated_delta(head);
    } else {
      head.m = 1;
      for (int t = 0; t < m; ++t) {
        backend.gated_delta(head);
        head.q += stride;
        head.k += stride;
        head.v += kDv;
        ++head.g;
        ++head.beta;
        head.out += kDv;
      }
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * m);
  state.SetLabel(backend.name);
}

void RegisterBenchmarks() {
  for (bool chunked : {true, false}) {
    benchmark::RegisterBenchmark(chunked ? "GatedDelta/chunked" : "GatedDelta/token_by_token",
                                 BM_GatedDelta, chunked)
        ->Arg(16384)
        ->ArgName("tokens")
        ->Unit(benchmark::kMillisecond);
  }

  benchmark::RegisterBenchmark("TileProduct/int8", BM_TileProduct, /*bf16=*/false,
                               /*stored=*/false)
      ->Arg(32)
      ->Arg(64)
      ->ArgName("a_row_bytes")
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("TileProduct/int8_stored", BM_TileProduct, /*bf16=*/false,
                               /*stored=*/true)
      ->Arg(32)
      ->ArgName("a_row_bytes")
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("TileProduct/bf16", BM_TileProduct, /*bf16=*/true,
                               /*stored=*/false)
      ->Arg(64)
      ->ArgName("a_row_bytes")
      ->Unit(benchmark::kMicrosecond);

  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kBf16, KvDtype::kInt8}) {
    for (const auto& [which, case_name] :
         {std::pair{AttentionCase::kDecode, "/decode"},
          std::pair{AttentionCase::kPrefillBlock, "/prefill_block16"},
          std::pair{AttentionCase::kWalk, "/walk"}}) {
      const std::string name = std::string("Attention/") + KvDtypeName(dtype) + case_name;
      benchmark::RegisterBenchmark(name.c_str(), BM_Attention, dtype, which)
          ->Args({512, 0})
          ->Args({4096, 1})
          ->ArgNames({"context", "dram"})
          ->Unit(benchmark::kMicrosecond);
    }
  }

  for (bool soft_cap : {true, false}) {
    for (bool reference_level : {false, true}) {
      const std::string name = std::string(soft_cap ? "SoftCap/" : "GeluTanhMul/") +
                               (reference_level ? "reference" : "active");
      benchmark::RegisterBenchmark(name.c_str(), BM_GemmaOps, soft_cap, reference_level)
          ->Arg(262144)
          ->ArgName("values")
          ->Unit(benchmark::kMicrosecond);
    }
  }

  for (int64_t vocab : {8192, 32000, 151936}) {
    for (bool fast : {true, false}) {
      benchmark::RegisterBenchmark(fast ? "LogSumExp/fast" : "LogSumExp/reference", BM_LogSumExp,
                                   fast)
          ->Arg(vocab)
          ->ArgName("vocab")
          ->Unit(benchmark::kMicrosecond);
    }
    for (int64_t top : {0, 5, 20}) {
      benchmark::RegisterBenchmark("ComputeLogprobs", BM_ComputeLogprobs)
          ->Args({vocab, top})
          ->ArgNames({"vocab", "top"})
          ->Unit(benchmark::kMicrosecond);
    }
  }
  // (d, n): attention and expert projections of the tiny model, its vocabulary projection,
  // and a Mixtral-sized square matrix.
  const int64_t shapes[][2] = {{384, 192},   {192, 384},   {8192, 192},
                               {4096, 4096}, {3584, 1024}, {1024, 3584}};
  for (const auto& shape : shapes) {
    benchmark::RegisterBenchmark("ReadBandwidth", BM_ReadBandwidth)
        ->Args({shape[0], shape[1]})
        ->ArgNames({"d", "n"})
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("ReadBandwidthAllThreads", BM_ReadBandwidthAllThreads)
        ->Args({shape[0], shape[1]})
        ->ArgNames({"d", "n"})
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kInt8, WeightFormat::kInt4}) {
    const std::string name = std::string("ReadPanels/") + WeightFormatName(format);
    benchmark::RegisterBenchmark(name.c_str(), BM_ReadPanels, format)
        ->Args({3584, 1024})
        ->Args({1024, 3584})
        ->ArgNames({"d", "n"})
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  // An int4 expert matrix of dummy-3b (2.06 MB with its scales) and a bf16 one (7.3 MB).
  for (const bool small_pages : {false, true}) {
    benchmark::RegisterBenchmark(small_pages ? "ExpertCopy/4k_pages" : "ExpertCopy/huge_pages",
                                 BM_ExpertCopy, small_pages)
        ->Arg(2064384)
        ->Arg(7340032)
        ->ArgName("bytes")
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  for (const char* impl : {"fast", "fast_4k_pages", "reference", "avx2", "avx2int8", "avx512",
                           "avx512vnni", "avx512bf16"}) {
    for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kInt8, WeightFormat::kInt4}) {
      for (const auto& shape : shapes) {
        for (int64_t b : {1, 4, 16, 64, 128}) {
          if (std::string(impl) == "fast_4k_pages" && b > 1) continue;  // batch 1 reads most
          if (b == 128 && std::string(impl) != "fast") continue;        // a prompt's chunk
          const std::string name = std::string("Linear/") + WeightFormatName(format) + "/" + impl;
          benchmark::RegisterBenchmark(name.c_str(), BM_Linear, std::string(impl), format)
              ->Args({shape[0], shape[1], b})
              ->ArgNames({"d", "n", "b"})
              // Wall time: the kernels use several threads.
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cpu

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  tandem::kernels::cpu::RegisterBenchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
