// Per-RPC request counters and latency histograms, shared by the services:
//   tandem_rpc_requests_total{rpc, code}       finished RPCs by gRPC status code name
//   tandem_rpc_duration_seconds{rpc}           time from arrival to finish
//   tandem_build_info{version}                 always 1
//   tandem_internal_errors_total               exceptions caught at an edge (util/guard.h)
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/strings/string_view.h"

#include "absl/time/time.h"
#include "common/metrics/metrics.h"

namespace tandem::rpc {

class RpcMetrics {
 public:
  // Also counts the process's internal errors (one RpcMetrics per process does).
  explicit RpcMetrics(metrics::Registry* registry);
  ~RpcMetrics();
  RpcMetrics(const RpcMetrics&) = delete;
  RpcMetrics& operator=(const RpcMetrics&) = delete;
  void Record(absl::string_view rpc, const grpc::Status& status, absl::Duration elapsed);

 private:
  metrics::Family<metrics::Counter>* requests_;
  metrics::Family<metrics::Histogram>* duration_;
};

// Canonical upper-case name of a gRPC code, e.g. "UNIMPLEMENTED".
absl::string_view CodeName(grpc::StatusCode code);

// A server-streaming reactor that finishes at once with `status` (for refusals).
template <typename T>
grpc::ServerWriteReactor<T>* FinishedWriter(const grpc::Status& status) {
  class Reactor : public grpc::ServerWriteReactor<T> {
   public:
    explicit Reactor(const grpc::Status& status) { this->Finish(status); }
    void OnDone() override { delete this; }
  };
  return new Reactor(status);
}

}  // namespace tandem::rpc
