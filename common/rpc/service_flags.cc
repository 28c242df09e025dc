#include "common/rpc/service_flags.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <tuple>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/kernels.h"
#include "common/kernels/cpu/thread_pool.h"
#include "common/rpc/internal_auth.h"
#include "common/util/logging.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on (gRPC and HTTP).");
ABSL_FLAG(int, grpc_port, 0, "gRPC port; 0 picks a free one (see --port_file).");
ABSL_FLAG(int, http_port, 0,
          "HTTP port for /metrics, /healthz, /readyz (and the gateway's OpenAI API); 0 picks a "
          "free one.");
ABSL_FLAG(int, http_threads, 4,
          "Threads that run HTTP handlers (parsing a request, rendering /metrics). A streaming "
          "response holds none: one event loop carries every connection.");
ABSL_FLAG(int, http_max_connections, 8192,
          "HTTP connections open at once; more are answered 503 and closed.");
ABSL_FLAG(std::string, port_file, "",
          "If set, write {\"grpc_port\",\"http_port\",\"pid\"} as JSON here once listening.");
ABSL_FLAG(double, drain_timeout_s, 10.0,
          "On SIGTERM/SIGINT, seconds in-flight requests get to finish before cancellation.");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error.");
ABSL_FLAG(int, threads, 0,
          "Threads the CPU kernels use; 0: one per CPU this process may use (its CPU affinity, "
          "capped by a cgroup CPU limit such as a container's).");
ABSL_FLAG(std::string, kernels, "",
          "CPU kernel level: auto (the fastest this CPU has), exact (the fastest that keeps "
          "activations float32), or reference, avx2, avx512, avx512vnni, avx512bf16; empty: "
          "TANDEM_KERNELS from the environment, else auto.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain; with --tls_key_file, gRPC is served over TLS only.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "With --tls_cert_file: PEM CA certificates; every gRPC client must then present a "
          "certificate they signed (mutual TLS).");
ABSL_FLAG(std::string, internal_secret_file, "",
          "File holding the internal APIs' shared secret (first line, >= 16 printable bytes): "
          "prefill and decode refuse calls without it (UNAUTHENTICATED); the gateway sends it. "
          "Use a file (a Kubernetes Secret), not the command line.");

namespace tandem::rpc {

absl::StatusOr<ServiceOptions> ServiceOptionsFromFlags(const std::string& name) {
  ServiceOptions options;
  options.name = name;
  options.host = absl::GetFlag(FLAGS_host);
  options.grpc_port = absl::GetFlag(FLAGS_grpc_port);
  options.http_port = absl::GetFlag(FLAGS_http_port);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.http_threads = absl::GetFlag(FLAGS_http_threads);
  if (options.http_threads < 1 || options.http_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_threads=", options.http_threads, " must be within [1, 256]"));
  }
  options.http_max_connections = absl::GetFlag(FLAGS_http_max_connections);
  if (options.http_max_connections < 1 || options.http_max_connections > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_max_connections=", options.http_max_connections, " must be within [1, 1000000]"));
  }
  const double drain = absl::GetFlag(FLAGS_drain_timeout_s);
  for (const auto& [flag, port] :
       {std::pair{"grpc_port", options.grpc_port}, std::pair{"http_port", options.http_port}}) {
    if (port < 0 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", port, " is not a port"));
    }
  }
  if (options.grpc_port != 0 && options.grpc_port == options.http_port) {
    return absl::InvalidArgumentError("--grpc_port and --http_port must differ");
  }
  if (!(drain >= 0 && drain <= 3600)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--drain_timeout_s=", drain, " must be within [0, 3600]"));
  }
  options.drain_timeout = absl::Seconds(drain);
  const int threads = absl::GetFlag(FLAGS_threads);
  if (threads < 0 || threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads=", threads, " must be within [0, 1024] (0: the available CPUs)"));
  }
  kernels::cpu::SetDefaultThreadCount(threads);
  if (const std::string level = absl::GetFlag(FLAGS_kernels);
      !level.empty() && !kernels::cpu::SetKernelIsa(level)) {
    return absl::InvalidArgumentError(absl::StrCat("--kernels=", level,
                                                   " is not a kernel level this CPU can run (",
                                                   kernels::cpu::KernelIsaNames(), ")"));
  }
  util::LogLevel level;
  if (!util::ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    return absl::InvalidArgumentError(absl::StrCat("--log_level=", absl::GetFlag(FLAGS_log_level),
                                                   " is not debug|info|warning|error"));
  }
  util::SetMinLogLevel(level);
  const std::string cert = absl::GetFlag(FLAGS_tls_cert_file);
  const std::string key = absl::GetFlag(FLAGS_tls_key_file);
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--tls_cert_file and --tls_key_file go together");
  }
  const std::string client_ca = absl::GetFlag(FLAGS_tls_client_ca_file);
  if (!client_ca.empty() && cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca_file needs --tls_cert_file and --tls_key_file");
  }
  if (const std::string secret = absl::GetFlag(FLAGS_internal_secret_file); !secret.empty()) {
    absl::StatusOr<std::string> read = ReadSecretFile(secret);
    if (!read.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--internal_secret_file=", read.status().message()));
    }
    options.internal_secret = *std::move(read);
  }
  for (const auto& [flag, path, out] :
       {std::tuple{"tls_cert_file", cert, &options.tls_cert_chain},
        std::tuple{"tls_key_file", key, &options.tls_private_key},
        std::tuple{"tls_client_ca_file", client_ca, &options.tls_client_ca}}) {
    if (path.empty()) continue;
    std::ifstream in(path);
    if (!in)
      return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": cannot read"));
    out->assign(std::istreambuf_iterator<char>(in), {});
    if (out->find("-----BEGIN") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": not PEM"));
    }
  }
  return options;
}

ServiceOptions InitService(int argc, char** argv, const config::ProgramInfo& program) {
  BlockShutdownSignals();
  auto args = config::ParseFlags(argc, argv, program);
  if (args.ok() && args->size() > 1) {
    args = absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", (*args)[1], "' (see --help)"));
  }
  absl::StatusOr<ServiceOptions> options =
      args.ok() ? ServiceOptionsFromFlags(program.name) : args.status();
  if (!options.ok()) {
    std::cerr << program.name << ": " << options.status().message() << "\n";
    std::exit(2);
  }
  return *std::move(options);
}

}  // namespace tandem::rpc
