// The dispatcher's target resolution and its behaviour without instances; the routing itself
// runs against real services in tests/e2e/generate_test.cc.
#include "services/router-gateway/dispatcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tests/testing/subprocess.h"

namespace tandem::gateway {
namespace {

using ::testing::Contains;

// Runs one generation to its end; its final status.
absl::Status Generate(Dispatcher& dispatcher, std::shared_ptr<DispatchCall> call = nullptr) {
  class Sink : public GenerationSink {
   public:
    void OnChunk(const tandem::v1::GenerateStreamResponse&) override {}
    void OnDone(const absl::Status& status) override {
      status_ = status;
      done_.Notify();
    }
    absl::Status Wait() {
      if (!done_.WaitForNotificationWithTimeout(absl::Seconds(60))) {
        return absl::DeadlineExceededError("the generation never ended");
      }
      return status_;
    }

   private:
    absl::Status status_;
    absl::Notification done_;
  };
  auto sink = std::make_shared<Sink>();
  dispatcher.Start({.request_id = "r", .prompt = {1, 2}, .sampling = {}, .max_tokens = 4},
                   call != nullptr ? call : std::make_shared<DispatchCall>(), sink);
  return sink->Wait();
}

TEST(ResolveTargetTest, HostNamesBecomeOneTargetPerAddress) {
  const std::vector<std::string> localhost = ResolveTarget("localhost:50051");
  EXPECT_THAT(localhost, Contains("127.0.0.1:50051"));
  for (const std::string& address : localhost) EXPECT_TRUE(address.ends_with(":50051"));
  EXPECT_EQ(ResolveTarget("127.0.0.1:7"), std::vector<std::string>{"127.0.0.1:7"});
  // Unresolvable names and malformed targets are kept as given; the channel reports them.
  EXPECT_EQ(ResolveTarget("no-such-host.invalid:1"),
            std::vector<std::string>{"no-such-host.invalid:1"});
  EXPECT_EQ(ResolveTarget("no-port"), std::vector<std::string>{"no-port"});
}

TEST(DispatcherTest, NoInstancesIsUnavailable) {
  Dispatcher dispatcher({}, {"127.0.0.1:1"}, {});
  const absl::Status status = Generate(dispatcher);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
}

TEST(DispatcherTest, DeadInstancesAreUnavailableWithEveryReason) {
  DispatcherOptions options;
  options.reserve_deadline = absl::Seconds(2);
  Dispatcher dispatcher({"127.0.0.1:1"}, {"127.0.0.1:1", "127.0.0.1:2"}, options);
  const absl::Status status = Generate(dispatcher);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("127.0.0.1:2"));
}

TEST(LookupTargetTest, ErrorsSayWhy) {
  EXPECT_EQ(LookupTarget("no-such-host.invalid:1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LookupTarget("no-port").status().code(), absl::StatusCode::kInvalidArgument);
  auto found = LookupTarget("127.0.0.1:7");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, std::vector<std::string>{"127.0.0.1:7"});
}

// A DNS name whose addresses the test changes, as a headless Service's change with its pods.
class FakeDns {
 public:
  void Set(const std::string& name, absl::StatusOr<std::vector<std::string>> addresses) {
    absl::MutexLock lock(&mu_);
    names_.insert_or_assign(name, std::move(addresses));
  }
  Resolver resolver() {
    return [this](const std::string& name) -> absl::StatusOr<std::vector<std::string>> {
      absl::MutexLock lock(&mu_);
      auto it = names_.find(name);
      if (it == names_.end()) return absl::NotFoundError(name + ": unknown");
      return it->second;
    };
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, absl::StatusOr<std::vector<std::string>>> names_;
};

TEST(DispatcherTest, InstancesFollowTheirDnsNamesWithoutARestart) {
  FakeDns dns;
  dns.Set("decode.svc:50051", std::vector<std::string>{"127.0.0.1:1"});
  dns.Set("prefill.svc:50051", std::vector<std::string>{"127.0.0.1:3"});
  absl::Mutex mu;
  std::vector<std::pair<size_t, size_t>> counts;
  DispatcherOptions options;
  options.health_interval = absl::Milliseconds(20);
  options.reserve_deadline = absl::Seconds(2);
  options.resolve_interval = absl::Milliseconds(20);
  options.resolve = dns.resolver();
  options.on_instances = [&](size_t prefill, size_t decode) {
    absl::MutexLock lock(&mu);
    counts.emplace_back(prefill, decode);
  };
  Dispatcher dispatcher({"prefill.svc:50051"}, {"decode.svc:50051"}, options);
  using Addresses = std::vector<std::string>;
  EXPECT_EQ(dispatcher.decode_addresses(), Addresses{"127.0.0.1:1"});
  EXPECT_EQ(dispatcher.prefill_addresses(), Addresses{"127.0.0.1:3"});

  // Scaled up: a second decode pod.
  dns.Set("decode.svc:50051", std::vector<std::string>{"127.0.0.1:2", "127.0.0.1:1"});
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        return dispatcher.decode_addresses() == Addresses{"127.0.0.1:1", "127.0.0.1:2"};
      },
      absl::Seconds(10)));
  // Requests try every instance now: the failure names both.
  absl::Status status = Generate(dispatcher);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("127.0.0.1:2"));

  // DNS trouble: the name keeps its instances.
  dns.Set("decode.svc:50051", absl::UnavailableError("SERVFAIL"));
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(dispatcher.decode_addresses(), (Addresses{"127.0.0.1:1", "127.0.0.1:2"}));

  // Scaled down to the new pod only.
  dns.Set("decode.svc:50051", std::vector<std::string>{"127.0.0.1:2"});
  ASSERT_TRUE(
      testing::WaitUntil([&] { return dispatcher.decode_addresses() == Addresses{"127.0.0.1:2"}; },
                         absl::Seconds(10)));
  status = Generate(dispatcher);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("127.0.0.1:2"));
  EXPECT_THAT(std::string(status.message()), ::testing::Not(::testing::HasSubstr("127.0.0.1:1")));

  absl::MutexLock lock(&mu);
  EXPECT_EQ(counts.front(), std::make_pair(size_t{1}, size_t{1}));  // at start-up
  EXPECT_EQ(counts.back(), std::make_pair(size_t{1}, size_t{1}));
  EXPECT_THAT(counts, Contains(std::make_pair(size_t{1}, size_t{2})));
}

TEST(DispatcherTest, ACancelledGenerationEndsCancelled) {
  Dispatcher dispatcher({"127.0.0.1:1"}, {"127.0.0.1:1"}, {});
  auto call = std::make_shared<DispatchCall>();
  call->Cancel();
  EXPECT_EQ(Generate(dispatcher, call).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(dispatcher.running(), 0);
}

TEST(DispatchCallTest, CancelRunsEachHookOnceAtOnceOrWhenSet) {
  DispatchCall call;
  int cancelled = 0, removed = 0;
  call.OnCancel([&] { ++cancelled; });
  const uint64_t gone = call.OnCancel([&] { ++removed; });
  call.RemoveOnCancel(gone);
  EXPECT_EQ(cancelled, 0);
  call.Cancel();
  call.Cancel();
  EXPECT_EQ(cancelled, 1);
  EXPECT_EQ(removed, 0);
  EXPECT_TRUE(call.cancelled());
  call.OnCancel([&] { ++cancelled; });  // already cancelled: runs now
  EXPECT_EQ(cancelled, 2);
}

TEST(DispatchCallTest, AHookMayTouchTheCallItself) {
  DispatchCall call;
  bool saw_cancelled = false;
  call.OnCancel([&] { saw_cancelled = call.cancelled(); });
  call.Cancel();
  EXPECT_TRUE(saw_cancelled);
}

}  // namespace
}  // namespace tandem::gateway
