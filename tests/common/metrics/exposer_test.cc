#include "common/metrics/exposer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "common/http/client.h"

namespace tandem::metrics {
namespace {

using ::testing::HasSubstr;

TEST(ExposerTest, ServesMetricsHealthAndReadiness) {
  Registry registry;
  HealthState health;
  auto gauge = registry.AddGauge("tandem_test_gauge", "A gauge.");
  ASSERT_TRUE(gauge.ok());
  (*gauge)->Add({}).Set(7);
  auto server = StartExposer({}, &registry, &health);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  auto metrics = http::Fetch("127.0.0.1", port, "GET", "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("tandem_test_gauge 7\n"));

  auto healthz = http::Fetch("127.0.0.1", port, "GET", "/healthz");
  ASSERT_TRUE(healthz.ok());
  EXPECT_EQ(healthz->status, 200);

  auto readyz = http::Fetch("127.0.0.1", port, "GET", "/readyz");
  ASSERT_TRUE(readyz.ok());
  EXPECT_EQ(readyz->status, 503);
  health.SetReady(true);
  EXPECT_EQ(http::Fetch("127.0.0.1", port, "GET", "/readyz")->status, 200);
  health.SetDraining();
  EXPECT_EQ(http::Fetch("127.0.0.1", port, "GET", "/readyz")->status, 503);
  EXPECT_EQ(http::Fetch("127.0.0.1", port, "GET", "/healthz")->status, 200);

  EXPECT_EQ(http::Fetch("127.0.0.1", port, "GET", "/nope")->status, 404);
}

TEST(ExposerTest, ConcurrentScrapes) {
  Registry registry;
  HealthState health;
  auto counter = registry.AddCounter("tandem_scrapes_total", "x");
  ASSERT_TRUE(counter.ok());
  auto server = StartExposer({}, &registry, &health);
  ASSERT_TRUE(server.ok());
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        (*counter)->Add({}).Increment();
        auto r = http::Fetch("127.0.0.1", (*server)->port(), "GET", "/metrics");
        if (r.ok() && r->status == 200) ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 100);
}

}  // namespace
}  // namespace tandem::metrics
