// The life of a Tandem service process: an HTTP port with /metrics, /healthz and /readyz, a
// gRPC port with the service's callback services (and grpc.health.v1), a port file for
// whoever started it on ephemeral ports, readiness, and a graceful drain on SIGTERM/SIGINT.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/exposer.h"
#include "common/metrics/metrics.h"

namespace tandem::rpc {

struct ServiceOptions {
  std::string name;  // e.g. "tandem-decode", for logs
  std::string host = "127.0.0.1";
  int grpc_port = 0;     // 0: ephemeral
  int http_port = 0;     // 0: ephemeral
  int http_threads = 4;  // threads running HTTP handlers (a streaming response holds none)
  int http_max_connections = 8192;
  size_t http_max_body_bytes = 1 << 20;  // larger HTTP request bodies get 413
  // When set, {"grpc_port": N, "http_port": M, "pid": P} is written here (atomically) once
  // both ports are bound.
  std::string port_file;
  // On SIGTERM/SIGINT: readiness turns 503 at once, in-flight RPCs get this long to finish,
  // then are cancelled.
  absl::Duration drain_timeout = absl::Seconds(10);
  int max_message_bytes = 64 << 20;
  // PEM certificate chain and private key: when both are set, gRPC is served over TLS only.
  std::string tls_cert_chain;
  std::string tls_private_key;
  // PEM CA certificates: with TLS, clients must present a certificate they signed (mTLS).
  std::string tls_client_ca;
  // The internal APIs' shared secret (internal_auth.h); empty: none.
  std::string internal_secret;
};

// A started gRPC server; Shutdown() drains with a deadline.
class GrpcServer {
 public:
  // TLS when `tls_cert_chain` and `tls_private_key` (PEM) are set, plaintext otherwise; with
  // `tls_client_ca` too, clients must present a certificate that CA signed.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const std::string& host, int port,
                                                           std::vector<grpc::Service*> services,
                                                           int max_message_bytes,
                                                           const std::string& tls_cert_chain = "",
                                                           const std::string& tls_private_key = "",
                                                           const std::string& tls_client_ca = "");
  ~GrpcServer();
  int port() const { return port_; }
  // Stops accepting calls, waits up to `deadline` for in-flight calls, cancels the rest.
  void Shutdown(absl::Duration deadline);

 private:
  explicit GrpcServer(std::unique_ptr<grpc::Server> server, int port)
      : server_(std::move(server)), port_(port) {}
  std::unique_ptr<grpc::Server> server_;
  int port_;
  bool shut_down_ = false;
};

// Blocks SIGTERM and SIGINT in the calling thread and every thread it starts later; call it
// first thing in main(), so WaitForShutdownSignal() can take them synchronously.
void BlockShutdownSignals();
// Waits for SIGTERM or SIGINT (or `timeout`); returns the signal number, 0 on timeout.
int WaitForShutdownSignal(absl::Duration timeout = absl::InfiniteDuration());

absl::Status WritePortFile(const std::string& path, int grpc_port, int http_port);

// Runs a service until SIGTERM/SIGINT: starts the HTTP exposer and the gRPC server, writes
// the port file, marks the service ready, waits, drains. `on_drain` runs after readiness
// turns off and before the gRPC server shuts down. `http_routes` are served on the HTTP port
// beside the observability ones. Returns the process exit code.
int RunService(const ServiceOptions& options, std::vector<grpc::Service*> services,
               metrics::Registry* registry, metrics::HealthState* health,
               std::function<void()> on_drain = nullptr, std::vector<http::Route> http_routes = {});

}  // namespace tandem::rpc
