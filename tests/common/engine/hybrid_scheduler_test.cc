// Continuous batching on a hybrid model (Qwen3.5-MoE: Gated DeltaNet and gated attention, the
// random-weight checkpoint of tests/golden/arch): sequences joining mid-flight, prompts chunked
// beside decode tokens and sequences preempted and recomputed all generate what each generates
// alone: every sequence's DeltaNet state lives in its own state slot, restarts from zero when
// the sequence is recomputed, and goes back to the pool with its blocks; the prefix cache resumes
// a cached prefix from a state snapshot.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "common/engine/forward.h"
#include "common/engine/scheduler.h"
#include "nlohmann/json.hpp"
#include "tests/testing/kernels.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::engine {
namespace {

constexpr int kTokens = 12;

class HybridSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::UseExactKernels();
    const std::string dir = testing::SourceDir() + "/tests/golden/arch/qwen3_5_moe_hybrid";
    auto weights = LoadModelWeights(*testing::OpenModelDir(dir), LoadFormat::kSafetensors);
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = *std::move(weights);
    std::ifstream in(dir + "/golden.json");
    const auto golden = nlohmann::json::parse(in, nullptr, false);
    ASSERT_FALSE(golden.is_discarded());
    const auto ids = golden["token_ids"].get<std::vector<int32_t>>();
    for (int k = 0; k < 6; ++k) {  // prompts of 7 to 47 tokens from the golden sequence
      prompts_.emplace_back(ids.begin() + 10 * k, ids.begin() + 10 * k + 7 + 8 * k);
    }
  }

  // A pool of `num_blocks` blocks of 8 tokens for `max_running` sequences, and a scheduler;
  // with `snapshots`, the prefix cache on, keeping that many state snapshots.
  void Build(int num_blocks, SchedulerConfig config, int snapshots = 0) {
    KvCacheConfig kv = KvCacheConfigFor(weights_->config, 8, num_blocks, kernels::KvDtype::kF32,
                                        config.max_running);
    kv.num_state_snapshots = snapshots;
    auto pool = KvBlockPool::Create(kv);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    if (snapshots > 0) pool_->EnablePrefixCache();
    auto forward = ForwardPass::Create(weights_.get(), pool_.get());
    ASSERT_TRUE(forward.ok()) << forward.status();
    forward_ = *std::move(forward);
    auto scheduler = Scheduler::Create(forward_.get(), nullptr, /*eos_id=*/-1, config);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = *std::move(scheduler);
  }

  // Greedy tokens of each prompt on its own (one sequence at a time).
  std::vector<std::vector<int32_t>> Alone() {
    Build(/*num_blocks=*/64, {.max_running = 1, .max_step_tokens = 64});
    std::vector<std::vector<int32_t>> out;
    for (const auto& prompt : prompts_) out.push_back(Run({{0, {prompt}}})[0]);
    return out;
  }

  // Steps until idle, adding joins[s] before step s; each sequence's tokens, in join order.
  std::vector<std::vector<int32_t>> Run(std::map<int, std::vector<std::vector<int32_t>>> joins) {
    std::vector<SequenceId> ids;
    std::map<SequenceId, std::vector<int32_t>> tokens;
    for (int step = 0; step < 2000; ++step) {
      for (const auto& prompt : joins[step]) {
        SequenceRequest r;
        r.prompt_ids = prompt;
        r.params.max_tokens = kTokens;
        auto id = scheduler_->Add(std::move(r));
        EXPECT_TRUE(id.ok()) << id.status();
        if (id.ok()) ids.push_back(*id);
      }
      joins.erase(step);
      if (scheduler_->idle() && joins.empty()) break;
      std::vector<SequenceOutput> outputs;
      EXPECT_EQ(scheduler_->Step(&outputs), absl::OkStatus());
      for (SequenceOutput& out : outputs) {
        EXPECT_TRUE(out.status.ok()) << out.status;
        if (out.token.has_value()) tokens[out.id].push_back(*out.token);
      }
    }
    std::vector<std::vector<int32_t>> out;
    for (SequenceId id : ids) out.push_back(tokens[id]);
    return out;
  }

  std::unique_ptr<ModelWeights> weights_;
  std::vector<std::vector<int32_t>> prompts_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<ForwardPass> forward_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(HybridSchedulerTest, JoinsChunksAndPreemptionsMatchEachSequenceAlone) {
  const std::vector<std::vector<int32_t>> alone = Alone();
  for (const auto& tokens : alone) ASSERT_EQ(tokens.size(), static_cast<size_t>(kTokens));

  // Joining every other step, prompts chunked 8 tokens a step beside the decodes.
  Build(/*num_blocks=*/64, {.max_running = 4, .max_step_tokens = 8});
  std::map<int, std::vector<std::vector<int32_t>>> joins;
  for (size_t k = 0; k < prompts_.size(); ++k)
    joins[2 * static_cast<int>(k)].push_back(prompts_[k]);
  EXPECT_EQ(Run(joins), alone);
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
  EXPECT_EQ(pool_->num_free_states(), 4);

  // Too few blocks for all of them at once: some are preempted and recomputed from scratch.
  Build(/*num_blocks=*/14, {.max_running = 6, .max_step_tokens = 64});
  EXPECT_EQ(Run({{0, prompts_}}), alone);
  EXPECT_GT(scheduler_->counters().preemptions, 0);
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
  EXPECT_EQ(pool_->num_free_states(), 6);
}

// The prefix cache on a hybrid model: a repeated prompt resumes from the state snapshot at the
// last cached block boundary (prompt chunks end on one so that it exists), a follow-up turn
// (the prompt, its answer and more) from a boundary inside the answer, and with one snapshot
// for three prompts the least recently used goes; every output is what the sequence generates
// with no cache at all.
TEST_F(HybridSchedulerTest, CachedPrefixesResumeFromStateSnapshotsAsEachSequenceAlone) {
  std::vector<std::vector<int32_t>> prompts = prompts_;
  const std::vector<std::vector<int32_t>> first = Alone();
  std::vector<int32_t> follow_up = prompts[3];
  follow_up.insert(follow_up.end(), first[3].begin(), first[3].end());
  follow_up.insert(follow_up.end(), prompts[1].begin(), prompts[1].end());
  prompts_ = {follow_up};
  const std::vector<int32_t> follow_up_alone = Alone()[0];
  prompts_ = prompts;

  const SchedulerConfig config{.max_running = 2, .max_step_tokens = 64, .cache_generated = true};
  Build(/*num_blocks=*/64, config, /*snapshots=*/8);
  EXPECT_EQ(Run({{0, {prompts[3]}}})[0], first[3]);
  EXPECT_EQ(scheduler_->counters().prefix_hit_tokens, 0);
  EXPECT_GT(pool_->prefix_cache_stats().state_snapshots, 0);
  EXPECT_EQ(Run({{0, {prompts[3]}}})[0], first[3]);
  // 31 prompt tokens: the first 24 (three blocks, the last with the state after it).
  EXPECT_EQ(scheduler_->counters().prefix_hit_tokens, 24);
  EXPECT_EQ(Run({{0, {follow_up}}})[0], follow_up_alone);
  EXPECT_GT(scheduler_->counters().prefix_hit_tokens, 24 + 24);
  EXPECT_EQ(pool_->num_free_states(), 2);

  // One snapshot and prompts' blocks only (as a prefill instance caches): each prompt's takes
  // the one before's.
  Build(/*num_blocks=*/64, {.max_running = 2, .max_step_tokens = 64}, /*snapshots=*/1);
  for (int k : {4, 5, 4}) EXPECT_EQ(Run({{0, {prompts[k]}}})[0], first[k]) << "prompt " << k;
  EXPECT_EQ(pool_->prefix_cache_stats().state_snapshots, 1);
  EXPECT_EQ(scheduler_->counters().prefix_hit_tokens, 0);
  EXPECT_EQ(Run({{0, {prompts[4]}}})[0], first[4]);
  EXPECT_EQ(scheduler_->counters().prefix_hit_tokens, 32);  // 39 tokens: 4 blocks of 8

  // Without snapshots the cache stays off for this pool.
  Build(/*num_blocks=*/64, config);
  pool_->EnablePrefixCache();
  EXPECT_FALSE(pool_->prefix_cache_enabled());
}

}  // namespace
}  // namespace tandem::engine
