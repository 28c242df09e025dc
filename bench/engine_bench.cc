// Whole-step engine benchmark: decode tokens/s at several batch sizes and prefill tokens/s,
// each next to the memory-bandwidth roofline measured in the same run. The roofline of a
// decode step is the bytes of weight matrices it reads (counted by the forward pass: attention,
// router, every (expert, width) group it runs, lm_head) divided by the machine's read
// bandwidth, measured here with STREAM-style loops on all cores (the larger of a read-only
// sum and STREAM triad). KV-cache reads are not in that roofline; the attention table below
// sets them against the same bandwidth.
//
//   build/bin/tandem_engine_bench --model models/tiny-moe
//   build/bin/tandem_engine_bench --model bench/configs/dummy-3b --load_format dummy
//       --routing zipf:1.0   (one line)
//
// A dummy model has random router weights, so it must be given a stated routing (--routing
// uniform or zipf:S); a checkpoint uses its own router unless --routing is set.
//
// --keep M1,M2,... adds pruned decoders side by side with the full one: for each M, the M
// experts per layer that a frequency calibration over --prefill_tokens random tokens routes to
// most (tandem prune --criterion frequency, in place). Each batch's contexts are prefilled once
// by the full model and every setting decodes from that KV cache in turn (the handoff), so the
// settings see the same state and the same machine minutes. Prefill is timed with the full pool
// (as Tandem runs it) and, for contrast, under each mask (conventional pruning).
//
// Long contexts (docs/kv-cache.md): --kv_dtype f32|bf16|int8 stores the KV cache in that dtype,
// and --kv_fill random writes each sequence's first --context positions with random keys and
// values instead of prefilling them (16 x 16k tokens of prefill would take an hour here; a
// decode step's time does not depend on the values). A third table then gives attention's time
// per step against the time its KV bytes take at the measured bandwidth.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/op_timeline.h"
#include "common/engine/forward.h"
#include "common/engine/kv_cache.h"
#include "common/engine/model_weights.h"
#include "common/engine/synthetic_router.h"
#include "common/kernels/cpu/kernels.h"
#include "common/kernels/cpu/thread_pool.h"
#include "common/util/status.h"

ABSL_FLAG(std::string, model, "", "Model directory (config.json, and safetensors unless dummy).");
ABSL_FLAG(std::string, load_format, "auto", "auto | safetensors | dummy (random weights).");
ABSL_FLAG(std::string, routing, "", "uniform | zipf:S; required for dummy weights.");
ABSL_FLAG(std::string, batches, "1,4,16,64", "Decode batch sizes.");
ABSL_FLAG(int, context, 128, "Tokens in each sequence's KV cache when decoding starts.");
ABSL_FLAG(std::string, kv_dtype, "f32", "KV cache dtype: f32, bf16 or int8.");
ABSL_FLAG(std::string, kv_fill, "prefill",
          "How the contexts' KV is made: prefill (one full-model step over random tokens) or "
          "random (random keys and values written straight into the cache).");
ABSL_FLAG(bool, kv_window_rings, true,
          "Sliding-window layers in rings of their window's positions (with whole-context "
          "layers beside them; docs/kv-cache.md); false pages them over the whole context.");
ABSL_FLAG(int, steps, 16, "Timed decode steps per batch size (after 2 untimed).");
ABSL_FLAG(int, prefill_tokens, 512, "Prompt length of the prefill measurement.");
ABSL_FLAG(int, prefill_rounds, 3, "Prefills timed per setting (the median is reported).");
ABSL_FLAG(int, stream_mib, 1024, "Buffer size of the bandwidth measurement.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of dummy weights, routing and token ids.");
ABSL_FLAG(std::string, kernels, "auto",
          "Kernel level: auto (the fastest this CPU has), exact (float32 activations), or a "
          "level's name (reference, avx2, avx512, avx512vnni, avx512bf16).");
ABSL_FLAG(std::string, prefill_contrast, "attention_by_query",
          "The prefill table's last row, for contrast: attention_by_query (the full pool with "
          "attention one query at a time), delta_net_by_token (a hybrid's Gated DeltaNet one "
          "token at a time instead of in chunks of 64), or none.");
ABSL_FLAG(bool, timeline, false,
          "After each batch's decode, --steps more of the full model through a timing backend: "
          "a per-op table (calls, ms and share of a step, the products' weight GB/s).");
ABSL_FLAG(std::string, keep, "",
          "Pruned decoders to compare, as experts retained per layer, e.g. 4,2 (of 8).");

namespace tandem::engine {
namespace {

namespace k = kernels::cpu;
using bench::Clock;
using bench::Median;
using bench::Seconds;

struct Bandwidth {
  double read_gbs = 0;   // sum over one buffer
  double triad_gbs = 0;  // a = b + s * c, 3 buffers counted
};

// Best of 5 passes of each loop, split over the kernels' thread pool as the products are.
Bandwidth MeasureBandwidth(size_t mib) {
  const size_t n = (mib << 20) / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 3.0f);
  k::ThreadPool& pool = k::DefaultThreadPool();
  const int64_t grain = static_cast<int64_t>(n / (4 * pool.num_threads()) + 1);
  Bandwidth best;
  volatile float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<float> partial(pool.num_threads() * 8, 0.0f);
    std::atomic<int> slot{0};
    auto t0 = Clock::now();
    pool.ParallelFor(static_cast<int64_t>(n), grain, [&](int64_t begin, int64_t end) {
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
      int64_t i = begin;
      for (; i + 8 <= end; i += 8) {
        s0 += b[i];
        s1 += b[i + 1];
        s2 += b[i + 2];
        s3 += b[i + 3];
        s4 += b[i + 4];
        s5 += b[i + 5];
        s6 += b[i + 6];
        s7 += b[i + 7];
      }
      for (; i < end; ++i) s0 += b[i];
      partial[slot.fetch_add(1) % partial.size()] += s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    });
    auto t1 = Clock::now();
    sink = sink + std::accumulate(partial.begin(), partial.end(), 0.0f);
    best.read_gbs = std::max(best.read_gbs, n * sizeof(float) / Seconds(t0, t1) / 1e9);
    t0 = Clock::now();
    pool.ParallelFor(static_cast<int64_t>(n), grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) a[i] = b[i] + 0.5f * c[i];
    });
    t1 = Clock::now();
    best.triad_gbs = std::max(best.triad_gbs, 3 * n * sizeof(float) / Seconds(t0, t1) / 1e9);
  }
  sink = sink + a[n / 2];
  return best;
}

// Backend::causal_attention as it ran before blocks of queries (issue #22): one paged_attention
// per query token, each re-reading its prefix. The prefill table sets it beside the blocked
// kernel.
const kernels::Backend* g_per_query_base = nullptr;
void CausalOneQueryAtATime(const float* q, int m, int num_heads, const kernels::PagedKv& kv,
                           int first_position, int context_begin, int context_end, int window,
                           float scale, float* out, float* lse) {
  kernels::CausalAttentionByQuery(g_per_query_base->paged_attention, q, m, num_heads, kv,
                                  first_position, context_begin, context_end, window, scale, out,
                                  lse);
}

// Backend::gated_delta over a prompt as one token at a time: the recurrence decode runs,
// before prompts ran in chunks (issue #33). The prefill table sets it beside the chunked form.
void GatedDeltaByToken(const kernels::GatedDeltaHead& head) {
  kernels::GatedDeltaHead one = head;
  one.m = 1;
  for (int t = 0; t < head.m; ++t) {
    g_per_query_base->gated_delta(one);
    one.q += one.qk_stride;
    one.k += one.qk_stride;
    one.v += one.v_stride;
    one.g += one.gb_stride;
    one.beta += one.gb_stride;
    one.out += one.out_stride;
  }
}

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) {
    std::cerr << "tandem_engine_bench: --model DIR is required\n";
    return 2;
  }
  auto format = ParseLoadFormat(absl::GetFlag(FLAGS_load_format));
  if (!format.ok()) {
    std::cerr << "tandem_engine_bench: " << format.status().message() << "\n";
    return 2;
  }
  if (!k::SetKernelIsa(absl::GetFlag(FLAGS_kernels))) {
    std::cerr << "tandem_engine_bench: --kernels=" << absl::GetFlag(FLAGS_kernels)
              << " is not a kernel level this CPU can run (" << k::KernelIsaNames() << ")\n";
    return 2;
  }
  const std::string routing = absl::GetFlag(FLAGS_routing);
  if (*format == LoadFormat::kDummy && routing.empty()) {
    std::cerr << "tandem_engine_bench: dummy weights need --routing (uniform or zipf:S): their "
                 "random router says nothing about real routing\n";
    return 2;
  }
  const std::optional<std::vector<int>> parsed = bench::ParseBatches(absl::GetFlag(FLAGS_batches));
  if (!parsed) {
    std::cerr << "tandem_engine_bench: --batches must list positive integers, e.g. 1,4,16\n";
    return 2;
  }
  const std::vector<int>& batches = *parsed;
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const int context = absl::GetFlag(FLAGS_context);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int prefill_tokens = absl::GetFlag(FLAGS_prefill_tokens);

  auto t0 = Clock::now();
  auto model_dir = model::ModelDir::Open(dir);
  auto weights = model_dir.ok() ? LoadModelWeights(**model_dir, *format, seed)
                                : absl::StatusOr<std::unique_ptr<ModelWeights>>(model_dir.status());
  if (!weights.ok()) {
    std::cerr << "tandem_engine_bench: " << weights.status() << "\n";
    return 1;
  }
  const model::ModelConfig& c = (*weights)->config;
  const double load_s = Seconds(t0, Clock::now());
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int block_size = 16;
  const int seq_blocks =
      (std::max(context + steps + 2, prefill_tokens) + block_size - 1) / block_size;
  const absl::StatusOr<kernels::KvDtype> kv_dtype =
      kernels::ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype));
  const std::string kv_fill = absl::GetFlag(FLAGS_kv_fill);
  if (!kv_dtype.ok() || (kv_fill != "prefill" && kv_fill != "random")) {
    std::cerr << "tandem_engine_bench: --kv_dtype must be f32, bf16 or int8 and --kv_fill "
                 "prefill or random\n";
    return 2;
  }
  const bool recurrent = c.RecurrentStateBytes() > 0;
  if (recurrent && kv_fill != "prefill") {
    std::cerr << "tandem_engine_bench: a model with recurrent layers needs --kv_fill=prefill "
                 "(the prefill also makes their state)\n";
    return 2;
  }
  auto pool =
      KvBlockPool::Create(KvCacheConfigFor(c, block_size, max_batch * seq_blocks, *kv_dtype,
                                           max_batch + 1, absl::GetFlag(FLAGS_kv_window_rings)));
  if (!pool.ok()) {
    std::cerr << "tandem_engine_bench: " << pool.status() << "\n";
    return 1;
  }
  // A forward pass over the weights and pool on `backend` (null: the level in use), routed as
  // --routing says.
  auto make_pass =
      [&](const kernels::Backend* backend) -> absl::StatusOr<std::unique_ptr<ForwardPass>> {
    ASSIGN_OR_RETURN(std::unique_ptr<ForwardPass> pass,
                     ForwardPass::Create(weights->get(), pool->get(), backend));
    if (!routing.empty()) {
      ASSIGN_OR_RETURN(std::unique_ptr<ZipfRouter> router,
                       ZipfRouter::FromSpec(routing, static_cast<int>(c.num_hidden_layers),
                                            static_cast<int>(c.num_local_experts), seed));
      pass->SetRouterOverride(std::move(router));
    }
    return pass;
  };
  auto forward = make_pass(nullptr);
  if (!forward.ok()) {
    std::cerr << "tandem_engine_bench: " << forward.status().message() << "\n";
    return forward.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  ForwardPass& fwd = **forward;
  g_per_query_base = &k::ActiveBackend();
  static kernels::Backend per_query_backend = k::ActiveBackend();
  const std::string contrast = absl::GetFlag(FLAGS_prefill_contrast);
  if (contrast == "attention_by_query") {
    per_query_backend.causal_attention = CausalOneQueryAtATime;
  } else if (contrast == "delta_net_by_token") {
    per_query_backend.gated_delta = GatedDeltaByToken;
  } else if (contrast != "none") {
    std::cerr << "tandem_engine_bench: --prefill_contrast=" << contrast
              << " is not attention_by_query, delta_net_by_token or none\n";
    return 2;
  }
  auto per_query = make_pass(&per_query_backend);
  if (!per_query.ok()) {
    std::cerr << "tandem_engine_bench: " << per_query.status() << "\n";
    return 1;
  }

  // Bytes of the weights as held: the embedding (bf16), every packed matrix, norms and biases.
  const int64_t weight_bytes = (*weights)->bytes();
  const model::QuantizationConfig& quant = c.quantization;
  const std::string weight_format =
      quant.bits == 0 ? "bf16"
                      : absl::StrCat("int", quant.bits, " (group ", quant.group_size,
                                     quant.experts ? ", experts" : "",
                                     quant.attention ? ", attention" : "", ")");
  const Bandwidth bw_before = MeasureBandwidth(absl::GetFlag(FLAGS_stream_mib));
  std::printf("model %s (%s), %.2f GB of weights, %s, loaded in %.1f s; kernels %s, %d threads\n",
              dir.c_str(), absl::GetFlag(FLAGS_load_format).c_str(), weight_bytes / 1e9,
              weight_format.c_str(), load_s, k::KernelIsa(), k::DefaultThreadPool().num_threads());
  std::printf("routing: %s\n", routing.empty() ? "the checkpoint's router" : routing.c_str());
  std::printf("KV cache: %s, %.2f GB pool, contexts of %d tokens made by %s\n",
              kernels::KvDtypeName(*kv_dtype), (*pool)->size_bytes() / 1e9, context,
              kv_fill.c_str());
  std::printf("bandwidth (all threads, %d MiB): read %.1f GB/s, triad %.1f GB/s\n",
              absl::GetFlag(FLAGS_stream_mib), bw_before.read_gbs, bw_before.triad_gbs);

  uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;
  std::vector<std::vector<float>> logits;
  auto random_token = [&] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return static_cast<int32_t>(rng % static_cast<uint64_t>(c.vocab_size));
  };

  // The settings: the full pool, then each --keep by calibrated frequency.
  struct Setting {
    std::string name;
    ExpertMask mask;  // empty: every expert
    MoeOptions moe() const { return {.mask = mask.retained.empty() ? nullptr : &mask}; }
  };
  std::vector<Setting> settings(1);
  settings[0].name = absl::StrCat("full (", c.num_local_experts, ")");
  if (const std::string keep = absl::GetFlag(FLAGS_keep); !keep.empty()) {
    std::vector<int> keeps;
    for (absl::string_view part : absl::StrSplit(keep, ',')) {
      int m = 0;
      if (!absl::SimpleAtoi(part, &m) || m < c.num_experts_per_tok || m > c.num_local_experts) {
        std::cerr << "tandem_engine_bench: --keep entry \"" << part << "\" is not in ["
                  << c.num_experts_per_tok << ", " << c.num_local_experts << "]\n";
        return 2;
      }
      keeps.push_back(m);
    }
    std::vector<int32_t> calibration;
    for (int i = 0; i < prefill_tokens; ++i) calibration.push_back(random_token());
    BlockTable table;
    if (!table.Reserve(pool->get(), prefill_tokens).ok()) return 1;
    StepInput in{calibration, 0, &table};
    RouterTrace trace;
    if (absl::Status s = fwd.Step({&in, 1}, {}, &logits, &trace); !s.ok()) {
      std::cerr << "tandem_engine_bench: " << s << "\n";
      return 1;
    }
    table.ReleaseAll(pool->get());
    const int experts = static_cast<int>(c.num_local_experts);
    for (int m : keeps) {
      Setting setting;
      setting.name = absl::StrCat("keep ", m, " (", 100 * m / experts, "%)");
      for (const std::vector<int32_t>& chosen : trace.experts) {
        std::vector<int64_t> frequency(experts, 0);
        for (int32_t e : chosen) ++frequency[e];
        std::vector<int> order(experts);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return frequency[a] > frequency[b]; });
        std::vector<bool> retained(experts, false);
        for (int j = 0; j < m; ++j) retained[order[j]] = true;
        setting.mask.retained.push_back(std::move(retained));
      }
      settings.push_back(std::move(setting));
    }
  }

  // The per-op timeline's pass: the same weights, pool and routing through a timing backend.
  const bool timeline = absl::GetFlag(FLAGS_timeline);
  auto timed_pass = make_pass(&bench::TimedBackend(k::ActiveBackend()));
  if (!timed_pass.ok()) {
    std::cerr << "tandem_engine_bench: " << timed_pass.status() << "\n";
    return 1;
  }
  struct Timeline {
    int batch;
    double step_s;
    double attention_s;              // attention's wall time a step (its ops run in workers)
    std::vector<bench::OpTime> ops;  // totals over `steps` steps
    int steps;
  };
  std::vector<Timeline> timelines;

  struct Row {
    int batch;
    size_t setting;
    double step_ms, tokens_per_s, weight_mb, experts_per_layer, gflops, kv_mb, attention_ms;
    double state_mb;  // recurrent state read and written per step
  };
  std::vector<Row> rows;
  for (int batch : batches) {
    std::vector<BlockTable> tables(batch);
    std::vector<std::vector<int32_t>> prompts(batch);
    std::vector<StepInput> inputs;
    for (int s = 0; s < batch; ++s) {
      for (int i = 0; i < context; ++i) prompts[s].push_back(random_token());
      if (!tables[s].Reserve(pool->get(), context + steps + 2).ok()) {
        std::cerr << "tandem_engine_bench: KV pool too small\n";
        return 1;
      }
      inputs.push_back({prompts[s], 0, &tables[s]});
    }
    if (kv_fill == "prefill") {
      if (absl::Status s = fwd.Step(inputs, {}, &logits); !s.ok()) {
        std::cerr << "tandem_engine_bench: " << s << "\n";
        return 1;
      }
    } else {  // random keys and values in [-2, 2) at every context position; logits all 0
      // The pool's row (a latent attention model's: the latent and the rotary key, keys only).
      const int kv_dim = (*pool)->config().num_kv_heads * (*pool)->config().head_dim;
      std::vector<float> k_row(kv_dim), v_row(kv_dim);
      auto random_value = [&] {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return static_cast<float>(rng >> 40) * (4.0f / (1 << 24)) - 2.0f;
      };
      for (int s = 0; s < batch; ++s) {
        for (int layer = 0; layer < (*pool)->config().num_layers; ++layer) {  // attention's
          const kernels::PagedKvOut out = (*pool)->Writer(layer, tables[s].blocks().data());
          for (int32_t pos = 0; pos < context; ++pos) {
            for (int i = 0; i < kv_dim; ++i) {
              k_row[i] = random_value();
              v_row[i] = random_value();
            }
            k::ActiveBackend().kv_store(out, 1, &pos, k_row.data(), v_row.data());
          }
        }
        tables[s].Append(context);
      }
      logits.assign(batch, std::vector<float>(c.vocab_size, 0.0f));
    }
    const std::vector<std::vector<float>> prefill_logits = logits;
    // A recurrent layer's state moves on with every step: each run starts from the prefill's.
    std::vector<std::vector<std::byte>> prefill_state(batch);
    for (int s = 0; s < batch && recurrent; ++s) {
      const std::byte* slot = (*pool)->state(tables[s].state_slot());
      prefill_state[s].assign(slot, slot + (*pool)->config().state_bytes);
    }
    // Two rounds, the settings' order rotated between them, so that none always runs first
    // after the prefill; each run restarts from the full prefill's KV cache, overwriting the
    // decode positions the previous one wrote, with 2 untimed steps and steps / 2 timed ones.
    constexpr int kRounds = 2;
    const int timed = std::max(1, steps / kRounds);
    std::vector<std::vector<double>> times(settings.size());
    std::vector<double> bytes(settings.size()), runs(settings.size()), flops(settings.size());
    std::vector<double> kv_bytes(settings.size()), attention_s(settings.size());
    std::vector<double> state_bytes(settings.size());
    // Every run of decode steps starts from the prefill's logits and recurrent states (the
    // handoff) and feeds each sequence its greedy token.
    std::vector<int32_t> next(batch);
    auto restore_prefill = [&] {
      logits = prefill_logits;
      for (int s = 0; s < batch && recurrent; ++s) {
        std::copy(prefill_state[s].begin(), prefill_state[s].end(),
                  (*pool)->state(tables[s].state_slot()));
      }
    };
    auto next_inputs = [&](int step) {
      inputs.clear();
      for (int s = 0; s < batch; ++s) {
        const auto& row = logits[s];
        next[s] = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
        inputs.push_back({absl::MakeConstSpan(&next[s], 1), context + step, &tables[s]});
      }
    };
    for (int round = 0; round < kRounds; ++round) {
      for (size_t j = 0; j < settings.size(); ++j) {
        const size_t k = (j + round) % settings.size();
        restore_prefill();
        for (int step = 0; step < timed + 2; ++step) {
          next_inputs(step);
          const auto start = Clock::now();
          if (absl::Status s = fwd.Step(inputs, settings[k].moe(), &logits); !s.ok()) {
            std::cerr << "tandem_engine_bench: " << s << "\n";
            return 1;
          }
          if (step >= 2) {
            times[k].push_back(Seconds(start, Clock::now()));
            bytes[k] += fwd.last_step_stats().weight_bytes;
            runs[k] += fwd.last_step_stats().expert_runs;
            flops[k] += fwd.last_step_stats().matmul_flops;
            kv_bytes[k] += fwd.last_step_stats().kv_bytes;
            attention_s[k] += fwd.last_step_stats().attention_seconds;
            state_bytes[k] += fwd.last_step_stats().state_bytes;
          }
        }
      }
    }
    for (size_t k = 0; k < settings.size(); ++k) {
      const double n = static_cast<double>(times[k].size());
      const double step_s = Median(times[k]);
      rows.push_back({batch, k, step_s * 1e3, batch / step_s, bytes[k] / n / 1e6,
                      runs[k] / n / c.num_hidden_layers, flops[k] / n / step_s / 1e9,
                      kv_bytes[k] / n / 1e6, attention_s[k] / n * 1e3, state_bytes[k] / n / 1e6});
    }
    if (timeline) {  // the full model again, each op timed
      restore_prefill();
      std::vector<double> step_times;
      double attention_wall = 0;
      for (int step = 0; step < steps + 2; ++step) {
        if (step == 2) bench::ResetOpTimes();
        next_inputs(step);
        const auto start = Clock::now();
        if (absl::Status s = (*timed_pass)->Step(inputs, settings[0].moe(), &logits); !s.ok()) {
          std::cerr << "tandem_engine_bench: " << s << "\n";
          return 1;
        }
        if (step >= 2) {
          step_times.push_back(Seconds(start, Clock::now()));
          attention_wall += (*timed_pass)->last_step_stats().attention_seconds;
        }
      }
      double total = 0;
      for (double t : step_times) total += t;
      timelines.push_back({batch, total / steps, attention_wall / steps, bench::OpTimes(), steps});
    }
    for (auto& t : tables) t.ReleaseAll(pool->get());
  }

  // Prefill: one prompt in one step, logits of its last token; the full pool and each mask,
  // and the full pool with attention one query at a time (the last entry), interleaved over
  // --prefill_rounds rounds.
  const size_t prefill_settings = settings.size() + (contrast == "none" ? 0 : 1);
  std::vector<std::vector<double>> prefill_times(prefill_settings);
  std::vector<double> prefill_bytes(prefill_settings), prefill_flops(prefill_settings);
  std::vector<double> prefill_attention_s(prefill_settings);  // the last round's
  {
    std::vector<int32_t> prompt;
    for (int i = 0; i < prefill_tokens; ++i) prompt.push_back(random_token());
    for (int rep = 0; rep < std::max(1, absl::GetFlag(FLAGS_prefill_rounds)); ++rep) {
      for (size_t k = 0; k < prefill_settings; ++k) {
        const bool one_query = k == settings.size();
        ForwardPass& pass = one_query ? **per_query : fwd;
        BlockTable table;
        if (!table.Reserve(pool->get(), prefill_tokens).ok()) return 1;
        StepInput in{prompt, 0, &table};
        const auto start = Clock::now();
        if (absl::Status s = pass.Step({&in, 1}, settings[one_query ? 0 : k].moe(), &logits);
            !s.ok()) {
          std::cerr << "tandem_engine_bench: " << s << "\n";
          return 1;
        }
        prefill_times[k].push_back(Seconds(start, Clock::now()));
        prefill_bytes[k] = pass.last_step_stats().weight_bytes;
        prefill_flops[k] = pass.last_step_stats().matmul_flops;
        prefill_attention_s[k] = pass.last_step_stats().attention_seconds;
        table.ReleaseAll(pool->get());
      }
    }
  }
  const Bandwidth bw_after = MeasureBandwidth(absl::GetFlag(FLAGS_stream_mib));
  const double roofline_gbs =
      std::max({bw_before.read_gbs, bw_before.triad_gbs, bw_after.read_gbs, bw_after.triad_gbs});
  std::printf("bandwidth after: read %.1f GB/s, triad %.1f GB/s; roofline uses %.1f GB/s\n\n",
              bw_after.read_gbs, bw_after.triad_gbs, roofline_gbs);
  // The roofline: the bytes a step must move at the measured bandwidth, the weights read once
  // and, for a recurrent model, every sequence's state read and written once per layer.
  std::printf(
      "| decode batch | experts | step (ms, median of %d) | tokens/s | vs full "
      "| weights read per step (MB) |%s expert groups per layer | matmul GFLOP/s "
      "| roofline tokens/s | of roofline |\n",
      std::max(1, steps / 2) * 2, recurrent ? " state read + written per step (MB) |" : "");
  std::printf("|---|---|---|---|---|---|%s---|---|---|---|\n", recurrent ? "---|" : "");
  double full_tokens_per_s = 0;
  for (const Row& r : rows) {
    if (r.setting == 0) full_tokens_per_s = r.tokens_per_s;
    const double roofline = r.batch / ((r.weight_mb + r.state_mb) * 1e6 / (roofline_gbs * 1e9));
    char state[32] = "";
    if (recurrent) std::snprintf(state, sizeof(state), " %.1f |", r.state_mb);
    std::printf("| %d | %s | %.2f | %.1f | %.2fx | %.1f |%s %.2f | %.1f | %.1f | %.0f%% |\n",
                r.batch, settings[r.setting].name.c_str(), r.step_ms, r.tokens_per_s,
                r.tokens_per_s / full_tokens_per_s, r.weight_mb, state, r.experts_per_layer,
                r.gflops, roofline, 100 * r.tokens_per_s / roofline);
  }
  std::printf(
      "\n| decode batch | context | KV dtype | step (ms) | tokens/s | KV read per step (MB) "
      "| attention (ms, mean) | KV at bandwidth (ms) | attention / floor | attention GB/s |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    if (r.setting != 0) continue;
    const double floor_ms = r.kv_mb * 1e6 / (roofline_gbs * 1e9) * 1e3;
    std::printf("| %d | %d | %s | %.2f | %.1f | %.1f | %.2f | %.2f | %.2fx | %.1f |\n", r.batch,
                context, kernels::KvDtypeName(*kv_dtype), r.step_ms, r.tokens_per_s, r.kv_mb,
                r.attention_ms, floor_ms, r.attention_ms / floor_ms, r.kv_mb / r.attention_ms);
  }
  std::printf(
      "\n| prefill (%d tokens) | ms (median of %zu) | tokens/s | attention (ms) | matmul GFLOP/s "
      "| weights read (MB) | bandwidth floor (ms) |\n|---|---|---|---|---|---|---|\n",
      prefill_tokens, prefill_times[0].size());
  for (size_t k = 0; k < prefill_settings; ++k) {
    const double prefill_s = Median(prefill_times[k]);
    const std::string name =
        k == 0 ? "full pool (Tandem's prefill)"
        : k == settings.size()
            ? (contrast == "attention_by_query" ? "full pool, attention one query at a time"
                                                : "full pool, DeltaNet one token at a time")
            : settings[k].name;
    std::printf("| %s | %.1f | %.0f | %.1f | %.1f | %.1f | %.1f |\n", name.c_str(), prefill_s * 1e3,
                prefill_tokens / prefill_s, prefill_attention_s[k] * 1e3,
                prefill_flops[k] / prefill_s / 1e9, prefill_bytes[k] / 1e6,
                prefill_bytes[k] / (roofline_gbs * 1e9) * 1e3);
  }
  for (const Timeline& t : timelines) {
    std::printf(
        "\nPer-op timeline, decode batch %d, full model: %.2f ms a step (mean of %d, timed)\n\n",
        t.batch, t.step_s * 1e3, t.steps);
    std::printf("| op | calls / step | ms / step | share of step | weight GB/s |\n");
    std::printf("|---|---|---|---|---|\n");
    double on_step_thread = 0;
    for (const bench::OpTime& op : t.ops) {
      const double ms = op.seconds / t.steps * 1e3;
      if (!op.in_workers) on_step_thread += op.seconds / t.steps;
      const std::string gbs =
          op.bytes > 0 ? absl::StrFormat("%.1f", op.bytes / op.seconds / 1e9) : std::string("");
      std::printf("| %s%s | %.1f | %.3f | %.1f%% | %s |\n", op.name.c_str(),
                  op.in_workers ? " (thread time)" : "", static_cast<double>(op.calls) / t.steps,
                  ms, 100 * op.seconds / t.steps / t.step_s, gbs.c_str());
    }
    const double outside = t.step_s - on_step_thread - t.attention_s;
    std::printf("| attention (wall: its ops' items over the threads) | | %.3f | %.1f%% | |\n",
                t.attention_s * 1e3, 100 * t.attention_s / t.step_s);
    std::printf(
        "| outside the ops (engine control; the DeltaNet's workers' wall time) | | %.3f | %.1f%% "
        "| |\n",
        outside * 1e3, 100 * outside / t.step_s);
  }
  return 0;
}

}  // namespace
}  // namespace tandem::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::engine::Run();
}
