#include "common/metrics/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace tandem::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsTest, CounterRendersHelpTypeAndLabels) {
  Registry registry(tandem::metrics::Labels{{"role", "decode"}});
  auto family = registry.AddCounter("tandem_requests_total", "Requests by outcome.");
  ASSERT_TRUE(family.ok());
  (*family)->Add({{"outcome", "ok"}}).Increment();
  (*family)->Add({{"outcome", "ok"}}).Increment(2);
  (*family)->Add({{"outcome", "error"}}).Increment();
  EXPECT_EQ(registry.Render(),
            "# HELP tandem_requests_total Requests by outcome.\n"
            "# TYPE tandem_requests_total counter\n"
            "tandem_requests_total{outcome=\"error\",role=\"decode\"} 1\n"
            "tandem_requests_total{outcome=\"ok\",role=\"decode\"} 3\n");
}

TEST(MetricsTest, CounterIgnoresNegativeAndNaN) {
  Counter counter;
  counter.Increment(5);
  counter.Increment(-3);
  counter.Increment(std::nan(""));
  EXPECT_EQ(counter.Value(), 5);
}

TEST(MetricsTest, GaugeGoesBothWaysAndFormatsFractions) {
  Registry registry;
  auto family = registry.AddGauge("tandem_kv_blocks_free", "Free KV blocks.");
  ASSERT_TRUE(family.ok());
  Gauge& gauge = (*family)->Add({});
  gauge.Set(10);
  gauge.Decrement(2.5);
  gauge.Increment();
  EXPECT_EQ(gauge.Value(), 8.5);
  EXPECT_THAT(registry.Render(), HasSubstr("tandem_kv_blocks_free 8.5\n"));
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  Registry registry;
  auto family = registry.AddHistogram("tandem_step_seconds", "Step time.", {0.1, 1, 10});
  ASSERT_TRUE(family.ok());
  Histogram& h = (*family)->Add({{"phase", "decode"}});
  for (double v : {0.05, 0.1, 0.5, 2.0, 20.0}) h.Observe(v);
  const Histogram::Snapshot snap = h.Collect();
  EXPECT_EQ(snap.cumulative_counts, (std::vector<uint64_t>{2, 3, 4, 5}));
  EXPECT_EQ(snap.count, 5u);
  EXPECT_DOUBLE_EQ(snap.sum, 22.65);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# TYPE tandem_step_seconds histogram\n"));
  EXPECT_THAT(
      text,
      HasSubstr("tandem_step_seconds_bucket{phase=\"decode\",le=\"0.10000000000000001\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("tandem_step_seconds_bucket{phase=\"decode\",le=\"1\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("tandem_step_seconds_bucket{phase=\"decode\",le=\"10\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("tandem_step_seconds_bucket{phase=\"decode\",le=\"+Inf\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("tandem_step_seconds_count{phase=\"decode\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("tandem_step_seconds_sum{phase=\"decode\"} 22.6"));
}

TEST(MetricsTest, BucketHelpers) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(LinearBuckets(0, 5, 3), (std::vector<double>{0, 5, 10}));
  const auto latency = LatencyBuckets();
  EXPECT_DOUBLE_EQ(latency.front(), 0.001);
  EXPECT_GT(latency.back(), 60);
}

TEST(MetricsTest, RejectsBadNamesAndTypeClashes) {
  Registry registry;
  EXPECT_EQ(registry.AddGauge("1bad", "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddGauge("has-dash", "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(registry.AddCounter("tandem_requests", "x").status().message(), HasSubstr("_total"));
  ASSERT_TRUE(registry.AddGauge("tandem_x", "x").ok());
  EXPECT_THAT(registry.AddCounter("tandem_x", "x").status().message(), HasSubstr("another type"));
  EXPECT_FALSE(registry.AddHistogram("tandem_h", "x", {1, 1}).ok());
  EXPECT_FALSE(
      registry.AddHistogram("tandem_h", "x", {1, std::numeric_limits<double>::infinity()}).ok());
}

TEST(MetricsTest, SameNameAndTypeReturnsTheSameFamily) {
  Registry registry;
  auto a = registry.AddCounter("tandem_a_total", "a");
  auto b = registry.AddCounter("tandem_a_total", "a");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  Registry registry;
  auto family = registry.AddGauge("tandem_g", "line one\nback\\slash");
  ASSERT_TRUE(family.ok());
  (*family)->Add({{"path", "a\"b\\c\nd"}}).Set(1);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# HELP tandem_g line one\\nback\\\\slash\n"));
  EXPECT_THAT(text, HasSubstr("tandem_g{path=\"a\\\"b\\\\c\\nd\"} 1\n"));
}

TEST(MetricsTest, FormatsSpecialValues) {
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatValue(42), "42");
  EXPECT_EQ(FormatValue(0.25), "0.25");
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  Registry registry;
  auto counters = registry.AddCounter("tandem_c_total", "c");
  auto gauges = registry.AddGauge("tandem_g", "g");
  auto histograms = registry.AddHistogram("tandem_h", "h", {0.5});
  ASSERT_TRUE(counters.ok() && gauges.ok() && histograms.ok());
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Labels from two values, so families are also created concurrently.
        const Labels labels = {{"shard", std::to_string((t + i) % 2)}};
        (*counters)->Add(labels).Increment();
        (*gauges)->Add({}).Increment();
        (*histograms)->Add({}).Observe(i % 2 == 0 ? 0.1 : 1.0);
        if (i % 1000 == 0) registry.Render();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  double total = 0;
  for (const auto& [labels, counter] : (*counters)->Collect()) total += counter->Value();
  EXPECT_EQ(total, kThreads * kPerThread);
  EXPECT_EQ((*gauges)->Add({}).Value(), kThreads * kPerThread);
  const auto snap = (*histograms)->Add({}).Collect();
  EXPECT_EQ(snap.count, static_cast<uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(snap.cumulative_counts[0], static_cast<uint64_t>(kThreads * kPerThread / 2));
}

TEST(MetricsTest, RenderIsSortedByFamilyName) {
  Registry registry;
  ASSERT_TRUE(registry.AddGauge("tandem_b", "b").ok());
  ASSERT_TRUE(registry.AddGauge("tandem_a", "a").ok());
  const std::string text = registry.Render();
  EXPECT_LT(text.find("tandem_a"), text.find("tandem_b"));
  EXPECT_THAT(text, Not(HasSubstr("{}")));
}

}  // namespace
}  // namespace tandem::metrics
