#include "common/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/logging.h"

namespace tandem::metrics {
namespace {

// atomic<double>::fetch_add is C++20 but not lock-free everywhere; a CAS loop is.
void AtomicAdd(std::atomic<double>& target, double amount) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + amount, std::memory_order_relaxed)) {
  }
}

bool IsNameChar(char c, bool first, bool allow_colon) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return true;
  if (allow_colon && c == ':') return true;
  return !first && c >= '0' && c <= '9';
}

std::string RenderLabels(const Labels& labels, const std::string* extra_name = nullptr,
                         const std::string* extra_value = nullptr) {
  if (labels.empty() && extra_name == nullptr) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [name, value] : labels) {
    absl::StrAppend(&out, first ? "" : ",", name, "=\"", EscapeLabelValue(value), "\"");
    first = false;
  }
  if (extra_name != nullptr) {
    absl::StrAppend(&out, first ? "" : ",", *extra_name, "=\"", EscapeLabelValue(*extra_value),
                    "\"");
  }
  out += "}";
  return out;
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

Labels Merge(const Labels& a, const Labels& b) {
  Labels out = a;
  out.insert(b.begin(), b.end());
  return out;
}

}  // namespace

bool IsValidMetricName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0, /*allow_colon=*/true)) return false;
  }
  return true;
}

bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || absl::StartsWith(name, "__")) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0, /*allow_colon=*/false)) return false;
  }
  return true;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrFormat("%.0f", value);
  }
  return absl::StrFormat("%.17g", value);
}

void Counter::Increment(double amount) {
  if (amount < 0 || std::isnan(amount)) return;
  AtomicAdd(value_, amount);
}

void Gauge::Increment(double amount) { AtomicAdd(value_, amount); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    TANDEM_CHECK(std::isfinite(bounds_[i])) << "histogram bound " << i << " is not finite";
    TANDEM_CHECK(i == 0 || bounds_[i] > bounds_[i - 1]) << "histogram bounds must increase";
  }
}

void Histogram::Observe(double value) {
  // Bucket i counts values <= bounds_[i]; the last bucket is +Inf.
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot snap;
  snap.bounds = bounds_;
  absl::MutexLock lock(&mu_);
  snap.cumulative_counts.resize(counts_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    running += counts_[i];
    snap.cumulative_counts[i] = running;
  }
  snap.count = running;
  snap.sum = sum_;
  return snap;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  TANDEM_CHECK(start > 0 && factor > 1 && count > 0) << "bad exponential buckets";
  std::vector<double> out;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) out.push_back(bound);
  return out;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  TANDEM_CHECK(width > 0 && count > 0) << "bad linear buckets";
  std::vector<double> out;
  for (int i = 0; i < count; ++i) out.push_back(start + width * i);
  return out;
}

std::vector<double> LatencyBuckets() { return ExponentialBuckets(0.001, 2.0, 17); }

template <typename T>
T& Family<T>::Add(const Labels& labels) {
  for (const auto& [name, value] : labels) {
    TANDEM_CHECK(IsValidLabelName(name) && name != "le") << "bad label name '" << name << "'";
  }
  absl::MutexLock lock(&mu_);
  auto it = metrics_.find(labels);
  if (it == metrics_.end()) {
    std::unique_ptr<T> metric;
    if constexpr (std::is_same_v<T, Histogram>) {
      metric = std::make_unique<Histogram>(bounds_);
    } else {
      metric = std::make_unique<T>();
    }
    it = metrics_.emplace(labels, std::move(metric)).first;
  }
  return *it->second;
}

template <typename T>
std::vector<std::pair<Labels, const T*>> Family<T>::Collect() const {
  std::vector<std::pair<Labels, const T*>> out;
  absl::MutexLock lock(&mu_);
  out.reserve(metrics_.size());
  for (const auto& [labels, metric] : metrics_) {
    out.emplace_back(Merge(labels, const_labels_), metric.get());
  }
  return out;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

absl::Status Registry::CheckNew(absl::string_view name, MetricType type) const {
  if (!IsValidMetricName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid metric name '", name, "'"));
  }
  auto it = families_.find(name);
  if (it != families_.end() && it->second.type != type) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric '", name, "' is already registered with another type"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Family<Counter>*> Registry::AddCounter(absl::string_view name,
                                                      absl::string_view help) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckNew(name, MetricType::kCounter); !s.ok()) return s;
  if (!absl::EndsWith(name, "_total")) {
    return absl::InvalidArgumentError(
        absl::StrCat("counter '", name, "' must end in _total (Prometheus convention)"));
  }
  Entry& entry = families_[std::string(name)];
  if (!entry.counter) {
    entry.type = MetricType::kCounter;
    entry.counter = std::make_unique<Family<Counter>>(std::string(name), std::string(help),
                                                      const_labels_, std::vector<double>{});
  }
  return entry.counter.get();
}

absl::StatusOr<Family<Gauge>*> Registry::AddGauge(absl::string_view name, absl::string_view help) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckNew(name, MetricType::kGauge); !s.ok()) return s;
  Entry& entry = families_[std::string(name)];
  if (!entry.gauge) {
    entry.type = MetricType::kGauge;
    entry.gauge = std::make_unique<Family<Gauge>>(std::string(name), std::string(help),
                                                  const_labels_, std::vector<double>{});
  }
  return entry.gauge.get();
}

absl::StatusOr<Family<Histogram>*> Registry::AddHistogram(absl::string_view name,
                                                          absl::string_view help,
                                                          std::vector<double> bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram '", name, "': bounds must be finite and strictly increasing"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckNew(name, MetricType::kHistogram); !s.ok()) return s;
  Entry& entry = families_[std::string(name)];
  if (!entry.histogram) {
    entry.type = MetricType::kHistogram;
    entry.histogram = std::make_unique<Family<Histogram>>(std::string(name), std::string(help),
                                                          const_labels_, std::move(bounds));
  }
  return entry.histogram.get();
}

std::string Registry::Render() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, entry] : families_) {
    switch (entry.type) {
      case MetricType::kCounter: {
        absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(entry.counter->help()), "\n",
                        "# TYPE ", name, " counter\n");
        for (const auto& [labels, metric] : entry.counter->Collect()) {
          absl::StrAppend(&out, name, RenderLabels(labels), " ", FormatValue(metric->Value()),
                          "\n");
        }
        break;
      }
      case MetricType::kGauge: {
        absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(entry.gauge->help()), "\n",
                        "# TYPE ", name, " gauge\n");
        for (const auto& [labels, metric] : entry.gauge->Collect()) {
          absl::StrAppend(&out, name, RenderLabels(labels), " ", FormatValue(metric->Value()),
                          "\n");
        }
        break;
      }
      case MetricType::kHistogram: {
        absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(entry.histogram->help()), "\n",
                        "# TYPE ", name, " histogram\n");
        static const std::string kLe = "le";
        for (const auto& [labels, metric] : entry.histogram->Collect()) {
          const Histogram::Snapshot snap = metric->Collect();
          for (size_t i = 0; i < snap.cumulative_counts.size(); ++i) {
            const std::string le =
                i < snap.bounds.size() ? FormatValue(snap.bounds[i]) : std::string("+Inf");
            absl::StrAppend(&out, name, "_bucket", RenderLabels(labels, &kLe, &le), " ",
                            snap.cumulative_counts[i], "\n");
          }
          absl::StrAppend(&out, name, "_sum", RenderLabels(labels), " ", FormatValue(snap.sum),
                          "\n", name, "_count", RenderLabels(labels), " ", snap.count, "\n");
        }
        break;
      }
    }
  }
  return out;
}

}  // namespace tandem::metrics
