// tandem-serve: colocated mode for a single machine. One process serves the public gateway API
// (Generate, GenerateStream, Tokenize, ListModels) on an engine of its own: prefill and decode
// share one continuous batch and one KV pool, so the KV cache never moves.
#include <filesystem>
#include <iostream>

#include "absl/flags/flag.h"
#include "common/engine/engine_loop.h"
#include "common/model/model_dir.h"
#include "common/rpc/service_flags.h"
#include "services/common/decoder.h"
#include "services/common/engine_flags.h"
#include "services/common/serving.h"
#include "services/common/serving_metrics.h"
#include "services/router-gateway/gateway_runner.h"
#include "services/router-gateway/gateway_service.h"
#include "services/serve/local_backend.h"

ABSL_FLAG(std::string, model, "models/tiny-moe", "Model directory (Hugging Face layout).");
ABSL_FLAG(std::string, plan, "",
          "Pruning plan (tandem prune): generated tokens run only its retained experts (at mixed "
          "width if it has tiers), while prompts run the full pool (phase-aware, the "
          "disaggregated cluster's split).");
ABSL_FLAG(std::string, overlay, "",
          "Decoder overlay (tools/train/distill.py) of --plan: generated tokens run its "
          "distilled norms, routers and shared experts, prompts the base model's.");
ABSL_FLAG(int, kv_block_size, 16, "Tokens per KV-cache block.");
ABSL_FLAG(int, kv_blocks, 1024, "KV-cache blocks in the pool (shared by all sequences).");
ABSL_FLAG(std::string, kv_dtype, "bf16",
          "How the KV cache stores keys and values: f32, bf16 or int8 (per-token, per-head "
          "scales); docs/kv-cache.md.");
ABSL_FLAG(bool, prefix_cache, true,
          "Reuse the KV of prompt prefixes already computed (full blocks, kept while unused and "
          "evicted least recently used); docs/kv-cache.md \"Prefix cache\".");
ABSL_FLAG(int, prefix_state_snapshots, 32,
          "With a model whose recurrent layers keep state (Gated DeltaNet): copies of a "
          "sequence's state kept at block boundaries, from which a cached prefix resumes, each "
          "the model's state bytes per sequence (logged at start-up); the least recently used "
          "goes first. 0 turns the prefix cache off for such a model.");
ABSL_FLAG(int, max_running, 64, "Sequences in the batch at most.");
ABSL_FLAG(int, max_step_tokens, 512, "Tokens one engine step runs at most (chunked prefill).");

int main(int argc, char** argv) {
  const tandem::config::ProgramInfo program{
      "tandem-serve",
      "colocated mode: the gateway API on an engine in this process",
      "TANDEM_SERVE_",
      {"services/serve/", tandem::rpc::kServiceFlagsSource, tandem::gateway::kGatewayFlagsSource,
       tandem::serving::kEngineFlagsSource}};
  const tandem::rpc::ServiceOptions options = tandem::rpc::InitService(argc, argv, program);
  auto fail = [&](const std::string& what, const absl::Status& status) {
    std::cerr << program.name << ": " << what << ": " << status.message() << "\n";
    return 2;
  };
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const auto kv_dtype = tandem::serving::KvDtypeFlag(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) return fail("flags", kv_dtype.status());
  const auto engine_flags = tandem::serving::ReadEngineFlags();
  if (!engine_flags.ok()) return fail("flags", engine_flags.status());
  auto dir = tandem::model::ModelDir::Open(model_dir);
  if (!dir.ok()) return fail("--model=" + model_dir, dir.status());
  auto decoder = tandem::serving::LoadDecoder(
      **dir, absl::GetFlag(FLAGS_kv_block_size), absl::GetFlag(FLAGS_kv_blocks),
      {.plan = absl::GetFlag(FLAGS_plan),
       .overlay = absl::GetFlag(FLAGS_overlay),
       .decode_only = false,
       .kv_dtype = *kv_dtype,
       .load = engine_flags->load,
       .memory_bytes = engine_flags->memory_bytes,
       .max_sequences = absl::GetFlag(FLAGS_max_running),
       .state_snapshots = absl::GetFlag(FLAGS_prefix_state_snapshots),
       .window_rings = engine_flags->window_rings});
  if (!decoder.ok()) return fail("--model=" + model_dir, decoder.status());
  (*dir)->ReleaseCheckpoint();  // the engine holds its own copies of the weights
  tandem::serving::ServingEngine* engine = &decoder->engine;
  if (absl::GetFlag(FLAGS_prefix_cache)) engine->pool->EnablePrefixCache();
  // Prompts run the full pool (salt 0); generated tokens' blocks are cached too only when
  // decode runs the same experts.
  const tandem::engine::MoeOptions decode_moe = decoder->decode_moe();
  const bool decode_is_prefill =
      decode_moe.mask == nullptr && decode_moe.widths == nullptr && decode_moe.overlay == nullptr;
  auto scheduler = tandem::engine::Scheduler::Create(
      engine->forward.get(), engine->model.tokenizer.get(), engine->model.tokenizer->eos_id(),
      {.max_running = absl::GetFlag(FLAGS_max_running),
       .max_step_tokens = absl::GetFlag(FLAGS_max_step_tokens),
       .decode = decode_moe,
       .prefix_salt = 0,
       .cache_generated = decode_is_prefill});
  if (!scheduler.ok()) return fail("the scheduler", scheduler.status());

  tandem::metrics::Registry registry(tandem::serving::ServiceLabels("serve", model_dir));
  tandem::metrics::HealthState health;
  tandem::rpc::RpcMetrics rpc_metrics(&registry);
  tandem::serving::GatewayMetrics gateway_metrics(&registry);
  tandem::serving::DecodeMetrics engine_metrics(&registry);
  tandem::serving::ExpertMetrics expert_metrics(&registry);
  tandem::serving::PrefixCacheMetrics prefix_metrics(&registry);
  tandem::serving::ReportResidentExperts(*engine->model.weights, &engine_metrics);
  tandem::serving::ReportOverlay(decoder->overlay.get(), &engine_metrics);
  tandem::serving::ReportEngine(*engine->model.weights, &registry);
  tandem::serving::ReportKvCache(*engine->pool, &registry);
  auto loop = tandem::engine::EngineLoop::Start(
      *std::move(scheduler),
      tandem::serving::WithPrefixCacheMetrics(
          tandem::serving::WithExpertMetrics(
              tandem::serving::EngineStepObserver(&engine_metrics, engine->pool->num_total()),
              &*decoder, &expert_metrics),
          engine->pool.get(), &prefix_metrics));

  tandem::gateway::GatewayConfig config;
  if (absl::Status s = tandem::gateway::ApplyGatewayFlags(**dir, &config); !s.ok()) {
    return fail("flags", s);
  }
  const int vocab = static_cast<int>(config.model_config.vocab_size);
  int exit_code;
  {
    tandem::gateway::GatewayService service(
        std::move(config), engine->model.tokenizer,
        std::make_unique<tandem::serve::LocalBackend>(loop.get(), vocab), &rpc_metrics,
        &gateway_metrics);
    exit_code =
        tandem::gateway::RunGateway(options, &service, **dir, &registry, &health, &gateway_metrics);
  }
  loop.reset();
  return exit_code;
}
