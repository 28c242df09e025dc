// tandem-decode: decodes from the KV cache prefill wrote, with continuous batching over every
// running sequence. Its KV pool is registered with the UCX transport once; Reserve hands out
// blocks of it for prefill instances to write into.
#include <iostream>

#include "absl/flags/flag.h"
#include "common/engine/engine_loop.h"
#include "common/kv/geometry.h"
#include "common/kv/inbox.h"
#include "common/kv/ucx_transport.h"
#include "common/rpc/service_flags.h"
#include "services/common/decoder.h"
#include "services/common/engine_flags.h"
#include "services/common/serving.h"
#include "services/decode/decode_service.h"

ABSL_FLAG(std::string, model, "models/tiny-moe", "Model directory (Hugging Face layout).");
ABSL_FLAG(std::string, plan, "",
          "Pruning plan (tandem prune): decode only its retained experts, loading no others; "
          "with tiers (tandem tier), at mixed width (--model must then be reordered).");
ABSL_FLAG(std::string, overlay, "",
          "Decoder overlay (tools/train/distill.py): the distilled always-on tensors (norms, "
          "routers, shared experts) of --plan's decoder, applied on load; refused unless made "
          "for this --model and --plan.");
ABSL_FLAG(std::string, expert_pack, "",
          "Stream expert weights from this expert pack (tandem pack) instead of loading them.");
ABSL_FLAG(int64_t, expert_cache_bytes, 0,
          "With --expert_pack: the resident expert cache's bound, in bytes.");
ABSL_FLAG(bool, expert_direct_io, true,
          "With --expert_pack: read it with O_DIRECT (bypassing the page cache); else hold it in "
          "host memory.");
ABSL_FLAG(bool, expert_overlap, true,
          "With --expert_pack: compute each expert as soon as it is loaded, widest first.");
ABSL_FLAG(int, kv_block_size, 16, "Tokens per KV-cache block; must match the prefill instances.");
ABSL_FLAG(int, kv_blocks, 1024, "KV-cache blocks in the pool (shared by all sequences).");
ABSL_FLAG(std::string, kv_dtype, "bf16",
          "How the KV cache stores keys and values: f32, bf16 or int8 (per-token, per-head "
          "scales); must match the prefill instances (docs/kv-cache.md).");
ABSL_FLAG(int, max_running, 64, "Sequences decoded together at most.");
ABSL_FLAG(int, max_step_tokens, 512, "Tokens one engine step runs at most.");
ABSL_FLAG(int, lease_ms, 30000,
          "A reservation is freed if Decode has not claimed it by then (the gateway gives prefill "
          "this long, less a margin).");
ABSL_FLAG(int, heartbeat_ms, 2000,
          "A decode stream with nothing to say for this long sends a keep-alive, so the gateway "
          "can tell a silent host from a busy one.");
ABSL_FLAG(std::string, kv_listen_host, "127.0.0.1",
          "IPv4 address the KV transport listens on (port chosen by the system).");
ABSL_FLAG(std::string, kv_transports, "tcp",
          "UCX transports (UCX_TLS) for KV transfer, e.g. tcp or sm,tcp (shared memory between "
          "processes on one host, several GB/s; needs --kv_detect_dead_peers=false).");
ABSL_FLAG(bool, kv_detect_dead_peers, true,
          "UCX peer failure detection; UCX 1.13 then uses TCP only. Without it a dead peer is "
          "noticed by the transfer deadline.");

int main(int argc, char** argv) {
  const tandem::config::ProgramInfo program{
      "tandem-decode",
      "continuous-batching decode from the KV cache prefill wrote",
      "TANDEM_DECODE_",
      {"services/decode/", tandem::rpc::kServiceFlagsSource, tandem::serving::kEngineFlagsSource}};
  const tandem::rpc::ServiceOptions options = tandem::rpc::InitService(argc, argv, program);
  auto fail = [&](const std::string& what, const absl::Status& status) {
    std::cerr << program.name << ": " << what << ": " << status.message() << "\n";
    return 2;
  };
  if (absl::GetFlag(FLAGS_lease_ms) < 1 || absl::GetFlag(FLAGS_heartbeat_ms) < 1) {
    return fail("flags", absl::InvalidArgumentError("--lease_ms and --heartbeat_ms must be >= 1"));
  }
  const auto kv_dtype = tandem::serving::KvDtypeFlag(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) return fail("flags", kv_dtype.status());
  const auto engine_flags = tandem::serving::ReadEngineFlags();
  if (!engine_flags.ok()) return fail("flags", engine_flags.status());
  auto dir = tandem::model::ModelDir::Open(absl::GetFlag(FLAGS_model));
  if (!dir.ok()) return fail("--model=" + absl::GetFlag(FLAGS_model), dir.status());
  auto model = tandem::kv::LoadInstanceModel(**dir, absl::GetFlag(FLAGS_kv_block_size), *kv_dtype,
                                             engine_flags->window_rings);
  if (!model.ok()) return fail("--model=" + absl::GetFlag(FLAGS_model), model.status());
  auto decoder = tandem::serving::LoadDecoder(
      **dir, absl::GetFlag(FLAGS_kv_block_size), absl::GetFlag(FLAGS_kv_blocks),
      {.plan = absl::GetFlag(FLAGS_plan),
       .overlay = absl::GetFlag(FLAGS_overlay),
       .expert_pack = absl::GetFlag(FLAGS_expert_pack),
       .expert_cache_bytes = absl::GetFlag(FLAGS_expert_cache_bytes),
       .expert_direct_io = absl::GetFlag(FLAGS_expert_direct_io),
       .expert_overlap = absl::GetFlag(FLAGS_expert_overlap),
       .kv_dtype = *kv_dtype,
       .load = engine_flags->load,
       .memory_bytes = engine_flags->memory_bytes,
       // the sequences decoding, and the reservations waiting for their prefill
       .max_sequences = 2 * absl::GetFlag(FLAGS_max_running),
       .window_rings = engine_flags->window_rings});
  if (!decoder.ok()) return fail("loading the engine", decoder.status());
  dir->reset();  // the engine holds its own copies of the weights and the tokenizer
  tandem::serving::ServingEngine* engine = &decoder->engine;
  // Decode runs only what it holds: every token here is a decode token (prefill wrote the
  // prompts' KV), but the plan on both phases keeps any step within the loaded experts.
  const tandem::engine::MoeOptions moe = decoder->decode_moe();
  auto scheduler = tandem::engine::Scheduler::Create(
      engine->forward.get(), engine->model.tokenizer.get(), engine->model.tokenizer->eos_id(),
      {.max_running = absl::GetFlag(FLAGS_max_running),
       .max_step_tokens = absl::GetFlag(FLAGS_max_step_tokens),
       .prefill = moe,
       .decode = moe});
  if (!scheduler.ok()) return fail("the scheduler", scheduler.status());
  tandem::kv::UcxTransportOptions kv_options;
  kv_options.listen_host = absl::GetFlag(FLAGS_kv_listen_host);
  kv_options.transports = absl::GetFlag(FLAGS_kv_transports);
  kv_options.detect_dead_peers = absl::GetFlag(FLAGS_kv_detect_dead_peers);
  auto transport = tandem::kv::UcxTransport::Create(kv_options);
  if (!transport.ok()) return fail("the KV transport", transport.status());
  tandem::metrics::Registry registry(
      tandem::serving::ServiceLabels("decode", absl::GetFlag(FLAGS_model)));
  tandem::serving::DecodeMetrics serving_metrics(&registry);
  // The only way KV reaches the pool: through a reservation's inbox, while it lasts.
  tandem::kv::KvInbox inbox(engine->pool.get(), [&serving_metrics](uint64_t bytes) {
    serving_metrics.kv_dropped_bytes->Increment(static_cast<double>(bytes));
  });
  if (absl::Status s = (*transport)->SetReceiver(&inbox); !s.ok()) {
    return fail("the KV transport", s);
  }
  tandem::serving::ExpertMetrics expert_metrics(&registry);
  tandem::serving::ReportResidentExperts(*engine->model.weights, &serving_metrics);
  tandem::serving::ReportOverlay(decoder->overlay.get(), &serving_metrics);
  tandem::serving::ReportEngine(*engine->model.weights, &registry);
  tandem::serving::ReportKvCache(*engine->pool, &registry);
  auto loop = tandem::engine::EngineLoop::Start(
      *std::move(scheduler),
      tandem::serving::WithExpertMetrics(
          tandem::serving::EngineStepObserver(&serving_metrics, engine->pool->num_total()),
          &*decoder, &expert_metrics));

  tandem::metrics::HealthState health;
  tandem::rpc::RpcMetrics rpc_metrics(&registry);
  int exit_code;
  {
    // Destroyed before the engine loop it uses, and before the inbox and transport go.
    tandem::decode::DecodeService service(
        model->name, model->geometry, loop.get(), &inbox, transport->get(),
        static_cast<int>(model->config.vocab_size),
        {.lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms)),
         .heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms)),
         .internal_secret = options.internal_secret},
        &rpc_metrics, &serving_metrics);
    exit_code = tandem::rpc::RunService(options, {&service}, &registry, &health);
  }
  (void)(*transport)->SetReceiver(nullptr);  // nothing reaches the inbox from here on
  loop.reset();                              // before the transport and pool go away
  return exit_code;
}
