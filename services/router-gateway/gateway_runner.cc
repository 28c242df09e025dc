#include "services/router-gateway/gateway_runner.h"

#include <algorithm>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/util/logging.h"
#include "services/router-gateway/openai_api.h"

ABSL_FLAG(int64_t, max_prompt_bytes, 1 << 20, "Largest prompt accepted, in bytes.");
ABSL_FLAG(int, max_inflight, 256,
          "Generations dispatched at once (gRPC and HTTP together); more wait in the queue.");
ABSL_FLAG(int, max_queued, 4096,
          "Generations waiting for a place (first come, first served); more are refused with "
          "RESOURCE_EXHAUSTED (HTTP 429).");
ABSL_FLAG(double, queue_timeout_s, 120,
          "Seconds a generation may wait for a place (in the gateway's queue, or because every "
          "prefill queue or decode pool is full) before it is refused with RESOURCE_EXHAUSTED.");

namespace tandem::gateway {

absl::Status ApplyGatewayFlags(GatewayConfig* config) {
  const int64_t max_prompt_bytes = absl::GetFlag(FLAGS_max_prompt_bytes);
  if (max_prompt_bytes < 1 || max_prompt_bytes > (int64_t{64} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_prompt_bytes=", max_prompt_bytes, " must be in [1, 64 MiB]"));
  }
  config->max_prompt_bytes = static_cast<size_t>(max_prompt_bytes);
  const int max_inflight = absl::GetFlag(FLAGS_max_inflight);
  if (max_inflight < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_inflight=", max_inflight, " must be >= 1"));
  }
  config->max_inflight = max_inflight;
  const int max_queued = absl::GetFlag(FLAGS_max_queued);
  if (max_queued < 0 || max_queued > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_queued=", max_queued, " must be within [0, 1000000]"));
  }
  config->max_queued = max_queued;
  const double queue_timeout = absl::GetFlag(FLAGS_queue_timeout_s);
  if (!(queue_timeout >= 0 && queue_timeout <= 3600)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--queue_timeout_s=", queue_timeout, " must be within [0, 3600]"));
  }
  config->queue_timeout = absl::Seconds(queue_timeout);
  return absl::OkStatus();
}

int RunGateway(const rpc::ServiceOptions& options, GatewayService* service,
               const std::string& model_dir, metrics::Registry* registry,
               metrics::HealthState* health, serving::GatewayMetrics* metrics) {
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::Load(model_dir);
  if (!chat.ok() && chat.status().code() != absl::StatusCode::kNotFound) {
    TANDEM_LOG(ERROR) << options.name << ": " << chat.status();
    return 2;
  }
  if (!chat.ok()) {
    TANDEM_LOG(INFO) << options.name << ": " << chat.status().message();
  }
  OpenAiApi api(service, std::move(chat), metrics);
  // A request body holds the prompt, JSON-escaped (up to twice as long), and its fields.
  rpc::ServiceOptions with_body = options;
  with_body.http_max_body_bytes = std::max<size_t>(
      options.http_max_body_bytes, 2 * service->config().max_prompt_bytes + (64 << 10));
  return rpc::RunService(
      with_body, {service}, registry, health, [&] { service->Drain(options.drain_timeout); },
      api.Routes());
}

}  // namespace tandem::gateway
