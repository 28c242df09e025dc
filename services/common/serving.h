// What the prefill and decode services share: loading a model into a serving engine (weights,
// tokenizer, KV pool, forward pass), converting the public API's sampling parameters and finish
// reasons, and reading a KvTarget's peer.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/engine_loop.h"
#include "common/engine/forward.h"
#include "common/engine/generator.h"
#include "common/engine/kv_cache.h"
#include "common/engine/overlay.h"
#include "common/engine/sampling.h"
#include "common/engine/scheduler.h"
#include "common/kv/transfer.h"
#include "services/common/serving_metrics.h"
#include "tandem/v1/gateway.pb.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::serving {

// max_tokens when a request leaves it 0 (the public API's "server default").
inline constexpr int kDefaultMaxTokens = 16;

struct ServingEngine {
  engine::LoadedModel model;
  std::unique_ptr<engine::KvBlockPool> pool;
  std::unique_ptr<engine::ForwardPass> forward;
};

struct EngineOptions {
  int block_size = 16;  // tokens per KV block
  int num_blocks = 1024;
  // > 0: the pool gets as many blocks as fit in what the weights leave of this many bytes
  // (num_blocks is not used); INVALID_ARGUMENT when not one block fits.
  int64_t memory_bytes = 0;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
  // Sequences the engine holds at once (its scheduler's max_running): the state slots of a
  // model with recurrent layers.
  int max_sequences = 64;
  // The weights (the checkpoint's or dummy ones; only some experts'), and a synthetic router.
  engine::LoadOptions load = {};
  // With recurrent layers or window rings: the state snapshots the prefix cache keeps
  // (KvCacheConfig).
  int state_snapshots = 0;
  // Sliding-window layers in rings of their window's positions (KvCacheConfigFor).
  bool window_rings = true;
};

// Loads `dir` as `options` say and makes its KV pool; a stated routing replaces the router.
absl::StatusOr<ServingEngine> LoadServingEngine(const model::ModelDir& dir,
                                                const EngineOptions& options);

// The KV dtype a service's --kv_dtype names; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<kernels::KvDtype> KvDtypeFlag(const std::string& value);
// Registers tandem_kv_cache_bytes (the pool's memory) and tandem_kv_cache_info{dtype,
// block_size, block_bytes} 1, and logs the pool's size.
void ReportKvCache(const engine::KvBlockPool& pool, metrics::Registry* registry);

// An engine loop observer that keeps `metrics` (step time and size, generated tokens, running
// and waiting sequences, KV blocks of a pool of `total_blocks`) up to date; sets the block
// gauges for an empty pool now.
engine::EngineLoop::StepObserver EngineStepObserver(DecodeMetrics* metrics, int total_blocks);

// `inner` (if set), then the prefix-cache metrics of `pool` brought up to date after every step.
engine::EngineLoop::StepObserver WithPrefixCacheMetrics(engine::EngineLoop::StepObserver inner,
                                                        const engine::KvBlockPool* pool,
                                                        PrefixCacheMetrics* metrics);

// Sets the resident-expert gauges of `metrics` from `weights`.
void ReportResidentExperts(const engine::ModelWeights& weights, DecodeMetrics* metrics);
// The weights' format in words: "bf16", or "int4 (group 32: experts, attention)".
std::string WeightFormat(const model::ModelConfig& config);
// Registers tandem_engine_info{kernels, weights, group} 1 (the kernel level this process runs,
// the weights' format) and logs the same.
void ReportEngine(const engine::ModelWeights& weights, metrics::Registry* registry);

// Sets tandem_decoder_overlay_info for `overlay` (null: none).
void ReportOverlay(const engine::DecoderOverlay* overlay, DecodeMetrics* metrics);

// INVALID_ARGUMENT naming the field (the engine's checks).
absl::StatusOr<engine::SamplingParams> SamplingFromProto(const tandem::v1::SamplingParams& proto,
                                                         int vocab_size);
tandem::v1::FinishReason FinishToProto(engine::FinishReason reason);

void LogprobsToProto(const engine::TokenLogprobs& in, tandem::v1::TokenLogprobs* out);
// A peer's log-probabilities of `token`, with at most `top` alternatives: INVALID_ARGUMENT
// when they are of another token, above 0, or name tokens outside the vocabulary.
absl::Status CheckLogprobs(const tandem::v1::TokenLogprobs& logprobs, int32_t token, int vocab_size,
                           int top);
engine::TokenLogprobs LogprobsFromProto(const tandem::v1::TokenLogprobs& in);

// One engine output as a stream chunk: its token (counted in `completion`), text and
// log-probabilities, and on the last, the finish reason and usage.
void FillChunk(const engine::SequenceOutput& out, int prompt_tokens, int* completion,
               tandem::v1::GenerateStreamResponse* chunk);

// The agent a target names, as the transport addresses it.
kv::KvPeer PeerOf(const tandem::v1::KvTarget& target);

}  // namespace tandem::serving
