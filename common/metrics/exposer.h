// The observability endpoints every Tandem service serves on its HTTP port:
//   /metrics  Prometheus text format of a Registry
//   /healthz  200 while the process serves (also while draining)
//   /readyz   200 once the service says it is ready to take traffic, 503 before and while
//             draining
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http/http_server.h"
#include "common/metrics/metrics.h"

namespace tandem::metrics {

class HealthState {
 public:
  void SetReady(bool ready) { ready_.store(ready); }
  void SetDraining() {
    draining_.store(true);
    ready_.store(false);
  }
  bool ready() const { return ready_.load(); }
  bool draining() const { return draining_.load(); }

 private:
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
};

// Routes for /metrics, /healthz and /readyz; `registry` and `health` must outlive the server.
std::vector<http::Route> ObservabilityRoutes(const Registry* registry, const HealthState* health);

// Starts an HTTP server serving ObservabilityRoutes plus `extra_routes`.
absl::StatusOr<std::unique_ptr<http::HttpServer>> StartExposer(
    const http::ServerOptions& options, const Registry* registry, const HealthState* health,
    std::vector<http::Route> extra_routes = {});

}  // namespace tandem::metrics
