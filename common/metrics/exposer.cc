#include "common/metrics/exposer.h"

namespace tandem::metrics {

std::vector<http::Route> ObservabilityRoutes(const Registry* registry, const HealthState* health) {
  return {
      {"/metrics",
       [registry](const http::Request&) {
         return http::Response{200, "text/plain; version=0.0.4; charset=utf-8", registry->Render()};
       }},
      {"/healthz",
       [health](const http::Request&) {
         // Alive while draining too: a liveness failure would restart a draining pod.
         return http::Response{200, "text/plain", health->draining() ? "ok draining\n" : "ok\n"};
       }},
      {"/readyz",
       [health](const http::Request&) {
         if (health->ready()) return http::Response{200, "text/plain", "ready\n"};
         return http::Response{503, "text/plain",
                               health->draining() ? "draining\n" : "not ready\n"};
       }},
  };
}

absl::StatusOr<std::unique_ptr<http::HttpServer>> StartExposer(
    const http::ServerOptions& options, const Registry* registry, const HealthState* health,
    std::vector<http::Route> extra_routes) {
  std::vector<http::Route> routes = ObservabilityRoutes(registry, health);
  for (auto& route : extra_routes) routes.push_back(std::move(route));
  return http::HttpServer::Start(options, std::move(routes));
}

}  // namespace tandem::metrics
