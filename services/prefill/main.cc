// tandem-prefill: runs the full expert pool over prompts and ships their KV cache to decode.
#include <iostream>

#include "absl/flags/flag.h"
#include "common/kv/geometry.h"
#include "common/rpc/service_flags.h"
#include "services/prefill/prefill_service.h"

ABSL_FLAG(std::string, model, "models/tiny-moe", "Model directory (Hugging Face layout).");
ABSL_FLAG(int, kv_block_size, 16, "Tokens per KV-cache block; must match the decode instances.");

int main(int argc, char** argv) {
  const tandem::config::ProgramInfo program{
      "tandem-prefill",
      "full-expert chunked prefill; ships the KV cache to decode",
      "TANDEM_PREFILL_",
      {"services/prefill/", tandem::rpc::kServiceFlagsSource}};
  const tandem::rpc::ServiceOptions options = tandem::rpc::InitService(argc, argv, program);
  auto model =
      tandem::kv::LoadInstanceModel(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_kv_block_size));
  if (!model.ok()) {
    std::cerr << program.name << ": --model=" << absl::GetFlag(FLAGS_model) << ": "
              << model.status().message() << "\n";
    return 2;
  }
  tandem::metrics::Registry registry(tandem::metrics::Labels{{"role", "prefill"}});
  tandem::metrics::HealthState health;
  tandem::rpc::RpcMetrics rpc_metrics(&registry);
  tandem::prefill::PrefillService service(model->name, model->geometry, &rpc_metrics);
  return tandem::rpc::RunService(options, {&service}, &registry, &health);
}
