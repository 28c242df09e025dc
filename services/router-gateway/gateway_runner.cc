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
ABSL_FLAG(std::string, chat_template, "",
          "A Jinja chat template file to use instead of the model's (chat_template.jinja or "
          "tokenizer_config.json's chat_template).");
ABSL_FLAG(std::string, reasoning_parser, "auto",
          "How chat replies carry reasoning: think (<think>...</think>, returned as "
          "reasoning_content), none, or auto (think when the chat template writes <think>).");
ABSL_FLAG(std::string, tool_call_parser, "auto",
          "How chat replies carry tool calls: hermes (<tool_call>{json}</tool_call>), none, or "
          "auto (hermes when the chat template writes <tool_call>).");

namespace tandem::gateway {

absl::Status ApplyGatewayFlags(const model::ModelDir& dir, GatewayConfig* config) {
  config->model_name = dir.name();
  config->model_config = dir.config();
  config->generation = dir.generation();
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
               const model::ModelDir& dir, metrics::Registry* registry,
               metrics::HealthState* health, serving::GatewayMetrics* metrics) {
  ModelFront front;
  front.chat_template = chat::ChatTemplate::Load(dir, absl::GetFlag(FLAGS_chat_template));
  if (!front.chat_template.ok() &&
      front.chat_template.status().code() != absl::StatusCode::kNotFound) {
    TANDEM_LOG(ERROR) << options.name << ": " << front.chat_template.status();
    return 2;
  }
  if (!front.chat_template.ok()) {
    TANDEM_LOG(INFO) << options.name << ": " << front.chat_template.status().message();
  }
  const std::string source = front.chat_template.ok() ? front.chat_template->source() : "";
  const std::string reasoning = absl::GetFlag(FLAGS_reasoning_parser);
  const std::string tools = absl::GetFlag(FLAGS_tool_call_parser);
  if (reasoning == "auto") {
    front.reasoning = chat::ReasoningFormatOf(source);
  } else if (absl::StatusOr<chat::ReasoningFormat> f = chat::ParseReasoningFormat(reasoning);
             f.ok()) {
    front.reasoning = *f;
  } else {
    TANDEM_LOG(ERROR) << options.name << ": --reasoning_parser: " << f.status().message();
    return 2;
  }
  if (tools == "auto") {
    front.tool_calls = chat::ToolCallFormatOf(source);
  } else if (absl::StatusOr<chat::ToolCallFormat> f = chat::ParseToolCallFormat(tools); f.ok()) {
    front.tool_calls = *f;
  } else {
    TANDEM_LOG(ERROR) << options.name << ": --tool_call_parser: " << f.status().message();
    return 2;
  }
  const GatewayConfig& config = service->config();
  front.generation = config.generation;
  front.context = static_cast<int>(config.model_config.max_position_embeddings);
  front.vocab_size = static_cast<int>(config.model_config.vocab_size);
  OpenAiApi api(service, std::move(front), metrics);
  // A request body holds the prompt, JSON-escaped (up to twice as long), and its fields.
  rpc::ServiceOptions with_body = options;
  with_body.http_max_body_bytes = std::max<size_t>(
      options.http_max_body_bytes, 2 * service->config().max_prompt_bytes + (64 << 10));
  return rpc::RunService(
      with_body, {service}, registry, health, [&] { service->Drain(options.drain_timeout); },
      api.Routes());
}

}  // namespace tandem::gateway
