// tandem-prefill: runs the full expert pool over prompts and ships their KV cache to decode.
#include <algorithm>
#include <iostream>

#include "absl/flags/flag.h"
#include "common/kv/geometry.h"
#include "common/kv/ucx_transport.h"
#include "common/rpc/service_flags.h"
#include "services/common/engine_flags.h"
#include "services/common/serving.h"
#include "services/prefill/prefill_service.h"

ABSL_FLAG(std::string, model, "models/tiny-moe", "Model directory (Hugging Face layout).");
ABSL_FLAG(int, kv_block_size, 16, "Tokens per KV-cache block; must match the decode instances.");
ABSL_FLAG(int, kv_blocks, 0,
          "KV-cache blocks of the local pool (prompts being computed or shipped, and the prefix "
          "cache); 0 = 1024, or four prompts of the full context if that is more.");
ABSL_FLAG(std::string, kv_dtype, "bf16",
          "How the KV cache stores keys and values: f32, bf16 or int8 (per-token, per-head "
          "scales); must match the decode instances (docs/kv-cache.md).");
ABSL_FLAG(int, max_queue, 64,
          "Prompts in the instance at most (waiting, computing or shipping); more are refused "
          "(RESOURCE_EXHAUSTED).");
ABSL_FLAG(int, max_running, 16, "Prompts in the engine's batch at once.");
ABSL_FLAG(int, prefill_chunk, 512,
          "Prompt tokens one engine step runs, all prompts of the batch together; at least "
          "--max_running.");
ABSL_FLAG(bool, prefix_cache, true,
          "Reuse the KV of prompt prefixes already computed (full blocks, kept while unused and "
          "evicted least recently used); docs/kv-cache.md \"Prefix cache\".");
ABSL_FLAG(int, prefix_state_snapshots, 32,
          "With a model whose recurrent layers keep state (Gated DeltaNet): copies of a "
          "sequence's state kept at block boundaries, from which a cached prefix resumes, each "
          "the model's state bytes per sequence (logged at start-up); the least recently used "
          "goes first. 0 turns the prefix cache off for such a model.");
ABSL_FLAG(std::string, kv_listen_host, "127.0.0.1",
          "IPv4 address the KV transport listens on (port chosen by the system).");
ABSL_FLAG(std::string, kv_transports, "tcp",
          "UCX transports (UCX_TLS) for KV transfer, e.g. tcp or sm,tcp (shared memory between "
          "processes on one host, several GB/s; needs --kv_detect_dead_peers=false).");
ABSL_FLAG(int64_t, kv_chunk_bytes, 256 << 10,
          "Bytes of KV per transport message (the send window holds 16 of them).");
ABSL_FLAG(bool, kv_detect_dead_peers, true,
          "UCX peer failure detection; UCX 1.13 then uses TCP only. Without it a dead peer is "
          "noticed by the transfer deadline.");

ABSL_FLAG(int64_t, testing_stop_after_kv_bytes, 0,
          "For fault tests only: the process stops itself (SIGSTOP), once, when a KV transfer "
          "reaches this many bytes, to be resumed (SIGCONT) by the test; 0: never.");

int main(int argc, char** argv) {
  const tandem::config::ProgramInfo program{
      "tandem-prefill",
      "full-expert chunked prefill that ships the KV cache to decode",
      "TANDEM_PREFILL_",
      {"services/prefill/", tandem::rpc::kServiceFlagsSource, tandem::serving::kEngineFlagsSource}};
  const tandem::rpc::ServiceOptions options = tandem::rpc::InitService(argc, argv, program);
  auto fail = [&](const std::string& what, const absl::Status& status) {
    std::cerr << program.name << ": " << what << ": " << status.message() << "\n";
    return 2;
  };
  const auto kv_dtype = tandem::serving::KvDtypeFlag(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) return fail("flags", kv_dtype.status());
  const auto engine_flags = tandem::serving::ReadEngineFlags();
  if (!engine_flags.ok()) return fail("flags", engine_flags.status());
  auto dir = tandem::model::ModelDir::Open(absl::GetFlag(FLAGS_model));
  if (!dir.ok()) return fail("--model=" + absl::GetFlag(FLAGS_model), dir.status());
  auto model = tandem::kv::LoadInstanceModel(**dir, absl::GetFlag(FLAGS_kv_block_size), *kv_dtype,
                                             engine_flags->window_rings);
  if (!model.ok()) return fail("--model=" + absl::GetFlag(FLAGS_model), model.status());
  const int block_size = absl::GetFlag(FLAGS_kv_block_size);
  int blocks = absl::GetFlag(FLAGS_kv_blocks);
  if (blocks <= 0) {
    const int context_blocks =
        static_cast<int>((model->config.max_position_embeddings + block_size - 1) / block_size);
    blocks = std::max(1024, 4 * context_blocks);
  }
  auto engine = tandem::serving::LoadServingEngine(
      **dir, {.block_size = block_size,
              .num_blocks = blocks,
              .memory_bytes = engine_flags->memory_bytes,
              .kv_dtype = *kv_dtype,
              // the prompts running, and those whose KV
              // (and recurrent state) is being shipped
              .max_sequences = 2 * absl::GetFlag(FLAGS_max_running),
              .load = engine_flags->load,
              .state_snapshots = absl::GetFlag(FLAGS_prefix_state_snapshots),
              .window_rings = engine_flags->window_rings});
  if (!engine.ok()) return fail("loading the engine", engine.status());
  dir->reset();  // the engine holds its own copies of the weights and the tokenizer
  tandem::kv::UcxTransportOptions kv_options;
  kv_options.listen_host = absl::GetFlag(FLAGS_kv_listen_host);
  kv_options.transports = absl::GetFlag(FLAGS_kv_transports);
  kv_options.detect_dead_peers = absl::GetFlag(FLAGS_kv_detect_dead_peers);
  const int64_t chunk = absl::GetFlag(FLAGS_kv_chunk_bytes);
  if (chunk < 1024 || chunk > (int64_t{64} << 20)) {
    return fail("--kv_chunk_bytes", absl::InvalidArgumentError("must be within [1 KiB, 64 MiB]"));
  }
  kv_options.chunk_bytes = static_cast<size_t>(chunk);
  auto transport = tandem::kv::UcxTransport::Create(kv_options);
  if (!transport.ok()) return fail("the KV transport", transport.status());

  tandem::metrics::Registry registry(
      tandem::serving::ServiceLabels("prefill", absl::GetFlag(FLAGS_model)));
  tandem::metrics::HealthState health;
  tandem::rpc::RpcMetrics rpc_metrics(&registry);
  tandem::serving::PrefillMetrics serving_metrics(&registry);
  tandem::serving::PrefixCacheMetrics prefix_metrics(&registry);
  tandem::serving::ReportEngine(*engine->model.weights, &registry);
  tandem::serving::ReportKvCache(*engine->pool, &registry);
  auto service = tandem::prefill::PrefillService::Create(
      model->name, model->geometry, engine->forward.get(), engine->model.tokenizer.get(),
      transport->get(),
      {.max_queue = absl::GetFlag(FLAGS_max_queue),
       .max_running = absl::GetFlag(FLAGS_max_running),
       .chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk),
       .prefix_cache = absl::GetFlag(FLAGS_prefix_cache),
       .stop_after_kv_bytes = absl::GetFlag(FLAGS_testing_stop_after_kv_bytes),
       .internal_secret = options.internal_secret},
      &rpc_metrics, &serving_metrics, &prefix_metrics);
  if (!service.ok()) return fail("flags", service.status());
  return tandem::rpc::RunService(options, {service->get()}, &registry, &health);
}
