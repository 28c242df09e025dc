// What tandem-gateway and tandem-serve share: the public API's own flags and running the
// gateway service, gRPC and the OpenAI-compatible HTTP front together.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/metrics/exposer.h"
#include "common/metrics/metrics.h"
#include "common/model/model_dir.h"
#include "common/rpc/service_runner.h"
#include "services/common/serving_metrics.h"
#include "services/router-gateway/gateway_service.h"

namespace tandem::gateway {

// Source path fragment of the flags below, for config::ProgramInfo::flag_sources.
inline constexpr char kGatewayFlagsSource[] = "services/router-gateway/gateway_runner.cc";

// Sets `config`'s model (name, config, generation defaults) from `dir`, and reads
// --max_prompt_bytes, --max_inflight, --max_queued and --queue_timeout_s into it;
// INVALID_ARGUMENT for bad values.
absl::Status ApplyGatewayFlags(const model::ModelDir& dir, GatewayConfig* config);

// Runs `service` until SIGTERM/SIGINT (rpc::RunService) with the OpenAI front on the HTTP
// port, chatting with `dir`'s chat template if it has one (or --chat_template's),
// replies parsed for reasoning and tool calls as --reasoning_parser / --tool_call_parser say. On a
// signal the gateway drains (gRPC and HTTP requests alike), then the servers stop. Returns the
// process exit code.
int RunGateway(const rpc::ServiceOptions& options, GatewayService* service,
               const model::ModelDir& dir, metrics::Registry* registry,
               metrics::HealthState* health, serving::GatewayMetrics* metrics);

}  // namespace tandem::gateway
