// tandem-gateway: the public entry point. Accepts client requests, picks a decode and a
// prefill instance, runs reserve -> prefill -> decode, and streams the tokens back.
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/config.h"
#include "common/model/model_dir.h"
#include "common/rpc/internal_auth.h"
#include "common/rpc/service_flags.h"
#include "services/router-gateway/dispatcher.h"
#include "services/router-gateway/gateway_runner.h"
#include "services/router-gateway/gateway_service.h"

ABSL_FLAG(std::string, model, "models/tiny-moe",
          "Model directory: its tokenizer and config (the gateway holds no weights).");
ABSL_FLAG(std::vector<std::string>, prefill, {},
          "Prefill instances, comma-separated host:port (gRPC).");
ABSL_FLAG(std::vector<std::string>, decode, {},
          "Decode instances, comma-separated host:port (gRPC).");
ABSL_FLAG(double, resolve_interval_s, 10.0,
          "Seconds between resolutions of the --prefill/--decode host names: a name with several "
          "addresses (a Kubernetes headless Service) is one instance per address, and instances "
          "come and go with it. 0: resolve only at start-up.");
ABSL_FLAG(double, health_interval_s, 0.5,
          "Seconds between health checks of every instance (GetInfo, each due within this "
          "interval, at most 2 s): an instance that fails its last check is tried last, so an "
          "unreachable host stops getting requests within about one interval.");

ABSL_FLAG(double, stream_idle_timeout_s, 10.0,
          "A decode stream that shows no life (no token, no keep-alive) for this many seconds "
          "ends with UNAVAILABLE: a stalled or cut-off decode host.");

ABSL_FLAG(std::string, prefill_routing, "kv_aware",
          "How a prompt's prefill instance is chosen: kv_aware (the fewest tokens to compute, "
          "given the prompt blocks sent there before, plus the tokens in flight there) or load "
          "(the least loaded); docs/kv-cache.md \"KV-aware routing\".");
ABSL_FLAG(double, routing_load_weight, 1.0,
          "kv_aware routing: the cost of a prompt token in flight at an instance against a "
          "token it would compute; within [0, 1000].");
ABSL_FLAG(std::string, internal_tls_root_certs_file, "",
          "PEM CA certificates: dial prefill and decode over TLS and verify their certificates "
          "with these. Empty: plaintext.");
ABSL_FLAG(std::string, internal_tls_cert_file, "",
          "With --internal_tls_root_certs_file: the gateway's client certificate chain (PEM), for "
          "instances that require mutual TLS (their --tls_client_ca_file).");
ABSL_FLAG(std::string, internal_tls_key_file, "", "PEM private key of --internal_tls_cert_file.");
ABSL_FLAG(std::string, internal_tls_server_name, "",
          "The name prefill's and decode's certificates carry, when it is not the address dialled "
          "(instances are dialled by IP address after DNS resolution).");

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": cannot read"));
  std::string pem((std::istreambuf_iterator<char>(in)), {});
  if (pem.find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": not PEM"));
  }
  return pem;
}

int Fail(const std::string& message) {
  std::cerr << "tandem-gateway: " << message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const tandem::config::ProgramInfo program{
      "tandem-gateway",
      "public API: dispatches requests to prefill and decode instances",
      "TANDEM_GATEWAY_",
      {"services/router-gateway/", tandem::rpc::kServiceFlagsSource,
       tandem::gateway::kGatewayFlagsSource}};
  const tandem::rpc::ServiceOptions options = tandem::rpc::InitService(argc, argv, program);

  const std::string model_dir = absl::GetFlag(FLAGS_model);
  auto dir = tandem::model::ModelDir::Open(model_dir);
  if (!dir.ok()) return Fail("--model: " + std::string(dir.status().message()));
  auto tokenizer = (*dir)->tokenizer();
  if (!tokenizer.ok()) return Fail("--model: " + std::string(tokenizer.status().message()));
  tandem::gateway::GatewayConfig config;
  if (absl::Status s = tandem::gateway::ApplyGatewayFlags(**dir, &config); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  for (const auto& [flag, targets, out] :
       {std::tuple{"--prefill", absl::GetFlag(FLAGS_prefill), &config.prefill_targets},
        std::tuple{"--decode", absl::GetFlag(FLAGS_decode), &config.decode_targets}}) {
    for (const std::string& target : targets) {
      std::vector<std::string> parts = absl::StrSplit(target, ':');
      int port = 0;
      if (parts.size() != 2 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &port) || port < 1 ||
          port > 65535) {
        return Fail(std::string(flag) + ": '" + target + "' is not host:port");
      }
      out->push_back(target);
    }
  }

  tandem::metrics::Registry registry(tandem::serving::ServiceLabels("gateway", model_dir));
  tandem::metrics::HealthState health;
  tandem::rpc::RpcMetrics rpc_metrics(&registry);
  tandem::serving::GatewayMetrics serving_metrics(&registry);
  const double resolve_interval = absl::GetFlag(FLAGS_resolve_interval_s);
  if (!(resolve_interval >= 0 && resolve_interval <= 3600)) {
    return Fail("--resolve_interval_s must be within [0, 3600]");
  }
  auto instances = registry.AddGauge("tandem_gateway_instances",
                                     "Prefill and decode instances the gateway dispatches to.");
  if (!instances.ok()) return Fail(std::string(instances.status().message()));
  tandem::metrics::Gauge* prefill_instances = &(*instances)->Add({{"kind", "prefill"}});
  tandem::metrics::Gauge* decode_instances = &(*instances)->Add({{"kind", "decode"}});
  auto healthy =
      registry.AddGauge("tandem_gateway_healthy_instances",
                        "Prefill and decode instances that answered their last health check.");
  if (!healthy.ok()) return Fail(std::string(healthy.status().message()));
  tandem::metrics::Gauge* healthy_prefill = &(*healthy)->Add({{"kind", "prefill"}});
  tandem::metrics::Gauge* healthy_decode = &(*healthy)->Add({{"kind", "decode"}});
  auto retries = registry.AddCounter(
      "tandem_gateway_prefill_retries_total",
      "Failed prefills or KV transfers tried again on another prefill instance.");
  if (!retries.ok()) return Fail(std::string(retries.status().message()));
  tandem::metrics::Counter* prefill_retries = &(*retries)->Add({});
  tandem::gateway::DispatcherOptions dispatcher_options;
  dispatcher_options.resolve_interval = absl::Seconds(resolve_interval);
  const double health_interval = absl::GetFlag(FLAGS_health_interval_s);
  if (!(health_interval >= 0.05 && health_interval <= 3600)) {
    return Fail("--health_interval_s must be within [0.05, 3600]");
  }
  dispatcher_options.health_interval = absl::Seconds(health_interval);
  dispatcher_options.on_health = [=](size_t prefill, size_t decode) {
    healthy_prefill->Set(static_cast<double>(prefill));
    healthy_decode->Set(static_cast<double>(decode));
  };
  dispatcher_options.on_retry = [prefill_retries] { prefill_retries->Increment(); };
  const double idle = absl::GetFlag(FLAGS_stream_idle_timeout_s);
  if (!(idle >= 0.1 && idle <= 3600))
    return Fail("--stream_idle_timeout_s must be within [0.1, 3600]");
  dispatcher_options.stream_idle_timeout = absl::Seconds(idle);
  if (!options.internal_secret.empty()) {
    dispatcher_options.call_metadata.emplace_back(
        tandem::rpc::kAuthorizationHeader,
        tandem::rpc::InternalAuth(options.internal_secret).HeaderValue());
  }
  const std::string roots = absl::GetFlag(FLAGS_internal_tls_root_certs_file);
  const std::string client_cert = absl::GetFlag(FLAGS_internal_tls_cert_file);
  const std::string client_key = absl::GetFlag(FLAGS_internal_tls_key_file);
  if (client_cert.empty() != client_key.empty() || (!client_cert.empty() && roots.empty())) {
    return Fail(
        "--internal_tls_cert_file and --internal_tls_key_file go together, with "
        "--internal_tls_root_certs_file");
  }
  if (!roots.empty()) {
    grpc::SslCredentialsOptions ssl;
    auto pem = ReadPem("internal_tls_root_certs_file", roots);
    if (!pem.ok()) return Fail(std::string(pem.status().message()));
    ssl.pem_root_certs = *pem;
    if (!client_cert.empty()) {
      auto cert = ReadPem("internal_tls_cert_file", client_cert);
      auto key = ReadPem("internal_tls_key_file", client_key);
      if (!cert.ok() || !key.ok()) {
        return Fail(std::string((cert.ok() ? key.status() : cert.status()).message()));
      }
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    dispatcher_options.credentials = grpc::SslCredentials(ssl);
    dispatcher_options.tls_server_name = absl::GetFlag(FLAGS_internal_tls_server_name);
  }
  const auto routing = tandem::gateway::ParsePrefillRouting(absl::GetFlag(FLAGS_prefill_routing));
  if (!routing.ok()) return Fail(std::string(routing.status().message()));
  dispatcher_options.prefill_routing = *routing;
  const double load_weight = absl::GetFlag(FLAGS_routing_load_weight);
  if (!(load_weight >= 0 && load_weight <= 1000)) {
    return Fail("--routing_load_weight must be within [0, 1000]");
  }
  dispatcher_options.routing_load_weight = load_weight;
  auto decisions = registry.AddCounter(
      "tandem_gateway_routing_decisions_total",
      "Prefill instance choices by reason: prefix (it holds some of the prompt), load (none "
      "does), load_over_prefix (another holds more, but its queue costs more).");
  if (!decisions.ok()) return Fail(std::string(decisions.status().message()));
  tandem::metrics::Counter* by_reason[] = {&(*decisions)->Add({{"reason", "prefix"}}),
                                           &(*decisions)->Add({{"reason", "load"}}),
                                           &(*decisions)->Add({{"reason", "load_over_prefix"}})};
  dispatcher_options.on_routing = [by_reason](tandem::gateway::RoutingReason reason) {
    by_reason[static_cast<int>(reason)]->Increment();
  };
  dispatcher_options.on_instances = [=](size_t prefill, size_t decode) {
    prefill_instances->Set(static_cast<double>(prefill));
    decode_instances->Set(static_cast<double>(decode));
  };
  auto dispatcher = std::make_unique<tandem::gateway::Dispatcher>(
      config.prefill_targets, config.decode_targets, dispatcher_options);
  tandem::gateway::GatewayService service(std::move(config), *std::move(tokenizer),
                                          std::move(dispatcher), &rpc_metrics, &serving_metrics);
  return tandem::gateway::RunGateway(options, &service, **dir, &registry, &health,
                                     &serving_metrics);
}
