#include "common/rpc/service_runner.h"

#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/util/logging.h"

namespace tandem::rpc {
namespace {

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const std::string& host, int port,
                                                              std::vector<grpc::Service*> services,
                                                              int max_message_bytes,
                                                              const std::string& tls_cert_chain,
                                                              const std::string& tls_private_key,
                                                              const std::string& tls_client_ca) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("grpc port ", port, " out of range"));
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!tls_cert_chain.empty() && !tls_private_key.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({tls_private_key, tls_cert_chain});
    if (!tls_client_ca.empty()) {
      ssl.pem_root_certs = tls_client_ca;
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    credentials = grpc::SslServerCredentials(ssl);
  }
  builder.AddListeningPort(absl::StrCat(host, ":", port), credentials, &bound_port);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  builder.SetMaxSendMessageSize(max_message_bytes);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for gRPC on ", host, ":", port));
  }
  return std::unique_ptr<GrpcServer>(new GrpcServer(std::move(server), bound_port));
}

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

void GrpcServer::Shutdown(absl::Duration deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  server_->Shutdown(absl::ToChronoTime(absl::Now() + deadline));
  server_->Wait();
}

void BlockShutdownSignals() {
  sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForShutdownSignal(absl::Duration timeout) {
  sigset_t set = ShutdownSignals();
  if (timeout == absl::InfiniteDuration()) {
    int sig = 0;
    while (sigwait(&set, &sig) != 0) {
    }
    return sig;
  }
  const timespec ts = absl::ToTimespec(timeout);
  while (true) {
    const int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig > 0) return sig;
    if (errno == EAGAIN) return 0;
    if (errno != EINTR) return 0;
  }
}

absl::Status WritePortFile(const std::string& path, int grpc_port, int http_port) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "{\"grpc_port\": " << grpc_port << ", \"http_port\": " << http_port
        << ", \"pid\": " << getpid() << "}\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write port file ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename port file to ", path));
  }
  return absl::OkStatus();
}

int RunService(const ServiceOptions& options, std::vector<grpc::Service*> services,
               metrics::Registry* registry, metrics::HealthState* health,
               std::function<void()> on_drain, std::vector<http::Route> http_routes) {
  http::ServerOptions http_options;
  http_options.host = options.host;
  http_options.port = options.http_port;
  http_options.num_threads = options.http_threads;
  http_options.max_connections = options.http_max_connections;
  http_options.max_body_bytes = options.http_max_body_bytes;
  auto exposer = metrics::StartExposer(http_options, registry, health, std::move(http_routes));
  if (!exposer.ok()) {
    TANDEM_LOG(ERROR) << options.name << ": " << exposer.status();
    return 1;
  }
  auto server =
      GrpcServer::Start(options.host, options.grpc_port, services, options.max_message_bytes,
                        options.tls_cert_chain, options.tls_private_key, options.tls_client_ca);
  if (!server.ok()) {
    TANDEM_LOG(ERROR) << options.name << ": " << server.status();
    return 1;
  }
  if (!options.port_file.empty()) {
    if (absl::Status s = WritePortFile(options.port_file, (*server)->port(), (*exposer)->port());
        !s.ok()) {
      TANDEM_LOG(ERROR) << options.name << ": " << s;
      return 1;
    }
  }
  health->SetReady(true);
  TANDEM_LOG(INFO) << options.name << " ready: gRPC on " << options.host << ":" << (*server)->port()
                   << ", metrics on http://" << options.host << ":" << (*exposer)->port()
                   << "/metrics";
  const int sig = WaitForShutdownSignal();
  TANDEM_LOG(INFO) << options.name << ": signal " << sig << ", draining (up to "
                   << absl::FormatDuration(options.drain_timeout) << ")";
  health->SetDraining();
  if (on_drain) on_drain();
  (*server)->Shutdown(options.drain_timeout);
  exposer->reset();
  TANDEM_LOG(INFO) << options.name << ": stopped";
  return 0;
}

}  // namespace tandem::rpc
