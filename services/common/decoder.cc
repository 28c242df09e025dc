#include "services/common/decoder.h"

#include "absl/strings/str_cat.h"
#include "common/moe/pruning_plan.h"
#include "common/util/logging.h"
#include "common/util/status.h"

namespace tandem::serving {
namespace {

absl::Status Flag(const std::string& flag, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(flag, ": ", status.message()));
}

}  // namespace

absl::StatusOr<Decoder> LoadDecoder(const model::ModelDir& dir, int block_size, int num_blocks,
                                    const DecoderOptions& options) {
  Decoder d;
  const model::ModelConfig& config = dir.config();
  if (options.load.format == engine::LoadFormat::kDummy) {
    // What is made for a checkpoint does not fit random weights.
    if (!options.overlay.empty()) {
      return absl::InvalidArgumentError("--overlay is made for a checkpoint, not dummy weights");
    }
    if (!options.expert_pack.empty()) {
      return absl::InvalidArgumentError(
          "--expert_pack holds a checkpoint's experts, not dummy weights");
    }
  }
  tandem::v1::PruningPlan plan;  // empty without --plan
  if (!options.plan.empty()) {
    absl::StatusOr<moe::PlanForModel> loaded = moe::LoadPlanFor(options.plan, dir);
    if (!loaded.ok()) return Flag("--plan", loaded.status());
    plan = std::move(loaded->plan);
    d.mask = std::move(loaded->mask);
    if (plan.has_tiers() && options.load.format == engine::LoadFormat::kDummy) {
      return absl::InvalidArgumentError(
          "--plan: tiers need a checkpoint with its neurons in importance order, not dummy "
          "weights");
    }
    absl::StatusOr<std::unique_ptr<moe::TierWidthPolicy>> tiers = moe::TierPolicyFor(plan, dir);
    if (!tiers.ok()) return Flag("--plan", tiers.status());
    d.tiers = *std::move(tiers);
  }
  // What to load: nothing of the experts when they stream, the plan's for a decode-only engine.
  EngineOptions engine_options{.block_size = block_size,
                               .num_blocks = num_blocks,
                               .memory_bytes = options.memory_bytes,
                               .kv_dtype = options.kv_dtype,
                               .max_sequences = options.max_sequences,
                               .load = options.load,
                               .state_snapshots = options.state_snapshots,
                               .window_rings = options.window_rings};
  engine::ExpertMask& load = engine_options.load.only_experts;
  if (!options.expert_pack.empty()) {
    load.retained.assign(config.num_hidden_layers,
                         std::vector<bool>(config.num_local_experts, false));
  } else if (options.decode_only) {
    load = d.mask;
  }
  ASSIGN_OR_RETURN(d.engine, LoadServingEngine(dir, engine_options));
  if (!options.overlay.empty()) {
    absl::StatusOr<std::unique_ptr<engine::DecoderOverlay>> overlay =
        engine::LoadDecoderOverlay(options.overlay, dir, *d.engine.model.weights, d.mask);
    if (!overlay.ok()) return Flag("--overlay", overlay.status());
    d.overlay = *std::move(overlay);
    TANDEM_LOG(INFO) << "decoding with overlay " << d.overlay->name << " (" << d.overlay->path
                     << ", sha256 " << d.overlay->sha256 << ": " << d.overlay->tensors.size()
                     << " tensors for plan sha256 " << d.overlay->plan_sha256 << ")";
  }
  if (!options.expert_pack.empty()) {
    absl::StatusOr<std::unique_ptr<moe::ExpertBacking>> backing =
        options.expert_direct_io ? moe::DirectFileBacking(options.expert_pack)
                                 : moe::HostBacking(options.expert_pack);
    if (!backing.ok()) return Flag("--expert_pack", backing.status());
    const moe::PackLayout& layout = (*backing)->layout();
    const moe::PackLayout want = moe::PackLayout::For(config);
    if (layout.layers != want.layers || layout.experts != want.experts ||
        layout.hidden != want.hidden || layout.intermediate != want.intermediate ||
        layout.format != want.format || layout.group != want.group) {
      return absl::InvalidArgumentError(
          absl::StrCat("--expert_pack: ", options.expert_pack, " holds ", layout.layers,
                       " layers of ", layout.experts, " ", kernels::WeightFormatName(layout.format),
                       " experts (hidden ", layout.hidden, ", intermediate ", layout.intermediate,
                       ", group ", layout.group, "), not this model's (",
                       kernels::WeightFormatName(want.format), ", group ", want.group, ")"));
    }
    d.backing = *std::move(backing);
    absl::StatusOr<std::unique_ptr<moe::ExpertStream>> stream = moe::ExpertStream::Create(
        d.backing.get(), options.expert_cache_bytes, options.expert_overlap);
    if (!stream.ok()) return Flag("--expert_cache_bytes", stream.status());
    d.stream = *std::move(stream);
    // Keep the experts the plan's frequent pairs run at full width.
    if (plan.has_tiers()) d.stream->SetPriorityWeights(moe::CachePriorities(plan));
    d.engine.forward->SetExpertProvider(d.stream.get());
  }
  return d;
}

engine::EngineLoop::StepObserver WithExpertMetrics(engine::EngineLoop::StepObserver inner,
                                                   Decoder* decoder, ExpertMetrics* metrics) {
  // The totals at the last report, to add only what each step did.
  auto last_stream = std::make_shared<moe::StreamStats>();
  auto last_tiers = std::make_shared<moe::TierWidthPolicy::Counts>();
  return [inner = std::move(inner), decoder, metrics, last_stream,
          last_tiers](const engine::EngineLoop::StepReport& step) {
    if (inner) inner(step);
    if (decoder->stream != nullptr) {
      const moe::StreamStats now = decoder->stream->stats();
      const moe::StreamStats& was = *last_stream;
      metrics->cache_hits->Increment(static_cast<double>(now.cache.hits - was.cache.hits));
      metrics->cache_misses->Increment(static_cast<double>(now.cache.misses - was.cache.misses));
      metrics->cache_widenings->Increment(
          static_cast<double>(now.cache.widenings - was.cache.widenings));
      metrics->bytes_loaded->Increment(
          static_cast<double>(now.backing_bytes_read - was.backing_bytes_read));
      metrics->load_seconds->Increment(now.cache.load_seconds - was.cache.load_seconds);
      metrics->wait_seconds->Increment(now.wait_seconds - was.wait_seconds);
      *last_stream = now;
    }
    if (decoder->tiers != nullptr) {
      const moe::TierWidthPolicy::Counts now = decoder->tiers->counts();
      const moe::TierWidthPolicy::Counts& was = *last_tiers;
      metrics->pairs_hot->Increment(static_cast<double>(now.hot - was.hot));
      metrics->pairs_warm->Increment(static_cast<double>(now.warm - was.warm));
      metrics->pairs_cold->Increment(static_cast<double>(now.cold - was.cold));
      metrics->neurons->Increment(static_cast<double>(now.neurons - was.neurons));
      *last_tiers = now;
    }
  };
}

}  // namespace tandem::serving
