// CPU kernel microbenchmarks. MatMulBf16 reports the weight traffic (2 bytes per weight per
// call) as bytes/s, to compare with the machine's memory bandwidth: for small b the product is
// memory-bound, so the dispatched kernel should come close to it. Each call reads a different
// copy of the weights from a 256 MiB pool, so they come from DRAM, as in decoding. Rates are
// per wall-clock second; ReadBandwidth gives the memory roofline under the same conditions.
//
//   build/bin/tandem_kernels_bench --benchmark_min_time=0.1 --benchmark_filter=MatMulBf16
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/engine/sampling.h"
#include "common/kernels/cpu/kernels.h"

namespace tandem::kernels::cpu {
namespace {

constexpr size_t kWeightPoolElements = (size_t{256} << 20) / sizeof(uint16_t);

// Random bf16 weights of magnitude around 0.01-1, shared by all benchmarks.
const std::vector<uint16_t>& WeightPool() {
  static const std::vector<uint16_t>* const pool = [] {
    auto* weights = new std::vector<uint16_t>(kWeightPoolElements);
    uint64_t state = 0x9e3779b97f4a7c15u;
    for (uint16_t& w : *weights) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      // Sign and mantissa random, exponent in [2^-7, 2^0).
      w = static_cast<uint16_t>((state & 0x807f) | ((120 + (state >> 8) % 7) << 7));
    }
    return weights;
  }();
  return *pool;
}

// `impl`: "fast" (the dispatched kernels, as chosen for this CPU), "reference", or an ISA
// name forced with SetKernelIsaForTesting.
void BM_MatMulBf16(benchmark::State& state, const std::string& impl) {
  const int d = static_cast<int>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const int b = static_cast<int>(state.range(2));
  const bool reference = impl == "reference";
  if (!reference && !SetKernelIsaForTesting(impl == "fast" ? nullptr : impl.c_str())) {
    state.SkipWithError("this CPU cannot run these kernels");
    return;
  }
  const std::vector<uint16_t>& pool = WeightPool();
  const size_t matrix = size_t{1} * d * n;
  const size_t copies = std::max<size_t>(1, pool.size() / matrix);
  std::vector<float> x(size_t{1} * b * n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.125f - 1.0f;
  std::vector<float> y(size_t{1} * b * d);

  size_t call = 0;
  for (auto _ : state) {
    const uint16_t* w = pool.data() + (call++ % copies) * matrix;
    if (reference) {
      reference::MatMulBf16(x.data(), b, n, w, d, y.data());
    } else {
      MatMulBf16(x.data(), b, n, w, d, y.data());
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * matrix * sizeof(uint16_t)));
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(matrix) * b * static_cast<double>(state.iterations()) * 1e-9,
      benchmark::Counter::kIsRate);
  state.SetLabel(reference ? "reference" : KernelIsa());
  SetKernelIsaForTesting(nullptr);
}

// The roofline under the machine's current load: summing the same amount of weight memory,
// from the same rotating pool, with plain 64-bit loads (one thread).
void BM_ReadBandwidth(benchmark::State& state) {
  const std::vector<uint16_t>& pool = WeightPool();
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

void BM_ComputeLogprobs(benchmark::State& state) {
  const std::vector<float> logits = Logits(state.range(0));
  const int top = static_cast<int>(state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(engine::ComputeLogprobs(logits, 7, top));
}

void RegisterBenchmarks() {
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
  }
  for (const char* impl : {"fast", "reference", "avx2", "avx512bf16"}) {
    for (const auto& shape : shapes) {
      for (int64_t b : {1, 4, 16}) {
        benchmark::RegisterBenchmark((std::string("MatMulBf16/") + impl).c_str(), BM_MatMulBf16,
                                     std::string(impl))
            ->Args({shape[0], shape[1], b})
            ->ArgNames({"d", "n", "b"})
            // Wall time: the kernels use several threads.
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
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
