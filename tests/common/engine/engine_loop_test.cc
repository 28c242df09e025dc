// The engine executor: sequences submitted from several threads at once get the reference
// greedy tokens through their callbacks; cancelling stops a sequence and frees its blocks;
// shutting down ends every live sequence with CANCELLED; bad requests are refused at once.
#include "common/engine/engine_loop.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>

#include <fstream>
#include <map>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "nlohmann/json.hpp"
#include "tests/testing/kernels.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::engine {
namespace {

class EngineLoopTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::UseExactKernels();
    const std::string dir = testing::SourceDir() + "/models/tiny-moe";
    auto weights = LoadModelWeights(*testing::OpenModelDir(dir), LoadFormat::kSafetensors);
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = weights->release();
    std::ifstream in(testing::SourceDir() + "/tests/golden/tiny-moe/manifest.json");
    manifest_ = new nlohmann::json(nlohmann::json::parse(in, nullptr, false));
  }
  static void TearDownTestSuite() {
    delete weights_;
    delete manifest_;
  }

  void SetUp() override {
    ASSERT_NE(weights_, nullptr) << "the shipped model did not load";
    const auto& c = weights_->config;
    auto pool = KvBlockPool::Create({static_cast<int>(c.num_hidden_layers),
                                     static_cast<int>(c.num_key_value_heads),
                                     static_cast<int>(c.head_dim), 16, 128});
    ASSERT_TRUE(pool.ok());
    pool_ = *std::move(pool);
    auto forward = ForwardPass::Create(weights_, pool_.get());
    ASSERT_TRUE(forward.ok());
    forward_ = *std::move(forward);
    StartLoop();
  }
  // (Re)starts loop_ on a fresh scheduler over forward_.
  void StartLoop(EngineLoop::StepObserver observer = nullptr) {
    loop_.reset();
    auto scheduler =
        Scheduler::Create(forward_.get(), nullptr, 2, {.max_running = 8, .max_step_tokens = 64});
    ASSERT_TRUE(scheduler.ok());
    loop_ = EngineLoop::Start(*std::move(scheduler), std::move(observer));
  }
  // Submits golden prompt 7 for 200 tokens, EOS ignored, and cancels it from its own output
  // callback (on the engine thread) once it has `cancel_after` tokens: midway, however fast
  // the machine is.
  absl::StatusOr<SequenceId> SubmitLong(int key, int cancel_after) {
    SequenceRequest request;
    request.prompt_ids = Prompt(7);
    request.params.max_tokens = 200;
    request.params.ignore_eos = true;
    auto id = std::make_shared<std::atomic<int64_t>>(-1);
    auto record = Record(key);
    absl::StatusOr<SequenceId> submitted = loop_->Submit(
        std::move(request), [this, id, record, key, cancel_after](const SequenceOutput& out) {
          record(out);
          size_t seen;
          {
            absl::MutexLock lock(&mu_);
            seen = seen_[key].tokens.size();
          }
          // The id is published before the second step's outputs, at the latest.
          if (seen == static_cast<size_t>(cancel_after)) {
            while (id->load() < 0) std::this_thread::yield();
            loop_->Cancel(SequenceId{id->load()});
          }
        });
    if (submitted.ok()) id->store(static_cast<int64_t>(*submitted));
    return submitted;
  }
  void TearDown() override { loop_.reset(); }

  std::vector<int32_t> Prompt(int k) const {
    return (*manifest_)["prompts"][k]["token_ids"].get<std::vector<int32_t>>();
  }
  std::vector<int32_t> Greedy(int k, int n) const {
    auto ids = (*manifest_)["prompts"][k]["greedy_token_ids"].get<std::vector<int32_t>>();
    if (static_cast<int>(ids.size()) > n) ids.resize(n);
    return ids;
  }

  // What one sequence's callback saw.
  struct Seen {
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::kNone;
    absl::Status status;
    bool done = false;
  };
  EngineLoop::OutputCallback Record(int key) {
    return [this, key](const SequenceOutput& out) {
      absl::MutexLock lock(&mu_);
      Seen& seen = seen_[key];
      EXPECT_FALSE(seen.done) << "output after the last one";
      if (out.token) seen.tokens.push_back(*out.token);
      seen.finish = out.finish;
      seen.status = out.status;
      seen.done = out.finish != FinishReason::kNone || !out.status.ok();
    };
  }
  bool AllDone(int n) {
    absl::MutexLock lock(&mu_);
    int done = 0;
    for (auto& [key, seen] : seen_) done += seen.done;
    return done == n;
  }

  static ModelWeights* weights_;
  static nlohmann::json* manifest_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<ForwardPass> forward_;
  std::unique_ptr<EngineLoop> loop_;
  absl::Mutex mu_;
  std::map<int, Seen> seen_;
};

ModelWeights* EngineLoopTest::weights_ = nullptr;
nlohmann::json* EngineLoopTest::manifest_ = nullptr;

TEST_F(EngineLoopTest, ConcurrentSubmittersGetTheReferenceTokens) {
  constexpr int kTokens = 20;
  std::vector<std::thread> clients;
  for (int k = 0; k < 8; ++k) {
    clients.emplace_back([&, k] {
      SequenceRequest request;
      request.prompt_ids = Prompt(k);
      request.params.max_tokens = kTokens;
      auto id = loop_->Submit(std::move(request), Record(k));
      EXPECT_TRUE(id.ok()) << id.status();
    });
  }
  for (auto& t : clients) t.join();
  ASSERT_TRUE(testing::WaitUntil([&] { return AllDone(8); }, absl::Seconds(60)));
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(seen_[k].status, absl::OkStatus());
    EXPECT_EQ(seen_[k].tokens, Greedy(k, kTokens)) << "prompt " << k;
  }
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return loop_->load().free_blocks == loop_->load().total_blocks; }, absl::Seconds(5)));
}

TEST_F(EngineLoopTest, CancelStopsOutputsAndFreesBlocks) {
  auto id = SubmitLong(0, /*cancel_after=*/3);
  ASSERT_TRUE(id.ok());
  // Cancelled during the step that made its third token: no step runs it again, so no output
  // follows, and its blocks come back.
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        const EngineLoop::Load load = loop_->load();
        return load.steps > 0 && load.running == 0 && load.free_blocks == load.total_blocks;
      },
      absl::Seconds(30)));
  // A second, unrelated sequence runs to its end: the loop has stepped past the cancel.
  SequenceRequest next;
  next.prompt_ids = Prompt(1);
  next.params.max_tokens = 4;
  ASSERT_TRUE(loop_->Submit(std::move(next), Record(1)).ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return AllDone(1); }, absl::Seconds(30)));
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(seen_[0].tokens.size(), 3u);
  EXPECT_FALSE(seen_[0].done);
  EXPECT_EQ(seen_[1].tokens.size(), 4u);
}

TEST_F(EngineLoopTest, ObserverSeesTheLoopEmptyAfterACancelThatNoStepFollows) {
  // Metrics gauges come from the observer: after the last sequence is cancelled the loop goes
  // idle, and the observer must still hear that nothing runs and every block is free.
  absl::Mutex reports_mu;
  std::vector<EngineLoop::StepReport> reports;
  StartLoop([&](const EngineLoop::StepReport& report) {
    absl::MutexLock lock(&reports_mu);
    reports.push_back(report);
  });
  absl::Cleanup stop_loop = [&] { loop_.reset(); };  // before `reports` goes, even on failure
  auto id = SubmitLong(0, /*cancel_after=*/3);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        absl::MutexLock lock(&reports_mu);
        return reports.size() >= 3 && reports.back().running == 0;
      },
      absl::Seconds(5)));
  absl::MutexLock lock(&reports_mu);
  EXPECT_TRUE(reports.front().stepped);
  EXPECT_EQ(reports.back().free_blocks, loop_->load().total_blocks);
  if (!reports.back().stepped) {
    EXPECT_EQ(reports.back().tokens, 0);
    EXPECT_EQ(reports.back().generated, 0);
  }
}

TEST_F(EngineLoopTest, AStepIsObservedBeforeItsOutputsLeave) {
  // Metrics come from the observer, and an output sets off replies and handoffs: a client that
  // has its tokens and then reads /metrics must find the steps that made them counted.
  std::atomic<int> observed{0};
  StartLoop([&](const EngineLoop::StepReport& report) { observed += report.generated; });
  absl::Cleanup stop_loop = [&] { loop_.reset(); };
  std::atomic<int> delivered{0}, early{0};
  SequenceRequest request;
  request.prompt_ids = Prompt(3);
  request.params.max_tokens = 6;
  auto record = Record(0);
  ASSERT_TRUE(loop_
                  ->Submit(std::move(request),
                           [&, record](const SequenceOutput& out) {
                             if (out.token && ++delivered > observed.load()) ++early;
                             record(out);
                           })
                  .ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return AllDone(1); }, absl::Seconds(30)));
  EXPECT_EQ(delivered.load(), 6);
  EXPECT_EQ(early.load(), 0) << "outputs went out before their step was observed";
}

TEST_F(EngineLoopTest, ShutdownEndsLiveSequencesWithCancelled) {
  for (int k = 0; k < 3; ++k) {
    SequenceRequest request;
    request.prompt_ids = Prompt(k);
    request.params.max_tokens = 400;
    request.params.ignore_eos = true;
    ASSERT_TRUE(loop_->Submit(std::move(request), Record(k)).ok());
  }
  loop_.reset();
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(seen_[k].done);
    EXPECT_EQ(seen_[k].status.code(), absl::StatusCode::kCancelled) << k;
  }
  EXPECT_EQ(pool_->num_free(), pool_->num_total());
}

TEST_F(EngineLoopTest, BadRequestsAreRefusedAtSubmit) {
  SequenceRequest empty;
  EXPECT_EQ(loop_->Submit(empty, Record(0)).status().code(), absl::StatusCode::kInvalidArgument);
  SequenceRequest bad_params;
  bad_params.prompt_ids = {1, 5};
  bad_params.params.top_p = 0;
  EXPECT_EQ(loop_->Submit(bad_params, Record(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  BlockTable table;
  ASSERT_TRUE(table.Reserve(pool_.get(), 4).ok());
  EXPECT_EQ(loop_->SubmitPrefilled(empty, std::move(table), 5, {}, Record(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_->num_free(), pool_->num_total()) << "a refused table's blocks are released";
}

}  // namespace
}  // namespace tandem::engine
