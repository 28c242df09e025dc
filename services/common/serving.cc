#include "services/common/serving.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/kernels/cpu/kernels.h"
#include "common/util/logging.h"
#include "common/util/status.h"
#include "services/common/structured_output.h"

namespace tandem::serving {

absl::StatusOr<ServingEngine> LoadServingEngine(const model::ModelDir& dir,
                                                const EngineOptions& options) {
  ServingEngine e;
  ASSIGN_OR_RETURN(e.model, engine::LoadModelDir(dir, options.load));
  const model::ModelConfig& c = e.model.weights->config;
  engine::KvCacheConfig kv =
      engine::KvCacheConfigFor(c, options.block_size, options.num_blocks, options.kv_dtype,
                               options.max_sequences, options.window_rings);
  if (!options.window_rings && !kv.rings.empty()) {
    TANDEM_LOG(INFO) << "--kv_window_rings=false: " << kv.rings.size()
                     << " windowed layers keep rings all the same (their shape is not the paged "
                        "layers', and the pool has one)";
  }
  if (kv.state_bytes > 0) {
    if (options.state_snapshots < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prefix_state_snapshots=", options.state_snapshots, " must be >= 0"));
    }
    kv.num_state_snapshots = options.state_snapshots;
    TANDEM_LOG(INFO) << "KV pool: " << kv.num_state_slots << " state slots and "
                     << kv.num_state_snapshots << " prefix-cache state snapshots of "
                     << kv.state_bytes << " bytes ("
                     << (static_cast<int64_t>(kv.num_state_slots) + kv.num_state_snapshots) *
                            kv.state_bytes / (1 << 20)
                     << " MiB)";
  }
  if (options.memory_bytes > 0) {
    const int64_t weights = e.model.weights->bytes();
    const int64_t left = options.memory_bytes - weights;
    // Pools grow by whole blocks (each layer's K and V pools padded to an alignment): estimate
    // from a large pool, then step down to the largest that fits.
    kv.num_blocks = 4096;
    ASSIGN_OR_RETURN(const size_t per_4096, engine::KvBlockPool::BytesFor(kv));
    kv.num_blocks = static_cast<int>(
        std::min<int64_t>(std::max<int64_t>(left, 0) / std::max<int64_t>(per_4096 / 4096, 1),
                          std::numeric_limits<int32_t>::max() / 2));
    while (kv.num_blocks > 0) {
      ASSIGN_OR_RETURN(const size_t bytes, engine::KvBlockPool::BytesFor(kv));
      if (static_cast<int64_t>(bytes) <= left) break;
      --kv.num_blocks;
    }
    if (kv.num_blocks < 1) {
      // Recurrent states and window rings take a state slot per running sequence and per
      // prefix-cache snapshot (Gemma 4's rings: 250 MiB each at the published shape).
      const std::string state =
          kv.state_bytes > 0
              ? absl::StrCat(" and the state slots' ",
                             (static_cast<int64_t>(kv.num_state_slots) + kv.num_state_snapshots) *
                                 kv.state_bytes,
                             " (", kv.num_state_slots, " running sequences, --max_running",
                             kv.num_state_snapshots > 0
                                 ? absl::StrCat(", and ", kv.num_state_snapshots,
                                                " prefix-cache snapshots, --prefix_state_snapshots")
                                 : "",
                             ", of ", kv.state_bytes, " bytes each)")
              : "";
      return absl::InvalidArgumentError(
          absl::StrCat("--memory_bytes=", options.memory_bytes, " leaves ", left,
                       " bytes beside the weights' ", weights, state, ": not one KV block fits"));
    }
  }
  if (kv.state_bytes > 0) {
    // Window rings and recurrent states cost a state slot per running sequence whatever its
    // length: say so where they take most of the pool (Gemma 4's rings: 250 MiB a sequence).
    ASSIGN_OR_RETURN(const size_t pool_bytes, engine::KvBlockPool::BytesFor(kv));
    const int64_t state =
        (static_cast<int64_t>(kv.num_state_slots) + kv.num_state_snapshots) * kv.state_bytes;
    if (2 * state > static_cast<int64_t>(pool_bytes)) {
      TANDEM_LOG(WARNING) << "state slots take " << state / (1 << 20) << " MiB of the KV pool's "
                          << pool_bytes / (1 << 20) << " MiB (" << kv.num_state_slots
                          << " running sequences and " << kv.num_state_snapshots
                          << " prefix-cache snapshots of " << kv.state_bytes / (1 << 20)
                          << " MiB each): fewer --max_running or --prefix_state_snapshots "
                             "leave more blocks for long contexts";
    }
  }
  ASSIGN_OR_RETURN(e.pool, engine::KvBlockPool::Create(kv));
  ASSIGN_OR_RETURN(e.forward, engine::ForwardPass::Create(e.model.weights.get(), e.pool.get()));
  RETURN_IF_ERROR(engine::ApplyRouting(options.load, e.forward.get()));
  return e;
}

absl::StatusOr<kernels::KvDtype> KvDtypeFlag(const std::string& value) {
  absl::StatusOr<kernels::KvDtype> dtype = kernels::ParseKvDtype(value);
  if (!dtype.ok())
    return absl::InvalidArgumentError(absl::StrCat("--kv_dtype: ", dtype.status().message()));
  return dtype;
}

void ReportKvCache(const engine::KvBlockPool& pool, metrics::Registry* registry) {
  const engine::KvCacheConfig& c = pool.config();
  if (auto bytes = registry->AddGauge("tandem_kv_cache_bytes",
                                      "Bytes of the KV-cache pool (every layer's K and V blocks).");
      bytes.ok()) {
    (*bytes)->Add({}).Set(static_cast<double>(pool.size_bytes()));
  }
  if (auto info = registry->AddGauge(
          "tandem_kv_cache_info",
          "1, labelled with how the KV cache stores keys and values and its block geometry.");
      info.ok()) {
    (*info)
        ->Add(metrics::Labels{{"dtype", kernels::KvDtypeName(c.dtype)},
                              {"block_size", absl::StrCat(c.block_size)},
                              {"block_bytes", absl::StrCat(pool.block_bytes())}})
        .Set(1);
  }
  TANDEM_LOG(INFO) << "KV cache: " << c.num_blocks << " blocks of " << c.block_size << " tokens, "
                   << kernels::KvDtypeName(c.dtype) << ", " << pool.size_bytes() << " bytes ("
                   << c.pools_per_layer() * c.num_layers * pool.block_bytes()
                   << " bytes a block over all layers)";
}

engine::EngineLoop::StepObserver EngineStepObserver(DecodeMetrics* metrics, int total_blocks) {
  metrics->kv_blocks_free->Set(total_blocks);
  metrics->kv_blocks_used->Set(0);
  return [metrics, total_blocks](const engine::EngineLoop::StepReport& step) {
    if (step.stepped) {
      metrics->step_seconds->Observe(step.seconds);
      metrics->step_tokens->Observe(static_cast<double>(step.tokens));
      metrics->generated_tokens->Increment(static_cast<double>(step.generated));
      metrics->preemptions->Increment(static_cast<double>(step.preemptions));
    }
    metrics->running->Set(step.running);
    metrics->waiting->Set(step.waiting);
    metrics->kv_blocks_free->Set(step.free_blocks);
    metrics->kv_blocks_used->Set(total_blocks - step.free_blocks);
  };
}

engine::EngineLoop::StepObserver WithPrefixCacheMetrics(engine::EngineLoop::StepObserver inner,
                                                        const engine::KvBlockPool* pool,
                                                        PrefixCacheMetrics* metrics) {
  auto evictions = std::make_shared<int64_t>(0);
  return [inner = std::move(inner), pool, metrics,
          evictions](const engine::EngineLoop::StepReport& step) {
    if (inner) inner(step);
    metrics->query_tokens->Increment(static_cast<double>(step.prefix_query_tokens));
    metrics->hit_tokens->Increment(static_cast<double>(step.prefix_hit_tokens));
    const engine::KvBlockPool::PrefixCacheStats stats = pool->prefix_cache_stats();
    metrics->cached_blocks->Set(stats.cached_blocks);
    metrics->evictable_blocks->Set(stats.evictable_blocks);
    metrics->state_blocks->Set(stats.state_snapshots);
    metrics->evictions->Increment(static_cast<double>(stats.evictions - *evictions));
    *evictions = stats.evictions;
  };
}

void ReportResidentExperts(const engine::ModelWeights& weights, DecodeMetrics* metrics) {
  int64_t experts = 0, bytes = 0;
  for (const engine::LayerWeights& layer : weights.layers) {
    for (const engine::ExpertWeights& e : layer.moe.experts) {
      if (e.gate.data.empty()) continue;
      ++experts;
      bytes += static_cast<int64_t>(e.gate.data.size() + e.up.data.size() + e.down.data.size());
    }
  }
  metrics->experts_resident->Set(static_cast<double>(experts));
  metrics->expert_weight_bytes->Set(static_cast<double>(bytes));
}

std::string WeightFormat(const model::ModelConfig& config) {
  const model::QuantizationConfig& q = config.quantization;
  if (q.bits == 0) return "bf16";
  std::vector<std::string> modules;
  if (q.experts) modules.push_back("experts");
  if (q.attention) modules.push_back("attention");
  if (q.shared_expert) modules.push_back("shared_expert");
  if (q.dense_mlp) modules.push_back("dense_mlp");
  if (q.lm_head) modules.push_back("lm_head");
  return absl::StrCat("int", q.bits, " (group ", q.group_size, ": ", absl::StrJoin(modules, ", "),
                      ")");
}

void ReportEngine(const engine::ModelWeights& weights, metrics::Registry* registry) {
  const model::QuantizationConfig& q = weights.config.quantization;
  const char* kernels = kernels::cpu::KernelIsa();
  auto info = registry->AddGauge(
      "tandem_engine_info",
      "1, labelled with the CPU kernel level the engine runs and its weights' format.");
  if (info.ok()) {
    (*info)
        ->Add(metrics::Labels{{"kernels", kernels},
                              {"weights", q.bits == 0 ? "bf16" : absl::StrCat("int", q.bits)},
                              {"group", absl::StrCat(q.group_size)}})
        .Set(1);
  }
  if (auto bytes = registry->AddGauge("tandem_weight_bytes",
                                      "Bytes of the weights the engine holds (resident experts "
                                      "only, packed as the kernels read them).");
      bytes.ok()) {
    (*bytes)->Add({}).Set(static_cast<double>(weights.bytes()));
  }
  TANDEM_LOG(INFO) << "engine: kernels " << kernels << ", weights " << WeightFormat(weights.config)
                   << ", " << weights.bytes() << " bytes";
}

void ReportOverlay(const engine::DecoderOverlay* overlay, DecodeMetrics* metrics) {
  if (overlay == nullptr) {
    metrics->overlay_info->Add(metrics::Labels{{"overlay", "none"}}).Set(1);
    return;
  }
  metrics->overlay_info
      ->Add(metrics::Labels{{"overlay", overlay->name},
                            {"sha256", overlay->sha256},
                            {"plan_sha256", overlay->plan_sha256}})
      .Set(1);
}

absl::StatusOr<engine::SamplingParams> SamplingFromProto(const tandem::v1::SamplingParams& proto,
                                                         int vocab_size) {
  engine::SamplingParams p;
  p.temperature = proto.temperature();
  p.top_p = proto.top_p() == 0.0f ? 1.0f : proto.top_p();
  p.top_k = proto.top_k();
  if (proto.has_seed()) p.seed = proto.seed();
  p.max_tokens = proto.has_max_tokens() ? proto.max_tokens() : kDefaultMaxTokens;
  p.stop_token_ids.assign(proto.stop_token_ids().begin(), proto.stop_token_ids().end());
  p.stop_strings.assign(proto.stop().begin(), proto.stop().end());
  p.ignore_eos = proto.ignore_eos();
  p.presence_penalty = proto.presence_penalty();
  p.frequency_penalty = proto.frequency_penalty();
  p.repetition_penalty = proto.repetition_penalty() == 0.0f ? 1.0f : proto.repetition_penalty();
  if (proto.logit_bias_size() > static_cast<int>(engine::SamplingParams::kMaxLogitBias)) {
    return absl::InvalidArgumentError(absl::StrCat("logit_bias has ", proto.logit_bias_size(),
                                                   " entries; at most ",
                                                   engine::SamplingParams::kMaxLogitBias));
  }
  p.logit_bias.assign(proto.logit_bias().begin(), proto.logit_bias().end());
  // A map's order is unspecified: sorted, the same request samples the same everywhere.
  std::sort(p.logit_bias.begin(), p.logit_bias.end());
  for (const auto& [name, set, value, out] :
       {std::tuple{"logprobs", proto.has_logprobs(), proto.logprobs(), &p.logprobs},
        std::tuple{"prompt_logprobs", proto.has_prompt_logprobs(), proto.prompt_logprobs(),
                   &p.prompt_logprobs}}) {
    if (!set) continue;
    if (value < 0 || value > engine::SamplingParams::kMaxLogprobs) {
      return absl::InvalidArgumentError(absl::StrCat(name, " ", value, " is outside [0, ",
                                                     engine::SamplingParams::kMaxLogprobs, "]"));
    }
    *out = value;
  }
  ASSIGN_OR_RETURN(p.constraint, ConstraintFromProto(proto.structured()));
  RETURN_IF_ERROR(p.Validate(vocab_size));
  return p;
}

void LogprobsToProto(const engine::TokenLogprobs& in, tandem::v1::TokenLogprobs* out) {
  out->set_token_id(in.token);
  out->set_logprob(in.logprob);
  for (const engine::TokenLogprob& t : in.top) {
    tandem::v1::TokenLogprob* p = out->add_top();
    p->set_token_id(t.token);
    p->set_logprob(t.logprob);
  }
}

absl::Status CheckLogprobs(const tandem::v1::TokenLogprobs& logprobs, int32_t token, int vocab_size,
                           int top) {
  if (logprobs.token_id() != token) {
    return absl::InvalidArgumentError(
        absl::StrCat("the log-probabilities are of token ", logprobs.token_id(), ", not ", token));
  }
  if (!(logprobs.logprob() <= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("log-probability ", logprobs.logprob(), " is not <= 0"));
  }
  if (logprobs.top_size() > top) {
    return absl::InvalidArgumentError(absl::StrCat("the log-probabilities list ",
                                                   logprobs.top_size(), " alternatives; ", top,
                                                   " were asked for"));
  }
  for (const tandem::v1::TokenLogprob& t : logprobs.top()) {
    if (t.token_id() < 0 || t.token_id() >= vocab_size || !(t.logprob() <= 0.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("alternative token ", t.token_id(),
                                                     " with log-probability ", t.logprob(),
                                                     " is outside the vocabulary or above 0"));
    }
  }
  return absl::OkStatus();
}

void FillChunk(const engine::SequenceOutput& out, int prompt_tokens, int* completion,
               tandem::v1::GenerateStreamResponse* chunk) {
  if (out.token.has_value()) {
    chunk->add_token_ids(*out.token);
    ++*completion;
  }
  if (out.logprobs.has_value()) LogprobsToProto(*out.logprobs, chunk->add_logprobs());
  for (const engine::TokenLogprobs& p : out.prompt_logprobs) {
    LogprobsToProto(p, chunk->add_prompt_logprobs());
  }
  chunk->set_text(out.text);
  if (out.finish != engine::FinishReason::kNone) {
    chunk->set_finish_reason(FinishToProto(out.finish));
    chunk->mutable_usage()->set_prompt_tokens(prompt_tokens);
    chunk->mutable_usage()->set_completion_tokens(*completion);
  }
}

engine::TokenLogprobs LogprobsFromProto(const tandem::v1::TokenLogprobs& in) {
  engine::TokenLogprobs out;
  out.token = in.token_id();
  out.logprob = in.logprob();
  for (const tandem::v1::TokenLogprob& t : in.top()) out.top.push_back({t.token_id(), t.logprob()});
  return out;
}

tandem::v1::FinishReason FinishToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return tandem::v1::FINISH_REASON_STOP;
    case engine::FinishReason::kLength:
      return tandem::v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kNone:
      break;
  }
  return tandem::v1::FINISH_REASON_UNSPECIFIED;
}

kv::KvPeer PeerOf(const tandem::v1::KvTarget& target) {
  return {target.agent(), target.agent_address()};
}

}  // namespace tandem::serving
