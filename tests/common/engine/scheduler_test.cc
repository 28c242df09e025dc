// Continuous batching on the shipped model: sequences that join and leave between steps,
// prefill in chunks, and are preempted when the KV pool runs dry still produce the PyTorch
// reference's greedy continuations (tests/golden/tiny-moe), and the pool gets every block back.
#include "common/engine/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/util/status.h"
#include "nlohmann/json.hpp"
#include "tests/testing/kernels.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::UseExactKernels();
    const std::string dir = testing::SourceDir() + "/models/tiny-moe";
    auto weights = LoadModelWeights(*testing::OpenModelDir(dir), LoadFormat::kSafetensors);
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = weights->release();
    auto tokenizer = model::Tokenizer::Load(dir);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = tokenizer->release();
    std::ifstream in(testing::SourceDir() + "/tests/golden/tiny-moe/manifest.json");
    manifest_ = new nlohmann::json(nlohmann::json::parse(in, nullptr, false));
    ASSERT_FALSE(manifest_->is_discarded());
  }
  static void TearDownTestSuite() {
    delete weights_;
    delete tokenizer_;
    delete manifest_;
  }

  void SetUp() override {
    ASSERT_TRUE(weights_ != nullptr && tokenizer_ != nullptr) << "the shipped model did not load";
  }

  // A pool of `num_blocks` blocks of 16 tokens and a scheduler over it.
  void Build(int num_blocks, SchedulerConfig config) {
    const auto& c = weights_->config;
    KvCacheConfig kv{static_cast<int>(c.num_hidden_layers), static_cast<int>(c.num_key_value_heads),
                     static_cast<int>(c.head_dim), /*block_size=*/16, num_blocks};
    auto pool = KvBlockPool::Create(kv);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    auto fwd = ForwardPass::Create(weights_, pool_.get());
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    forward_ = *std::move(fwd);
    auto scheduler = Scheduler::Create(forward_.get(), tokenizer_, tokenizer_->eos_id(), config);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = *std::move(scheduler);
  }

  std::vector<int32_t> Prompt(int k) const {
    return (*manifest_)["prompts"][k]["token_ids"].get<std::vector<int32_t>>();
  }
  // The reference's greedy continuation of prompt k, cut to `n` tokens.
  std::vector<int32_t> Greedy(int k, int n) const {
    auto ids = (*manifest_)["prompts"][k]["greedy_token_ids"].get<std::vector<int32_t>>();
    if (static_cast<int>(ids.size()) > n) ids.resize(n);
    return ids;
  }
  static SequenceRequest GreedyRequest(std::vector<int32_t> prompt, int max_tokens) {
    SequenceRequest r;
    r.prompt_ids = std::move(prompt);
    r.params.max_tokens = max_tokens;
    return r;
  }

  struct Result {
    std::vector<int32_t> tokens;
    std::string text;
    FinishReason finish = FinishReason::kNone;
    absl::Status status;
  };

  // Steps until idle (at most `max_steps`), adding `joins[s]` before step s.
  std::map<SequenceId, Result> RunAll(std::map<int, std::vector<SequenceRequest>> joins,
                                      std::vector<SequenceId>* ids, int max_steps = 5000) {
    std::map<SequenceId, Result> results;
    for (int step = 0; step < max_steps; ++step) {
      for (SequenceRequest& r : joins[step]) {
        auto id = scheduler_->Add(std::move(r));
        EXPECT_TRUE(id.ok()) << id.status();
        if (id.ok()) ids->push_back(*id);
      }
      joins.erase(step);
      if (scheduler_->idle() && joins.empty()) break;
      std::vector<SequenceOutput> outputs;
      EXPECT_EQ(scheduler_->Step(&outputs), absl::OkStatus());
      for (SequenceOutput& out : outputs) {
        Result& r = results[out.id];
        EXPECT_EQ(r.finish, FinishReason::kNone) << "output after the finish";
        if (out.token.has_value()) r.tokens.push_back(*out.token);
        r.text += out.text;
        r.finish = out.finish;
        r.status = out.status;
      }
    }
    EXPECT_TRUE(scheduler_->idle());
    return results;
  }

  static ModelWeights* weights_;
  static model::Tokenizer* tokenizer_;
  static nlohmann::json* manifest_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<ForwardPass> forward_;
  std::unique_ptr<Scheduler> scheduler_;
};

ModelWeights* SchedulerTest::weights_ = nullptr;
model::Tokenizer* SchedulerTest::tokenizer_ = nullptr;
nlohmann::json* SchedulerTest::manifest_ = nullptr;

constexpr int kTokens = 24;

TEST_F(SchedulerTest, SequencesJoiningMidFlightGetTheReferenceGreedyTokens) {
  // A 16-token budget: long prompts prefill over several steps, beside running decodes.
  Build(/*num_blocks=*/256, {.max_running = 8, .max_step_tokens = 16});
  std::map<int, std::vector<SequenceRequest>> joins;
  const int num_prompts = static_cast<int>((*manifest_)["prompts"].size());
  for (int k = 0; k < num_prompts; ++k) joins[k * 5].push_back(GreedyRequest(Prompt(k), kTokens));
  std::vector<SequenceId> ids;
  auto results = RunAll(std::move(joins), &ids);
  ASSERT_EQ(static_cast<int>(ids.size()), num_prompts);
  for (int k = 0; k < num_prompts; ++k) {
    const Result& r = results[ids[k]];
    EXPECT_EQ(r.status, absl::OkStatus());
    EXPECT_EQ(r.tokens, Greedy(k, kTokens)) << "prompt " << k;
    EXPECT_NE(r.finish, FinishReason::kNone);
    auto text = tokenizer_->Decode(r.tokens);
    ASSERT_TRUE(text.ok());
    if (r.tokens.back() != tokenizer_->eos_id()) {
      EXPECT_EQ(r.text, *text) << "prompt " << k;
    }
  }
  EXPECT_GT(scheduler_->counters().steps, kTokens);
  EXPECT_EQ(scheduler_->counters().preemptions, 0);
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
}

TEST_F(SchedulerTest, PreemptedSequencesAreRecomputedAndStillMatch) {
  // 20 blocks of 16 tokens cannot hold the eight sequences (about 36 blocks) at once.
  Build(/*num_blocks=*/20, {.max_running = 8, .max_step_tokens = 64});
  std::map<int, std::vector<SequenceRequest>> joins;
  const int num_prompts = static_cast<int>((*manifest_)["prompts"].size());
  for (int k = 0; k < num_prompts; ++k) joins[0].push_back(GreedyRequest(Prompt(k), kTokens));
  std::vector<SequenceId> ids;
  auto results = RunAll(std::move(joins), &ids);
  for (int k = 0; k < num_prompts; ++k) {
    EXPECT_EQ(results[ids[k]].status, absl::OkStatus());
    EXPECT_EQ(results[ids[k]].tokens, Greedy(k, kTokens)) << "prompt " << k;
  }
  EXPECT_GT(scheduler_->counters().preemptions, 0);
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
}

TEST_F(SchedulerTest, SeededSamplingDoesNotDependOnTheBatch) {
  auto sampled = [&](int k, bool crowded) {
    Build(/*num_blocks=*/256, {.max_running = 8, .max_step_tokens = 32});
    std::map<int, std::vector<SequenceRequest>> joins;
    SequenceRequest r = GreedyRequest(Prompt(k), kTokens);
    r.params.temperature = 0.9f;
    r.params.top_p = 0.95f;
    r.params.seed = 1234;
    joins[0].push_back(r);
    if (crowded) {
      for (int other = 0; other < 6; ++other)
        joins[other].push_back(GreedyRequest(Prompt(other), 9));
    }
    std::vector<SequenceId> ids;
    auto results = RunAll(std::move(joins), &ids);
    return results[ids[0]].tokens;
  };
  for (int k : {1, 6}) {
    const auto alone = sampled(k, false);
    EXPECT_EQ(alone.size(), static_cast<size_t>(kTokens));
    EXPECT_EQ(alone, sampled(k, true)) << "prompt " << k;
    EXPECT_NE(alone, Greedy(k, kTokens)) << "sampling at temperature 0.9 should not be greedy";
  }
}

TEST_F(SchedulerTest, FinishReasonsAndStopRules) {
  Build(/*num_blocks=*/64, {.max_running = 4, .max_step_tokens = 64});
  const auto greedy = Greedy(0, kTokens);
  std::map<int, std::vector<SequenceRequest>> joins;
  joins[0].push_back(GreedyRequest(Prompt(0), 5));  // length after 5
  SequenceRequest stop_token = GreedyRequest(Prompt(0), kTokens);
  stop_token.params.stop_token_ids = {greedy[3]};
  joins[0].push_back(stop_token);
  std::vector<SequenceId> ids;
  auto results = RunAll(std::move(joins), &ids);
  EXPECT_EQ(results[ids[0]].finish, FinishReason::kLength);
  EXPECT_EQ(results[ids[0]].tokens, Greedy(0, 5));
  EXPECT_EQ(results[ids[1]].finish, FinishReason::kStop);
  const auto first = std::find(greedy.begin(), greedy.end(), greedy[3]) - greedy.begin();
  EXPECT_EQ(results[ids[1]].tokens, Greedy(0, static_cast<int>(first) + 1));
}

TEST_F(SchedulerTest, CancelFreesTheBlocksAndOthersCarryOn) {
  Build(/*num_blocks=*/64, {.max_running = 4, .max_step_tokens = 64});
  auto a = scheduler_->Add(GreedyRequest(Prompt(2), kTokens));
  auto b = scheduler_->Add(GreedyRequest(Prompt(3), kTokens));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int32_t> b_tokens;
  for (int step = 0; step < 3; ++step) {
    std::vector<SequenceOutput> outputs;
    ASSERT_EQ(scheduler_->Step(&outputs), absl::OkStatus());
    for (const auto& out : outputs) {
      if (out.id == *b && out.token) b_tokens.push_back(*out.token);
    }
  }
  EXPECT_LT(pool_->num_free(), pool_->num_total());
  EXPECT_TRUE(scheduler_->Cancel(*a));
  EXPECT_FALSE(scheduler_->Cancel(*a));
  EXPECT_EQ(scheduler_->num_running(), 1);
  while (!scheduler_->idle()) {
    std::vector<SequenceOutput> outputs;
    ASSERT_EQ(scheduler_->Step(&outputs), absl::OkStatus());
    for (const auto& out : outputs) {
      ASSERT_EQ(out.id, *b);
      if (out.token) b_tokens.push_back(*out.token);
    }
  }
  EXPECT_EQ(b_tokens, Greedy(3, kTokens));
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
}

// Prefills `prompt` on the scheduler's own pool as another engine would have (a transfer
// already landed there), samples the first token with `params`, and hands the sequence over.
absl::StatusOr<SequenceId> HandOver(ForwardPass* forward, Scheduler* scheduler,
                                    const std::vector<int32_t>& prompt,
                                    const SamplingParams& params, int32_t* first) {
  BlockTable table;
  RETURN_IF_ERROR(
      table.Reserve(forward->pool(), static_cast<int>(prompt.size()) + params.max_tokens));
  StepInput in{prompt, 0, &table};
  std::vector<std::vector<float>> logits;
  RETURN_IF_ERROR(forward->Step({&in, 1}, {}, &logits));
  table.Append(static_cast<int>(prompt.size()));
  Sampler sampler(params);
  *first = sampler.Sample(logits[0]);
  SequenceRequest request;
  request.prompt_ids = prompt;
  request.params = params;
  return scheduler->AddPrefilled(std::move(request), std::move(table), *first);
}

TEST_F(SchedulerTest, PrefilledSequencesContinueAsOneProcessWould) {
  Build(/*num_blocks=*/256, {.max_running = 8, .max_step_tokens = 32});
  SamplingParams greedy;
  greedy.max_tokens = kTokens;
  SamplingParams seeded = greedy;
  seeded.temperature = 0.9f;
  seeded.top_p = 0.95f;
  seeded.seed = 77;
  // The single-process reference for the seeded case, through Add.
  std::map<int, std::vector<SequenceRequest>> joins;
  SequenceRequest reference;
  reference.prompt_ids = Prompt(5);
  reference.params = seeded;
  joins[0].push_back(reference);
  std::vector<SequenceId> ref_ids;
  const auto want_seeded = RunAll(std::move(joins), &ref_ids)[ref_ids[0]].tokens;
  ASSERT_EQ(want_seeded.size(), static_cast<size_t>(kTokens));

  int32_t first_greedy = -1, first_seeded = -1;
  auto a = HandOver(forward_.get(), scheduler_.get(), Prompt(2), greedy, &first_greedy);
  auto b = HandOver(forward_.get(), scheduler_.get(), Prompt(5), seeded, &first_seeded);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  std::map<SequenceId, std::vector<int32_t>> got;
  while (!scheduler_->idle()) {
    std::vector<SequenceOutput> outputs;
    ASSERT_EQ(scheduler_->Step(&outputs), absl::OkStatus());
    for (const auto& out : outputs) {
      ASSERT_EQ(out.status, absl::OkStatus());
      if (out.token) got[out.id].push_back(*out.token);
    }
  }
  EXPECT_EQ(got[*a], Greedy(2, kTokens));
  EXPECT_EQ(got[*a].front(), first_greedy);
  EXPECT_EQ(got[*b], want_seeded);
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
}

// Log-probabilities, of the prompt (chunked, batched with another sequence) and of each
// generated token, are the log-softmax of what one forward pass over the whole text gives.
TEST_F(SchedulerTest, LogprobsAreTheForwardPassLogSoftmax) {
  Build(/*num_blocks=*/128, {.max_running = 2, .max_step_tokens = 4});
  const std::vector<int32_t> prompt = Prompt(2);
  const int n = static_cast<int>(prompt.size());
  ASSERT_GT(n, 4);  // the prompt runs in several chunks
  constexpr int kGenerate = 6;
  std::vector<int32_t> all = prompt;
  for (int32_t t : Greedy(2, kGenerate)) all.push_back(t);
  std::vector<std::vector<float>> reference;
  {
    BlockTable table;
    ASSERT_TRUE(table.Reserve(pool_.get(), static_cast<int>(all.size())).ok());
    StepInput in{all, 0, &table, LogitRows::kAll};
    ASSERT_EQ(forward_->Step({&in, 1}, {}, &reference), absl::OkStatus());
    table.ReleaseAll(pool_.get());
  }
  const size_t vocab = weights_->config.vocab_size;
  auto row = [&](int position) {
    return absl::MakeConstSpan(reference[0]).subspan(position * vocab, vocab);
  };

  SequenceRequest scored = GreedyRequest(prompt, kGenerate);
  scored.params.logprobs = 3;
  scored.params.prompt_logprobs = 2;
  ASSERT_TRUE(scheduler_->Add(GreedyRequest(Prompt(5), 10)).ok());  // company in each step
  auto id = scheduler_->Add(scored);
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<SequenceOutput> mine;
  while (!scheduler_->idle()) {
    std::vector<SequenceOutput> outputs;
    ASSERT_EQ(scheduler_->Step(&outputs), absl::OkStatus());
    for (auto& out : outputs) {
      if (out.id == *id) mine.push_back(std::move(out));
    }
  }
  ASSERT_EQ(mine.size(), static_cast<size_t>(kGenerate));
  ASSERT_EQ(mine[0].prompt_logprobs.size(), static_cast<size_t>(n - 1));
  for (int i = 0; i + 1 < n; ++i) {
    const TokenLogprobs want = ComputeLogprobs(row(i), prompt[i + 1], 2);
    const TokenLogprobs& got = mine[0].prompt_logprobs[i];
    EXPECT_EQ(got.token, prompt[i + 1]);
    EXPECT_NEAR(got.logprob, want.logprob, 1e-3) << "prompt token " << i + 1;
    ASSERT_EQ(got.top.size(), 2u);
    EXPECT_EQ(got.top[0].token, want.top[0].token);
  }
  for (int k = 0; k < kGenerate; ++k) {
    ASSERT_TRUE(mine[k].token.has_value() && mine[k].logprobs.has_value());
    EXPECT_EQ(*mine[k].token, all[n + k]);
    const TokenLogprobs want = ComputeLogprobs(row(n - 1 + k), all[n + k], 3);
    EXPECT_NEAR(mine[k].logprobs->logprob, want.logprob, 1e-3) << "generated token " << k;
    ASSERT_EQ(mine[k].logprobs->top.size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(mine[k].logprobs->top[0].token, *mine[k].token);
    if (k > 0) {
      EXPECT_TRUE(mine[k].prompt_logprobs.empty());
    }
  }
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
}

// max_tokens 0 scores the prompt and generates nothing.
TEST_F(SchedulerTest, MaxTokensZeroOnlyScoresThePrompt) {
  Build(/*num_blocks=*/64, {.max_running = 4, .max_step_tokens = 16});
  SequenceRequest request = GreedyRequest(Prompt(1), 0);
  EXPECT_EQ(scheduler_->Add(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.params.prompt_logprobs = 0;
  auto id = scheduler_->Add(request);
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<SequenceOutput> outputs;
  while (!scheduler_->idle()) ASSERT_EQ(scheduler_->Step(&outputs), absl::OkStatus());
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_FALSE(outputs[0].token.has_value());
  EXPECT_EQ(outputs[0].finish, FinishReason::kLength);
  EXPECT_EQ(outputs[0].prompt_logprobs.size(), Prompt(1).size() - 1);
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
}

// A prefilled sequence may be the only one that cannot be recomputed: when the pool runs dry
// the others are preempted, never it.
TEST_F(SchedulerTest, PrefilledSequencesAreNeverPreempted) {
  Build(/*num_blocks=*/14, {.max_running = 8, .max_step_tokens = 64});
  SamplingParams greedy;
  greedy.max_tokens = kTokens;
  int32_t first = -1;
  auto pinned = HandOver(forward_.get(), scheduler_.get(), Prompt(4), greedy, &first);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  std::map<int, std::vector<SequenceRequest>> joins;
  for (int k : {0, 1, 3, 5, 6}) joins[0].push_back(GreedyRequest(Prompt(k), kTokens));
  std::vector<SequenceId> ids;
  auto results = RunAll(std::move(joins), &ids);
  EXPECT_EQ(results[*pinned].tokens, Greedy(4, kTokens));
  int i = 0;
  for (int k : {0, 1, 3, 5, 6}) EXPECT_EQ(results[ids[i++]].tokens, Greedy(k, kTokens)) << k;
  EXPECT_GT(scheduler_->counters().preemptions, 0);
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
}

TEST_F(SchedulerTest, PrefilledTableMustHoldThePrompt) {
  Build(/*num_blocks=*/16, {.max_running = 4, .max_step_tokens = 64});
  BlockTable table;
  ASSERT_TRUE(table.Reserve(pool_.get(), 40).ok());
  table.Append(5);  // holds 5 tokens, the prompt has 8
  SequenceRequest request;
  request.prompt_ids = Prompt(0);
  auto id = scheduler_->AddPrefilled(std::move(request), std::move(table), 7);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_->num_free(), pool_->num_total()) << "a refused table's blocks are released";
}

TEST_F(SchedulerTest, BadRequestsAreInvalidArgumentAndChangeNothing) {
  Build(/*num_blocks=*/4, {.max_running = 4, .max_step_tokens = 64});
  const int vocab = static_cast<int>(weights_->config.vocab_size);
  auto expect_invalid = [&](SequenceRequest r, const std::string& what) {
    auto id = scheduler_->Add(std::move(r));
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(id.status().message()), HasSubstr(what));
  };
  expect_invalid(GreedyRequest({}, 4), "no tokens");
  expect_invalid(GreedyRequest({1, vocab}, 4), "outside the vocabulary");
  expect_invalid(GreedyRequest(std::vector<int32_t>(64, 5), 4), "KV blocks");
  expect_invalid(
      GreedyRequest(std::vector<int32_t>(weights_->config.max_position_embeddings, 5), 4),
      "context length");
  SequenceRequest bad_params = GreedyRequest({1, 5}, 4);
  bad_params.params.temperature = -1;
  expect_invalid(bad_params, "temperature");
  EXPECT_TRUE(scheduler_->idle());

  EXPECT_EQ(Scheduler::Create(forward_.get(), nullptr, 2, {.max_running = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create(forward_.get(), nullptr, 2, {.max_running = 8, .max_step_tokens = 4})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  auto untokenized = Scheduler::Create(forward_.get(), nullptr, 2, {});
  ASSERT_TRUE(untokenized.ok());
  SequenceRequest stop_strings = GreedyRequest({1, 5}, 4);
  stop_strings.params.stop_strings = {"x"};
  auto id = (*untokenized)->Add(stop_strings);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- Prefix cache ----

// Runs `prompts` one after another (each to its end before the next starts) and returns their
// greedy tokens.
std::vector<std::vector<int32_t>> RunEach(SchedulerTest* t, Scheduler* scheduler,
                                          const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& prompt : prompts) {
    SequenceRequest r;
    r.prompt_ids = prompt;
    r.params.max_tokens = kTokens;
    auto id = scheduler->Add(std::move(r));
    EXPECT_TRUE(id.ok()) << id.status();
    std::vector<int32_t> tokens;
    while (!scheduler->idle()) {
      std::vector<SequenceOutput> outputs;
      EXPECT_EQ(scheduler->Step(&outputs), absl::OkStatus());
      for (const auto& o : outputs) {
        EXPECT_EQ(o.status, absl::OkStatus());
        if (o.token) tokens.push_back(*o.token);
      }
    }
    out.push_back(tokens);
  }
  return out;
}

TEST_F(SchedulerTest, PromptsServedFromCachedBlocksMatchComputedFromScratch) {
  // Prompt 7 (201 tokens), the same again, and prompt 7 followed by prompt 0's tokens.
  std::vector<int32_t> extended = Prompt(7);
  for (int32_t t : Prompt(0)) extended.push_back(t);
  const std::vector<std::vector<int32_t>> prompts = {Prompt(7), Prompt(7), extended};
  Build(/*num_blocks=*/128, {.max_running = 4, .max_step_tokens = 64});
  const auto scratch = RunEach(this, scheduler_.get(), prompts);
  EXPECT_EQ(scheduler_->counters().prefix_query_tokens, 0);  // the cache is off

  Build(/*num_blocks=*/128, {.max_running = 4, .max_step_tokens = 64});
  pool_->EnablePrefixCache();
  const auto cached = RunEach(this, scheduler_.get(), prompts);
  EXPECT_EQ(cached, scratch);
  EXPECT_EQ(cached[0], Greedy(7, kTokens));
  const SchedulerCounters& c = scheduler_->counters();
  EXPECT_EQ(c.prefix_query_tokens, 201 + 201 + 209);
  // The repeat takes 12 blocks (192 tokens; token 200 is computed); the extension 12 more
  // (the blocks of generated tokens are not published without cache_generated).
  EXPECT_EQ(c.prefix_hit_tokens, 192 + 192);
  EXPECT_EQ(c.prefill_tokens, 201 + 9 + 17);
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
  EXPECT_EQ(pool_->prefix_cache_stats().cached_blocks,
            pool_->prefix_cache_stats().evictable_blocks);
}

TEST_F(SchedulerTest, GeneratedBlocksAreCachedOnlyWhenDecodeRunsThePrefillExperts) {
  // A multi-turn chat: the second turn resends the first turn's prompt and answer.
  for (bool cache_generated : {false, true}) {
    Build(/*num_blocks=*/128,
          {.max_running = 4, .max_step_tokens = 64, .cache_generated = cache_generated});
    pool_->EnablePrefixCache();
    std::vector<int32_t> turn = Prompt(7);
    const std::vector<int32_t> answer = RunEach(this, scheduler_.get(), {turn})[0];
    ASSERT_EQ(answer.size(), static_cast<size_t>(kTokens));
    turn.insert(turn.end(), answer.begin(), answer.end());  // 225 tokens
    const int64_t hits_before = scheduler_->counters().prefix_hit_tokens;
    RunEach(this, scheduler_.get(), {turn});
    const int64_t hits = scheduler_->counters().prefix_hit_tokens - hits_before;
    // Without: the 12 prompt blocks. With: the KV of every token but the last sampled one
    // (224 tokens: blocks 12 and 13 hold prompt and answer tokens).
    EXPECT_EQ(hits, cache_generated ? 224 : 192) << cache_generated;
  }
}

TEST_F(SchedulerTest, BlocksOfAnotherPrefillSettingAreNeverShared) {
  Build(/*num_blocks=*/128, {.max_running = 4, .max_step_tokens = 64, .prefix_salt = 1});
  pool_->EnablePrefixCache();
  RunEach(this, scheduler_.get(), {Prompt(7)});
  EXPECT_EQ(scheduler_->counters().prefix_hit_tokens, 0);
  // Another scheduler on the same pool, prompts run under another setting (salt 2).
  scheduler_.reset();
  auto other = Scheduler::Create(forward_.get(), tokenizer_, tokenizer_->eos_id(),
                                 {.max_running = 4, .max_step_tokens = 64, .prefix_salt = 2});
  ASSERT_TRUE(other.ok());
  scheduler_ = *std::move(other);
  EXPECT_EQ(RunEach(this, scheduler_.get(), {Prompt(7)})[0], Greedy(7, kTokens));
  EXPECT_EQ(scheduler_->counters().prefix_hit_tokens, 0);
  EXPECT_EQ(pool_->prefix_cache_stats().cached_blocks, 24);  // both settings' 12 blocks
}

TEST_F(SchedulerTest, EvictionUnderPressureNeverTakesABlockInUse) {
  // 24 blocks for eight sequences sharing prompt 7 (13 blocks each when it runs): the cache
  // keeps the shared blocks while they are in use, evicts what is not, and preemptions
  // recompute from whatever is still cached.
  Build(/*num_blocks=*/24, {.max_running = 8, .max_step_tokens = 64});
  pool_->EnablePrefixCache();
  std::map<int, std::vector<SequenceRequest>> joins;
  for (int i = 0; i < 8; ++i) {
    joins[0].push_back(GreedyRequest(Prompt(7), kTokens));
    joins[i * 3].push_back(GreedyRequest(Prompt(i % 7), kTokens));
  }
  std::vector<SequenceId> ids;
  auto results = RunAll(std::move(joins), &ids);
  ASSERT_EQ(ids.size(), 16u);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(results[ids[i]].status, absl::OkStatus());
  }
  for (const SequenceId id : ids) {
    const std::vector<int32_t>& tokens = results[id].tokens;
    bool matched = false;
    for (int k = 0; k < 8; ++k) matched |= tokens == Greedy(k, kTokens);
    EXPECT_TRUE(matched) << "sequence " << static_cast<int64_t>(id);
  }
  EXPECT_GT(scheduler_->counters().prefix_hit_tokens, 0);
  EXPECT_GT(pool_->prefix_cache_stats().evictions, 0);
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
}

TEST_F(SchedulerTest, PromptLogprobsAreComputedNotTakenFromTheCache) {
  Build(/*num_blocks=*/128, {.max_running = 4, .max_step_tokens = 64});
  pool_->EnablePrefixCache();
  RunEach(this, scheduler_.get(), {Prompt(7)});
  SequenceRequest scored = GreedyRequest(Prompt(7), 0);
  scored.params.prompt_logprobs = 0;
  ASSERT_TRUE(scheduler_->Add(std::move(scored)).ok());
  std::vector<TokenLogprobs> prompt_logprobs;
  while (!scheduler_->idle()) {
    std::vector<SequenceOutput> outputs;
    ASSERT_EQ(scheduler_->Step(&outputs), absl::OkStatus());
    for (auto& o : outputs) prompt_logprobs = o.prompt_logprobs;
  }
  EXPECT_EQ(prompt_logprobs.size(), 200u);
  EXPECT_EQ(scheduler_->counters().prefix_hit_tokens, 0);
}

TEST_F(SchedulerTest, PrefillOnlySequencesHandOutTheirPromptKv) {
  Build(/*num_blocks=*/64, {.max_running = 4, .max_step_tokens = 64});
  pool_->EnablePrefixCache();
  for (int k : {7, 2}) {
    SequenceRequest r = GreedyRequest(Prompt(k), kTokens);
    r.prefill_only = true;
    r.params.stop_strings = {"never"};  // the decoder applies them; no tokenizer needed here
    ASSERT_TRUE(scheduler_->Add(std::move(r)).ok());
  }
  std::map<int, std::shared_ptr<const PromptKv>> kv;  // by prompt length
  std::map<int, int32_t> first;
  int steps = 0;
  while (!scheduler_->idle() && steps++ < 100) {
    std::vector<SequenceOutput> outputs;
    ASSERT_EQ(scheduler_->Step(&outputs), absl::OkStatus());
    for (auto& o : outputs) {
      ASSERT_EQ(o.status, absl::OkStatus());
      ASSERT_TRUE(o.token.has_value());
      EXPECT_EQ(o.finish, FinishReason::kLength);
      ASSERT_NE(o.prompt_kv, nullptr);
      const int n = o.prompt_kv->table().num_tokens();
      first[n] = *o.token;
      kv[n] = o.prompt_kv;
    }
  }
  ASSERT_EQ(kv.size(), 2u);
  ASSERT_EQ(kv.count(6), 1u);  // prompt 2
  ASSERT_EQ(kv.count(201), 1u);
  EXPECT_EQ(first[6], Greedy(2, 1)[0]);
  EXPECT_EQ(first[201], Greedy(7, 1)[0]);
  EXPECT_EQ(kv[201]->table().blocks().size(), 13u);
  const int held = pool_->num_total() - pool_->num_free();
  EXPECT_EQ(held, 14);
  kv.clear();  // the last holder lets go: the blocks are back (the 12 published, evictable)
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
  EXPECT_EQ(pool_->prefix_cache_stats().evictable_blocks, 12);
  // A stop string still needs a tokenizer when the sequence generates here.
  SequenceRequest r = GreedyRequest(Prompt(2), kTokens);
  r.params.stop_strings = {"x"};
  Build(/*num_blocks=*/64, {.max_running = 4, .max_step_tokens = 64});
  auto no_tokenizer =
      Scheduler::Create(forward_.get(), nullptr, tokenizer_->eos_id(), {.max_running = 4});
  ASSERT_TRUE(no_tokenizer.ok());
  EXPECT_EQ((*no_tokenizer)->Add(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.prefill_only = true;
  EXPECT_TRUE((*no_tokenizer)->Add(r).ok());
}

}  // namespace
}  // namespace tandem::engine
