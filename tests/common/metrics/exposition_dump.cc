// Prints a Registry exercising every metric type, label escaping and special values, for
// `promtool check metrics` (see CMakeLists.txt).
#include <iostream>
#include <limits>

#include "common/metrics/metrics.h"
#include "common/rpc/rpc_metrics.h"

int main() {
  tandem::metrics::Registry registry(tandem::metrics::Labels{{"role", "decode"}});
  tandem::rpc::RpcMetrics rpc(&registry);
  rpc.Record("Generate", grpc::Status::OK, absl::Milliseconds(12));
  rpc.Record("Generate", grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "x"),
             absl::Milliseconds(1));
  auto gauge = registry.AddGauge("tandem_kv_blocks_free", "Free KV blocks.\nSecond line.");
  (*gauge)->Add({{"pool", "a\"b\\c"}}).Set(std::numeric_limits<double>::infinity());
  (*gauge)->Add({{"pool", "main"}}).Set(0.125);
  auto hist = registry.AddHistogram("tandem_decode_step_seconds", "Decode step time.",
                                    tandem::metrics::LatencyBuckets());
  (*hist)->Add({}).Observe(0.003);
  std::cout << registry.Render();
  return 0;
}
