// The gateway's admission control (max_inflight, the first-come queue, its bounds, requeueing
// what the backend could not place, cancellation and drain) over a backend the test drives.
#include "services/router-gateway/gateway_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/metrics/metrics.h"
#include "common/util/clock.h"
#include "tests/testing/subprocess.h"

namespace tandem::gateway {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Generations the test ends by hand; or, while `refuse` is set, ends at once with
// RESOURCE_EXHAUSTED (no room).
class ManualBackend : public GenerationBackend {
 public:
  struct Started {
    GenerationRequest request;
    std::shared_ptr<DispatchCall> call;
    std::shared_ptr<GenerationSink> sink;
    uint64_t cancel_hook = 0;
  };

  void Start(GenerationRequest request, std::shared_ptr<DispatchCall> call,
             std::shared_ptr<GenerationSink> sink) override {
    bool refused = false;
    {
      absl::MutexLock lock(&mu_);
      ++attempts_;
      if (refuse_ > 0) {
        --refuse_;
        refused = true;
      } else {
        started_.push_back({request, call, sink});
      }
    }
    if (refused) return sink->OnDone(absl::ResourceExhaustedError("no room"));
    // A cancelled generation ends CANCELLED, as the real backends' do; an ended one removes
    // its hook, as theirs do (the hook would hold the generation through the call).
    const uint64_t hook = call->OnCancel([this, id = request.request_id] {
      if (std::shared_ptr<GenerationSink> sink = Take(id)) {
        sink->OnDone(absl::CancelledError("cancelled"));
      }
    });
    bool running = false;
    {
      absl::MutexLock lock(&mu_);
      for (Started& s : started_) {
        if (s.call == call) {
          s.cancel_hook = hook;
          running = true;
        }
      }
    }
    if (!running) call->RemoveOnCancel(hook);  // ended meanwhile
  }

  // Ends the running generation `id` with `status`; false if it is not running.
  bool End(const std::string& id, const absl::Status& status) {
    std::shared_ptr<GenerationSink> sink = Take(id);
    if (sink == nullptr) return false;
    tandem::v1::GenerateStreamResponse chunk;
    chunk.add_token_ids(1);
    if (status.ok()) sink->OnChunk(chunk);
    sink->OnDone(status);
    return true;
  }
  std::vector<std::string> Running() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> ids;
    for (const Started& s : started_) ids.push_back(s.request.request_id);
    return ids;
  }
  void Refuse(int n) {
    absl::MutexLock lock(&mu_);
    refuse_ = n;
  }
  int attempts() {
    absl::MutexLock lock(&mu_);
    return attempts_;
  }

 private:
  // Takes the running generation `id` off the list (its cancel hook removed) and returns its
  // sink; null if it is not running.
  std::shared_ptr<GenerationSink> Take(const std::string& id) {
    Started taken;
    {
      absl::MutexLock lock(&mu_);
      auto it = std::find_if(started_.begin(), started_.end(),
                             [&](const Started& s) { return s.request.request_id == id; });
      if (it == started_.end()) return nullptr;
      taken = std::move(*it);
      started_.erase(it);
    }
    taken.call->RemoveOnCancel(taken.cancel_hook);
    return taken.sink;
  }

  absl::Mutex mu_;
  std::deque<Started> started_ ABSL_GUARDED_BY(mu_);
  int refuse_ ABSL_GUARDED_BY(mu_) = 0;
  int attempts_ ABSL_GUARDED_BY(mu_) = 0;
};

// What a request's sink saw.
class Result : public GenerationSink {
 public:
  void OnChunk(const tandem::v1::GenerateStreamResponse&) override {}
  void OnDone(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    EXPECT_FALSE(done_) << "OnDone twice";
    status_ = status;
    done_ = true;
  }
  bool done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(30))) {
      return absl::DeadlineExceededError("never ended");
    }
    return status_;
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

class AdmissionTest : public ::testing::Test {
 protected:
  void Make(int max_inflight, int max_queued, absl::Duration queue_timeout = absl::Seconds(60)) {
    GatewayConfig config;
    config.model_name = "m";
    config.max_inflight = max_inflight;
    config.max_queued = max_queued;
    config.queue_timeout = queue_timeout;
    auto backend = std::make_unique<ManualBackend>();
    backend_ = backend.get();
    service_ = std::make_unique<GatewayService>(config, nullptr, std::move(backend), &rpc_metrics_,
                                                &metrics_);
  }
  std::shared_ptr<Result> Execute(const std::string& id,
                                  std::shared_ptr<DispatchCall> call = nullptr) {
    GatewayService::Prepared prepared;
    prepared.generation.request_id = id;
    prepared.generation.prompt = {1};
    prepared.generation.max_tokens = 1;
    prepared.start = util::Instant::Now();
    auto result = std::make_shared<Result>();
    service_->Execute(prepared, call != nullptr ? call : std::make_shared<DispatchCall>(), result);
    return result;
  }

  metrics::Registry registry_{{}};
  rpc::RpcMetrics rpc_metrics_{&registry_};
  serving::GatewayMetrics metrics_{&registry_};
  ManualBackend* backend_ = nullptr;
  std::unique_ptr<GatewayService> service_;
};

TEST_F(AdmissionTest, PastMaxInflightRequestsWaitAndRunInArrivalOrder) {
  Make(/*max_inflight=*/2, /*max_queued=*/10);
  std::vector<std::shared_ptr<Result>> results;
  for (const char* id : {"a", "b", "c", "d", "e"}) results.push_back(Execute(id));
  EXPECT_THAT(backend_->Running(), ElementsAre("a", "b"));
  EXPECT_EQ(service_->running(), 2);
  EXPECT_EQ(service_->queued(), 3);
  EXPECT_EQ(metrics_.queued->Value(), 3);
  ASSERT_TRUE(backend_->End("b", absl::OkStatus()));
  EXPECT_TRUE(results[1]->Wait().ok());
  EXPECT_THAT(backend_->Running(), ElementsAre("a", "c"));
  ASSERT_TRUE(backend_->End("a", absl::InternalError("boom")));
  EXPECT_EQ(results[0]->Wait().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(backend_->Running(), ElementsAre("c", "d"));
  for (const char* id : {"c", "d"}) ASSERT_TRUE(backend_->End(id, absl::OkStatus()));
  EXPECT_THAT(backend_->Running(), ElementsAre("e"));
  ASSERT_TRUE(backend_->End("e", absl::OkStatus()));
  for (auto& r : results) EXPECT_TRUE(r->done());
  EXPECT_EQ(service_->running(), 0);
  EXPECT_EQ(service_->queued(), 0);
  EXPECT_EQ(metrics_.requests_ok->Value(), 4);
  EXPECT_EQ(metrics_.requests_error->Value(), 1);
}

TEST_F(AdmissionTest, PastTheQueueBoundRequestsAreRefusedAtOnce) {
  Make(/*max_inflight=*/1, /*max_queued=*/1);
  auto a = Execute("a");
  auto b = Execute("b");
  auto c = Execute("c");
  const absl::Status refused = c->Wait();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("--max_queued"));
  EXPECT_FALSE(b->done());
  EXPECT_EQ(metrics_.requests_rejected->Value(), 1);
  backend_->End("a", absl::OkStatus());
  backend_->End("b", absl::OkStatus());
  EXPECT_TRUE(b->Wait().ok());
}

TEST_F(AdmissionTest, ARequestWaitsNoLongerThanTheQueueTimeout) {
  Make(/*max_inflight=*/1, /*max_queued=*/4, absl::Milliseconds(200));
  auto a = Execute("a");
  const util::Instant start = util::Instant::Now();
  auto b = Execute("b");
  const absl::Status status = b->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()), HasSubstr("--queue_timeout_s"));
  EXPECT_GE(util::Since(start), absl::Milliseconds(190));
  EXPECT_EQ(service_->queued(), 0);
  EXPECT_THAT(backend_->Running(), ElementsAre("a"));  // b never reached the backend
  backend_->End("a", absl::OkStatus());
}

TEST_F(AdmissionTest, WhatTheBackendCouldNotPlaceWaitsAtTheHeadOfTheQueue) {
  Make(/*max_inflight=*/4, /*max_queued=*/4);
  auto a = Execute("a");
  backend_->Refuse(3);  // the next three attempts find no room
  auto b = Execute("b");
  auto c = Execute("c");
  // b keeps its turn: each retry is b's, until the backend has room again.
  ASSERT_TRUE(
      testing::WaitUntil([&] { return backend_->Running().size() == 3; }, absl::Seconds(10)));
  EXPECT_THAT(backend_->Running(), ElementsAre("a", "b", "c"));
  EXPECT_GE(backend_->attempts(), 6);
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(backend_->End(id, absl::OkStatus()));
  for (auto& r : {a, b, c}) EXPECT_TRUE(r->Wait().ok());
  EXPECT_EQ(metrics_.requests_rejected->Value(), 0);
}

TEST_F(AdmissionTest, ARequestCancelledWhileWaitingNeverRuns) {
  Make(/*max_inflight=*/1, /*max_queued=*/4);
  auto a = Execute("a");
  auto call = std::make_shared<DispatchCall>();
  auto b = Execute("b", call);
  call->Cancel();
  EXPECT_EQ(b->Wait().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(service_->queued(), 0);
  backend_->End("a", absl::OkStatus());
  EXPECT_TRUE(backend_->Running().empty());
  EXPECT_EQ(metrics_.requests_cancelled->Value(), 1);
}

TEST_F(AdmissionTest, DrainEndsQueuedRequestsAndCancelsRunningOnesPastItsDeadline) {
  Make(/*max_inflight=*/1, /*max_queued=*/4);
  auto a = Execute("a");
  auto b = Execute("b");
  service_->Drain(absl::Milliseconds(100));
  EXPECT_EQ(b->Wait().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a->Wait().code(), absl::StatusCode::kCancelled);
  auto late = Execute("late");
  const absl::Status refused = late->Wait();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("draining"));
}

TEST_F(AdmissionTest, DestroyingTheServiceEndsEveryRequest) {
  Make(/*max_inflight=*/1, /*max_queued=*/4);
  auto a = Execute("a");
  auto b = Execute("b");
  service_.reset();
  EXPECT_EQ(a->Wait().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(b->Wait().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::gateway

namespace tandem::gateway {
namespace {

// The sampling fields are checked before anything runs, each refusal naming its field;
// max_tokens left unset is the default, set to 0 it scores the prompt only.
TEST(PrepareTest, SamplingFieldsAreCheckedAndExplicitZeroMaxTokensScores) {
  metrics::Registry registry{{}};
  rpc::RpcMetrics rpc_metrics(&registry);
  serving::GatewayMetrics metrics(&registry);
  GatewayConfig config;
  config.model_name = "m";
  config.model_config.vocab_size = 100;
  config.model_config.max_position_embeddings = 64;
  GatewayService service(config, nullptr, std::make_unique<ManualBackend>(), &rpc_metrics,
                         &metrics);
  auto request = [] {
    tandem::v1::GenerateRequest r;
    r.mutable_prompt_token_ids()->add_ids(1);
    r.mutable_prompt_token_ids()->add_ids(2);
    return r;
  };
  auto ok = service.Prepare(request());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->generation.max_tokens, 16);

  tandem::v1::GenerateRequest score = request();
  score.mutable_sampling()->set_max_tokens(0);
  EXPECT_THAT(std::string(service.Prepare(score).status().message()), HasSubstr("prompt_logprobs"));
  score.mutable_sampling()->set_prompt_logprobs(0);
  auto scoring = service.Prepare(score);
  ASSERT_TRUE(scoring.ok()) << scoring.status();
  EXPECT_EQ(scoring->generation.max_tokens, 0);

  const std::vector<std::pair<std::string, std::function<void(tandem::v1::SamplingParams*)>>> bad =
      {
          {"presence_penalty", [](auto* s) { s->set_presence_penalty(2.5f); }},
          {"frequency_penalty", [](auto* s) { s->set_frequency_penalty(-3); }},
          {"repetition_penalty", [](auto* s) { s->set_repetition_penalty(-1); }},
          {"logit_bias", [](auto* s) { (*s->mutable_logit_bias())[100] = 1; }},
          {"logit_bias", [](auto* s) { (*s->mutable_logit_bias())[1] = 200; }},
          {"logprobs", [](auto* s) { s->set_logprobs(21); }},
          {"prompt_logprobs", [](auto* s) { s->set_prompt_logprobs(-1); }},
      };
  for (const auto& [field, mutate] : bad) {
    tandem::v1::GenerateRequest r = request();
    mutate(r.mutable_sampling());
    const absl::Status status = service.Prepare(r).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(std::string(status.message()), HasSubstr(field));
  }
}

}  // namespace
}  // namespace tandem::gateway
