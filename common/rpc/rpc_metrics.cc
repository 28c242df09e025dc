#include "common/rpc/rpc_metrics.h"

#include "common/util/guard.h"
#include "common/util/logging.h"
#include "tandem/version.h"

namespace tandem::rpc {

absl::string_view CodeName(grpc::StatusCode code) {
  static constexpr absl::string_view kNames[] = {"OK",
                                                 "CANCELLED",
                                                 "UNKNOWN",
                                                 "INVALID_ARGUMENT",
                                                 "DEADLINE_EXCEEDED",
                                                 "NOT_FOUND",
                                                 "ALREADY_EXISTS",
                                                 "PERMISSION_DENIED",
                                                 "RESOURCE_EXHAUSTED",
                                                 "FAILED_PRECONDITION",
                                                 "ABORTED",
                                                 "OUT_OF_RANGE",
                                                 "UNIMPLEMENTED",
                                                 "INTERNAL",
                                                 "UNAVAILABLE",
                                                 "DATA_LOSS",
                                                 "UNAUTHENTICATED"};
  const int index = static_cast<int>(code);
  if (index < 0 || index >= static_cast<int>(std::size(kNames))) return "UNKNOWN";
  return kNames[index];
}

RpcMetrics::RpcMetrics(metrics::Registry* registry) {
  auto requests = registry->AddCounter("tandem_rpc_requests_total",
                                       "Finished RPCs by method and gRPC status code.");
  auto duration = registry->AddHistogram("tandem_rpc_duration_seconds",
                                         "Time from an RPC's arrival to its finish.",
                                         metrics::LatencyBuckets());
  auto build = registry->AddGauge("tandem_build_info", "Build information; always 1.");
  TANDEM_CHECK(requests.ok() && duration.ok() && build.ok()) << "metric registration";
  requests_ = *requests;
  duration_ = *duration;
  (*build)->Add({{"version", kVersion}}).Set(1);
  auto internal = registry->AddCounter(
      "tandem_internal_errors_total",
      "Exceptions caught at a handler's, reactor's or thread's edge (each is logged); the "
      "process kept serving.");
  TANDEM_CHECK(internal.ok()) << "metric registration";
  metrics::Counter* counter = &(*internal)->Add({});
  counter->Increment(static_cast<double>(util::InternalErrorCount()));
  util::SetInternalErrorListener([counter](std::string_view) { counter->Increment(); });
}

RpcMetrics::~RpcMetrics() { util::SetInternalErrorListener(nullptr); }

void RpcMetrics::Record(absl::string_view rpc, const grpc::Status& status, absl::Duration elapsed) {
  requests_->Add({{"rpc", std::string(rpc)}, {"code", std::string(CodeName(status.error_code()))}})
      .Increment();
  duration_->Add({{"rpc", std::string(rpc)}}).Observe(absl::ToDoubleSeconds(elapsed));
}

}  // namespace tandem::rpc
