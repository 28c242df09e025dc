// A small Prometheus client: counters, gauges and histograms with labels, thread-safe,
// rendered in the text exposition format (version 0.0.4). The API is close to
// prometheus-cpp's (families of metrics keyed by label values), which Debian 12 does not
// package.
//
// Callers may assume: a metric reference returned by Family::Add stays valid for the life of
// the Registry; updates are lock-free for counters and gauges and cheap for histograms.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem::metrics {

// Label name -> value. Ordered, so the rendered order is stable.
using Labels = std::map<std::string, std::string>;

enum class MetricType { kCounter, kGauge, kHistogram };

class Counter {
 public:
  // Adds `amount` (must be >= 0; negative amounts are ignored, counters only go up).
  void Increment(double amount = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double amount = 1.0);
  void Decrement(double amount = 1.0) { Increment(-amount); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // `bounds`: strictly increasing finite upper bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative_counts;  // (bounds.size() + 1,), last is +Inf == count
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot Collect() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket, not cumulative
  double sum_ ABSL_GUARDED_BY(mu_) = 0.0;
};

// Bucket helpers: `count` bounds start, start*factor, ... and start, start+width, ...
std::vector<double> ExponentialBuckets(double start, double factor, int count);
std::vector<double> LinearBuckets(double start, double width, int count);
// Latency buckets in seconds, 1 ms to ~65 s.
std::vector<double> LatencyBuckets();

// All metrics of one name and type, keyed by label values.
template <typename T>
class Family {
 public:
  Family(std::string name, std::string help, Labels const_labels, std::vector<double> bounds)
      : name_(std::move(name)),
        help_(std::move(help)),
        const_labels_(std::move(const_labels)),
        bounds_(std::move(bounds)) {}

  // Returns the metric with these labels, creating it on first use. Label names must be
  // valid Prometheus label names (checked, CHECK-fails otherwise: names are code constants).
  T& Add(const Labels& labels);

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }

  // (labels merged with the family's constant labels, metric) pairs, sorted by labels.
  std::vector<std::pair<Labels, const T*>> Collect() const;

 private:
  const std::string name_;
  const std::string help_;
  const Labels const_labels_;
  const std::vector<double> bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<Labels, std::unique_ptr<T>> metrics_ ABSL_GUARDED_BY(mu_);
};

// Owns metric families and renders them. One per process, passed to whoever records.
class Registry {
 public:
  // `const_labels` are added to every sample (e.g. {"service", "decode"}).
  explicit Registry(Labels const_labels = {}) : const_labels_(std::move(const_labels)) {}

  // Registration fails with INVALID_ARGUMENT on a bad metric name or when the name is
  // already registered with another type; re-registering the same name and type returns
  // the existing family.
  absl::StatusOr<Family<Counter>*> AddCounter(absl::string_view name, absl::string_view help);
  absl::StatusOr<Family<Gauge>*> AddGauge(absl::string_view name, absl::string_view help);
  absl::StatusOr<Family<Histogram>*> AddHistogram(absl::string_view name, absl::string_view help,
                                                  std::vector<double> bounds);

  // The whole registry in the Prometheus text format, families sorted by name.
  std::string Render() const;

 private:
  struct Entry {
    MetricType type;
    std::unique_ptr<Family<Counter>> counter;
    std::unique_ptr<Family<Gauge>> gauge;
    std::unique_ptr<Family<Histogram>> histogram;
  };
  absl::Status CheckNew(absl::string_view name, MetricType type) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Labels const_labels_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry, std::less<>> families_ ABSL_GUARDED_BY(mu_);
};

bool IsValidMetricName(absl::string_view name);
bool IsValidLabelName(absl::string_view name);
// Escapes a label value for the text format (backslash, double quote, newline).
std::string EscapeLabelValue(absl::string_view value);
// Formats a sample value as Prometheus does: integers without exponent, +Inf, -Inf, NaN.
std::string FormatValue(double value);

}  // namespace tandem::metrics
