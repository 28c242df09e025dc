// Decode with host-offloaded experts (issue #7): expert weights (bf16, or int8 / int4 where the
// model is quantized) streamed from a pack file read with O_DIRECT into a resident cache holding
// --cache_fraction of all expert bytes (or --cache_bytes), full width
// vs the tiered mixed width of --plan, each with and without the widest-first overlap, and the
// two equal-bytes baselines at the plan's calibration byte share (every expert narrowed alike;
// adaptive top-k, its mass solved on the prefill's routing), with overlap, side by side in one
// run, next to the fully resident model. Each batch's 128-token contexts are
// prefilled once by the resident full model and every setting decodes from that KV cache in
// turn (two rounds, order rotated).
//
//   build/bin/tandem_expert_stream_bench --model DIR_REORDERED --plan TIER_PLAN
//   build/bin/tandem_expert_stream_bench --model bench/configs/dummy-wide --load_format dummy
//       --trace_model models/tiny-moe --trace_text models/tiny-moe/eval/test.txt --plan PLAN
//
// A dummy model's router is replaced by the routing the --trace_model gave the windows of
// --trace_text (each bench sequence replays one window, position by position; the two models
// must have the same layers and experts), and its decode tokens are forced, since random
// weights predict nothing.
//
// Per setting and batch: decode tokens/s, the step's time, how much of it the forward pass
// waited for loads, the load time the I/O thread spent, the share of it hidden behind compute,
// and the bytes read from the file per step (whole 4 KiB blocks, as O_DIRECT reads them).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "common/engine/forward.h"
#include "common/engine/generator.h"
#include "common/engine/kv_cache.h"
#include "common/engine/model_weights.h"
#include "common/engine/perplexity.h"
#include "common/moe/expert_stream.h"
#include "common/moe/pruning_plan.h"
#include "common/moe/tiers.h"
#include "common/moe/width_baselines.h"
#include "common/util/status.h"

ABSL_FLAG(std::string, model, "", "Model directory (neurons reordered: tandem reorder).");
ABSL_FLAG(std::string, plan, "", "A plan with tiers (tandem tier) for the mixed-width settings.");
ABSL_FLAG(std::string, pack_dir, "build", "Where the expert pack file is written (a disk).");
ABSL_FLAG(double, cache_fraction, 0.25, "Resident expert cache as a share of all expert bytes.");
ABSL_FLAG(int64_t, cache_bytes, 0,
          "Resident expert cache in bytes, instead of --cache_fraction: to compare bf16 and "
          "quantized experts at equal memory.");
ABSL_FLAG(std::string, batches, "1,4,16", "Decode batch sizes.");
ABSL_FLAG(int, steps, 16, "Timed decode steps per setting and batch (over two rounds).");
ABSL_FLAG(int, context, 128, "Tokens of KV each sequence holds when decoding starts.");
ABSL_FLAG(std::string, load_format, "auto", "auto | dummy (random weights of the config's shape).");
ABSL_FLAG(std::string, trace_model, "", "With dummy weights: the model whose routing is replayed.");
ABSL_FLAG(std::string, trace_text, "", "The text the --trace_model's routing is recorded on.");

namespace tandem::moe {
namespace {

using bench::Clock;
using bench::Median;
using bench::Seconds;

// Replays recorded routing: bench sequence s feeds token id s at every position, and at
// position p of layer l gets the router probabilities the recording model had for token p of
// window s (as logits: their logarithms).
// (windows) x (positions) x (layers) x (experts)
using RecordedRouting = std::vector<std::vector<std::vector<std::vector<float>>>>;

class ReplayRouter : public engine::RouterOverride {
 public:
  explicit ReplayRouter(std::shared_ptr<const RecordedRouting> probs) : probs_(std::move(probs)) {}
  void Logits(int layer, int32_t token, int position, absl::Span<float> logits) const override {
    const auto& window = (*probs_)[static_cast<size_t>(token) % probs_->size()];
    const auto& p = window[std::min<size_t>(position, window.size() - 1)][layer];
    for (size_t e = 0; e < logits.size(); ++e) logits[e] = std::log(std::max(p[e], 1e-30f));
  }

 private:
  std::shared_ptr<const RecordedRouting> probs_;  // shared by the routers of a run
};

// The router probabilities of `model_dir` over the first `windows` windows of `text` (by the
// perplexity protocol) of at least `positions` tokens each, [BOS] first.
absl::StatusOr<std::shared_ptr<const RecordedRouting>> RecordRouting(const std::string& model_dir,
                                                                     const std::string& text,
                                                                     int windows, int positions) {
  ASSIGN_OR_RETURN(std::unique_ptr<model::ModelDir> dir, model::ModelDir::Open(model_dir));
  ASSIGN_OR_RETURN(engine::LoadedModel model, engine::LoadModelDir(*dir));
  const model::ModelConfig& c = model.weights->config;
  ASSIGN_OR_RETURN(engine::ProtocolText protocol,
                   engine::ReadProtocolText(*model.tokenizer, text, positions - 1));
  ASSIGN_OR_RETURN(auto pool, engine::KvBlockPool::Create(engine::KvCacheConfigFor(
                                  c, 16, (positions + 15) / 16, kernels::KvDtype::kF32, 1)));
  ASSIGN_OR_RETURN(auto forward, engine::ForwardPass::Create(model.weights.get(), pool.get()));
  auto probs = std::make_shared<RecordedRouting>();
  const int experts = static_cast<int>(c.num_local_experts);
  for (const engine::ProtocolWindow& w : protocol.windows) {
    if (static_cast<int>(probs->size()) == windows) break;
    if (w.size + 1 < positions) continue;
    std::vector<int32_t> input = {model.tokenizer->bos_id()};
    input.insert(input.end(), protocol.scored.begin() + w.begin,
                 protocol.scored.begin() + w.begin + positions - 1);
    engine::BlockTable table;
    RETURN_IF_ERROR(table.Reserve(pool.get(), positions));
    engine::StepInput in{input, 0, &table, engine::LogitRows::kNone};
    std::vector<std::vector<float>> logits;
    engine::RouterTrace trace;
    absl::Status status = forward->Step({&in, 1}, {}, &logits, &trace);
    table.ReleaseAll(pool.get());
    RETURN_IF_ERROR(status);
    std::vector<std::vector<std::vector<float>>> window(positions);
    for (int p = 0; p < positions; ++p) {
      for (size_t l = 0; l < trace.probs.size(); ++l) {
        const float* row = trace.probs[l].data() + static_cast<size_t>(p) * experts;
        window[p].emplace_back(row, row + experts);
      }
    }
    probs->push_back(std::move(window));
  }
  if (static_cast<int>(probs->size()) < windows) {
    return absl::InvalidArgumentError(absl::StrCat(text, " has ", probs->size(), " windows of ",
                                                   positions, " tokens; ", windows, " needed"));
  }
  return probs;
}

int Fail(const absl::Status& status) {
  std::cerr << "tandem_expert_stream_bench: " << status << "\n";
  return 1;
}

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  const std::string plan_path = absl::GetFlag(FLAGS_plan);
  if (dir.empty() || plan_path.empty()) {
    std::cerr << "tandem_expert_stream_bench: --model and --plan are required\n";
    return 2;
  }
  const std::optional<std::vector<int>> parsed = bench::ParseBatches(absl::GetFlag(FLAGS_batches));
  if (!parsed) {
    std::cerr << "tandem_expert_stream_bench: --batches must list positive integers, e.g. 1,4,16\n";
    return 2;
  }
  const std::vector<int>& batches = *parsed;
  auto format = engine::ParseLoadFormat(absl::GetFlag(FLAGS_load_format));
  if (!format.ok()) return Fail(format.status());
  const bool replay = !absl::GetFlag(FLAGS_trace_model).empty();
  if ((*format == engine::LoadFormat::kDummy) != replay) {
    std::cerr << "tandem_expert_stream_bench: dummy weights need --trace_model and --trace_text "
                 "(their random router says nothing), and only they take them\n";
    return 2;
  }
  auto model_dir = model::ModelDir::Open(dir);
  if (!model_dir.ok()) return Fail(model_dir.status());
  auto full = engine::LoadModelWeights(**model_dir, *format);
  if (!full.ok()) return Fail(full.status());
  const model::ModelConfig& c = (*full)->config;
  engine::ExpertMask none;
  none.retained.assign(c.num_hidden_layers, std::vector<bool>(c.num_local_experts, false));
  auto slim = engine::LoadModelWeights(**model_dir, *format, 0, none);
  if (!slim.ok()) return Fail(slim.status());
  auto plan = LoadPlan(plan_path);
  if (!plan.ok()) return Fail(plan.status());
  auto tiers = TierWidthPolicy::Create(*plan, c);
  if (!tiers.ok()) return Fail(tiers.status());
  const std::string pack = absl::GetFlag(FLAGS_pack_dir) + "/expert_stream_bench.pack";
  if (absl::Status s = WriteExpertPack(**full, pack); !s.ok()) return Fail(s);
  // Experts as the pack and the cache hold them: packed bf16, or int8 / int4 with their scales.
  const PackLayout layout = PackLayout::For(c);
  const int64_t expert_bytes =
      c.num_hidden_layers * c.num_local_experts * int64_t{layout.bundles()} * layout.bundle_bytes();
  const int64_t cache_bytes = absl::GetFlag(FLAGS_cache_bytes) > 0
                                  ? absl::GetFlag(FLAGS_cache_bytes)
                                  : static_cast<int64_t>(absl::GetFlag(FLAGS_cache_fraction) *
                                                         static_cast<double>(expert_bytes));
  std::printf(
      "model %s: %.1f MB of %s expert weights; cache %.1f MB (%.0f%%); pack %s (O_DIRECT)\n",
      dir.c_str(), expert_bytes / 1e6, kernels::WeightFormatName(layout.format), cache_bytes / 1e6,
      100.0 * cache_bytes / expert_bytes, pack.c_str());

  // The baselines at the bytes the plan's tiers run on its calibration tokens; a uniform width
  // is whole bundles, as a narrow load reads them.
  const int top_k = static_cast<int>(c.num_experts_per_tok);
  const int inter = static_cast<int>(c.intermediate_size);
  const double plan_share = CalibrationByteShare(*plan, c);
  const int bundle = layout.bundle_neurons();
  UniformWidthPolicy uniform(
      std::max(bundle, static_cast<int>(std::lround(plan_share * inter / bundle)) * bundle), inter);
  std::unique_ptr<AdaptiveTopKPolicy> adaptive;  // once the first prefill's routing is recorded
  RoutingRecorder recorder(nullptr, inter);
  std::printf(
      "plan: %.1f%% of the expert bytes on its calibration tokens; uniform baseline %d of "
      "%d neurons\n",
      100 * plan_share, uniform.width(), inter);

  enum class Widths { kFull, kTiers, kUniform, kAdaptive };
  struct Setting {
    std::string name;
    bool streamed;
    Widths widths;
    bool overlap;
  };
  const std::vector<Setting> settings = {
      {"resident, full width", false, Widths::kFull, false},
      {"streamed, full width, no overlap", true, Widths::kFull, false},
      {"streamed, full width, overlap", true, Widths::kFull, true},
      {"streamed, mixed width, no overlap", true, Widths::kTiers, false},
      {"streamed, mixed width, overlap", true, Widths::kTiers, true},
      {"streamed, uniform width, overlap", true, Widths::kUniform, true},
      {"streamed, adaptive top-k, overlap", true, Widths::kAdaptive, true},
  };
  const int context = absl::GetFlag(FLAGS_context);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int per_seq = (context + steps + 4 + 15) / 16;
  auto pool = engine::KvBlockPool::Create(
      engine::KvCacheConfigFor(c, 16, max_batch * per_seq, kernels::KvDtype::kF32, max_batch));
  if (!pool.ok()) return Fail(pool.status());
  auto resident = engine::ForwardPass::Create(full->get(), pool->get());
  auto streaming = engine::ForwardPass::Create(slim->get(), pool->get());
  if (!resident.ok() || !streaming.ok()) return Fail(absl::InternalError("forward pass"));
  if (replay) {
    auto recorded = RecordRouting(absl::GetFlag(FLAGS_trace_model), absl::GetFlag(FLAGS_trace_text),
                                  max_batch, context + steps + 4);
    if (!recorded.ok()) return Fail(recorded.status());
    for (engine::ForwardPass* f : {resident->get(), streaming->get()}) {
      f->SetRouterOverride(std::make_unique<ReplayRouter>(*recorded));
    }
    std::printf("routing: replayed from %s over %d windows of %s\n",
                absl::GetFlag(FLAGS_trace_model).c_str(), max_batch,
                absl::GetFlag(FLAGS_trace_text).c_str());
  }

  std::printf(
      "\n| batch | setting | tokens/s | vs streamed full, no overlap | step (ms) | waited for "
      "loads "
      "(ms/step) | I/O thread loading (ms/step) | load hidden | MB read per step | cache hits |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  uint64_t rng = 12345;
  auto token = [&] {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int32_t>((rng >> 33) % static_cast<uint64_t>(c.vocab_size));
  };
  for (int batch : batches) {
    std::vector<engine::BlockTable> tables(batch);
    std::vector<std::vector<int32_t>> prompts(batch);
    std::vector<engine::StepInput> inputs;
    for (int s = 0; s < batch; ++s) {
      for (int i = 0; i < context; ++i) prompts[s].push_back(replay ? s : token());
      if (!tables[s].Reserve(pool->get(), context + steps + 4).ok()) {
        return Fail(absl::ResourceExhaustedError("KV pool"));
      }
      inputs.push_back({prompts[s], 0, &tables[s]});
    }
    std::vector<std::vector<float>> logits;
    if (absl::Status s = (*resident)->Step(inputs, {.widths = &recorder}, &logits); !s.ok()) {
      return Fail(s);
    }
    if (adaptive == nullptr) {
      adaptive = std::make_unique<AdaptiveTopKPolicy>(
          AdaptiveMassForShare(recorder.weights(), top_k, plan_share), inter, c.norm_topk_prob);
      std::printf("adaptive top-k baseline: mass %.4f\n", adaptive->mass());
    }
    const auto prefill_logits = logits;

    struct Result {
      std::vector<double> times;
      double waited = 0, loading = 0, hidden = 0;
      int64_t bytes = 0, hits = 0, asks = 0, timed = 0;
    };
    std::vector<Result> results(settings.size());
    const int per_round = std::max(1, steps / 2);
    for (int round = 0; round < 2; ++round) {
      for (size_t j = 0; j < settings.size(); ++j) {
        const size_t k = (j + round) % settings.size();
        const Setting& setting = settings[k];
        // A fresh cache per run: every run starts cold and warms over its untimed steps.
        std::unique_ptr<ExpertBacking> backing;
        std::unique_ptr<ExpertStream> stream;
        if (setting.streamed) {
          auto b = DirectFileBacking(pack);
          if (!b.ok()) return Fail(b.status());
          backing = *std::move(b);
          auto st = ExpertStream::Create(backing.get(), cache_bytes, setting.overlap);
          if (!st.ok()) return Fail(st.status());
          stream = *std::move(st);
          // Replacement by the plan's pair frequencies, as tandem-decode does.
          stream->SetPriorityWeights(CachePriorities(*plan));
        }
        engine::ForwardPass& fwd = setting.streamed ? **streaming : **resident;
        fwd.SetExpertProvider(stream.get());
        const engine::ExpertWidthPolicy* widths =
            setting.widths == Widths::kTiers ? tiers->get()
            : setting.widths == Widths::kUniform
                ? static_cast<const engine::ExpertWidthPolicy*>(&uniform)
            : setting.widths == Widths::kAdaptive ? adaptive.get()
                                                  : nullptr;
        const engine::MoeOptions moe{.widths = widths};
        logits = prefill_logits;
        std::vector<int32_t> next(batch);
        StreamStats before;
        for (int step = 0; step < per_round + 2; ++step) {
          inputs.clear();
          for (int s = 0; s < batch; ++s) {
            next[s] =
                replay ? s
                       : static_cast<int32_t>(std::max_element(logits[s].begin(), logits[s].end()) -
                                              logits[s].begin());
            inputs.push_back({absl::MakeConstSpan(&next[s], 1), context + step, &tables[s]});
          }
          if (step == 2 && stream) before = stream->stats();
          const auto start = Clock::now();
          if (absl::Status s = fwd.Step(inputs, moe, &logits); !s.ok()) return Fail(s);
          if (step >= 2) {
            results[k].times.push_back(Seconds(start, Clock::now()));
          }
        }
        if (stream) {
          const StreamStats after = stream->stats();
          Result& r = results[k];
          r.waited += after.wait_seconds - before.wait_seconds;
          r.loading += after.cache.load_seconds - before.cache.load_seconds;
          r.bytes += after.backing_bytes_read - before.backing_bytes_read;
          r.hits += after.cache.hits - before.cache.hits;
          r.asks += (after.cache.hits + after.cache.misses + after.cache.widenings) -
                    (before.cache.hits + before.cache.misses + before.cache.widenings);
        }
        results[k].timed += per_round;
        fwd.SetExpertProvider(nullptr);
      }
    }
    for (auto& t : tables) t.ReleaseAll(pool->get());
    const double baseline = batch / Median(results[1].times);
    for (size_t k = 0; k < settings.size(); ++k) {
      const Result& r = results[k];
      const double step_s = Median(r.times);
      const double n = static_cast<double>(r.timed);
      const double hidden = r.loading > 0 ? std::max(0.0, r.loading - r.waited) / r.loading : 0;
      std::printf(
          "| %d | %s | %.1f | %.2fx | %.2f | %.2f | %.2f | %.0f%% | %.2f | %s |\n", batch,
          settings[k].name.c_str(), batch / step_s, batch / step_s / baseline, step_s * 1e3,
          r.waited / n * 1e3, r.loading / n * 1e3, 100 * hidden, r.bytes / n / 1e6,
          settings[k].streamed
              ? absl::StrCat(static_cast<int>(100.0 * r.hits / std::max<int64_t>(1, r.asks)), "%")
                    .c_str()
              : "-");
    }
  }
  TierWidthPolicy::Counts counts = (*tiers)->counts();
  std::printf(
      "\nmixed-width pairs over the run: hot %.0f%%, warm %.0f%%, cold %.0f%%; expert "
      "neurons run %.0f%% of full width\n",
      100.0 * counts.hot / counts.total(), 100.0 * counts.warm / counts.total(),
      100.0 * counts.cold / counts.total(), 100.0 * counts.widths().ByteShare(top_k, inter));
  std::printf("expert neurons run over the run: uniform %.0f%%, adaptive top-k %.0f%%\n",
              100 * uniform.counts().ByteShare(top_k, inter),
              adaptive ? 100 * adaptive->counts().ByteShare(top_k, inter) : 0.0);
  std::filesystem::remove(pack);
  return 0;
}

}  // namespace
}  // namespace tandem::moe

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::moe::Run();
}
