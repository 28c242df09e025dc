// The dispatcher's target resolution and its behaviour without instances; the routing itself
// runs against real services in tests/e2e/generate_test.cc.
#include "services/router-gateway/dispatcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::gateway {
namespace {

using ::testing::Contains;

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
  DispatchCall call;
  const absl::Status status = dispatcher.Run("r", {1, 2}, {}, 4, &call, [](const auto&) {});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
}

TEST(DispatcherTest, DeadInstancesAreUnavailableWithEveryReason) {
  Dispatcher dispatcher({"127.0.0.1:1"}, {"127.0.0.1:1", "127.0.0.1:2"},
                        {.reserve_deadline = absl::Seconds(2)});
  DispatchCall call;
  const absl::Status status = dispatcher.Run("r", {1, 2}, {}, 4, &call, [](const auto&) {});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("127.0.0.1:2"));
}

TEST(DispatchCallTest, CancelRunsTheHookAtOnceOrWhenSet) {
  DispatchCall call;
  int cancelled = 0;
  call.OnCancel([&] { ++cancelled; });
  EXPECT_EQ(cancelled, 0);
  call.Cancel();
  EXPECT_EQ(cancelled, 1);
  EXPECT_TRUE(call.cancelled());
  call.OnCancel([&] { ++cancelled; });  // already cancelled: runs now
  EXPECT_EQ(cancelled, 2);
}

}  // namespace
}  // namespace tandem::gateway
