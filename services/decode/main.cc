// tandem-decode: decodes from the KV cache prefill wrote, with the retained experts only.
#include <iostream>

#include "absl/flags/flag.h"
#include "common/kv/geometry.h"
#include "common/rpc/service_flags.h"
#include "services/decode/decode_service.h"

ABSL_FLAG(std::string, model, "models/tiny-moe", "Model directory (Hugging Face layout).");
ABSL_FLAG(int, kv_block_size, 16, "Tokens per KV-cache block; must match the prefill instances.");

int main(int argc, char** argv) {
  const tandem::config::ProgramInfo program{
      "tandem-decode",
      "continuous-batching decode from the KV cache prefill wrote",
      "TANDEM_DECODE_",
      {"services/decode/", tandem::rpc::kServiceFlagsSource}};
  const tandem::rpc::ServiceOptions options = tandem::rpc::InitService(argc, argv, program);
  auto model =
      tandem::kv::LoadInstanceModel(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_kv_block_size));
  if (!model.ok()) {
    std::cerr << program.name << ": --model=" << absl::GetFlag(FLAGS_model) << ": "
              << model.status().message() << "\n";
    return 2;
  }
  tandem::metrics::Registry registry(tandem::metrics::Labels{{"role", "decode"}});
  tandem::metrics::HealthState health;
  tandem::rpc::RpcMetrics rpc_metrics(&registry);
  tandem::decode::DecodeService service(model->name, model->geometry, &rpc_metrics);
  return tandem::rpc::RunService(options, {&service}, &registry, &health);
}
