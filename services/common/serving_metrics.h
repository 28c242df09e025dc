// The serving metrics of each role, registered once per process. Names follow Prometheus
// practice with base units (seconds, bytes); every sample also carries the registry's
// {role=...} label.
#pragma once

#include "common/metrics/metrics.h"

namespace tandem::serving {

// tandem-decode: what the engine loop does and holds.
// The constant labels of every metric a service exports: its role ("gateway", "prefill",
// "decode", "serve") and the model it serves (the model directory's name).
metrics::Labels ServiceLabels(const std::string& role, const std::string& model_dir);

struct DecodeMetrics {
  explicit DecodeMetrics(metrics::Registry* registry);
  metrics::Gauge* running;              // tandem_running_sequences
  metrics::Gauge* waiting;              // tandem_waiting_sequences
  metrics::Gauge* kv_blocks_used;       // tandem_kv_blocks{state="used"}
  metrics::Gauge* kv_blocks_free;       // tandem_kv_blocks{state="free"}
  metrics::Histogram* step_seconds;     // tandem_decode_step_seconds
  metrics::Histogram* step_tokens;      // tandem_decode_step_tokens (the batch size)
  metrics::Counter* generated_tokens;   // tandem_generated_tokens_total
  metrics::Counter* preemptions;        // tandem_preemptions_total (recomputed later)
  metrics::Gauge* experts_resident;     // tandem_experts_resident (a pruned decoder's are fewer)
  metrics::Gauge* expert_weight_bytes;  // tandem_expert_weight_bytes
  metrics::Counter* leases_expired;     // tandem_reservations_expired_total
  metrics::Counter* kv_dropped_bytes;   // tandem_kv_receive_dropped_bytes_total
  // tandem_decoder_overlay_info{overlay, sha256, plan_sha256} 1: the decoder overlay generated
  // tokens run with; overlay="none" without one.
  metrics::Family<metrics::Gauge>* overlay_info;
};

// A decoder's experts when they stream from an expert pack, and its mixed-width tiers.
struct ExpertMetrics {
  explicit ExpertMetrics(metrics::Registry* registry);
  metrics::Counter* cache_hits;       // tandem_expert_cache_requests_total{result="hit"}
  metrics::Counter* cache_misses;     // tandem_expert_cache_requests_total{result="miss"}
  metrics::Counter* cache_widenings;  // tandem_expert_cache_requests_total{result="widen"}
  metrics::Counter* bytes_loaded;     // tandem_expert_load_bytes_total (read from the backing)
  metrics::Counter* load_seconds;     // tandem_expert_load_seconds_total (the I/O thread)
  metrics::Counter* wait_seconds;     // tandem_expert_load_wait_seconds_total (compute waited)
  metrics::Counter* pairs_hot;        // tandem_expert_pairs_total{tier="hot"}
  metrics::Counter* pairs_warm;       // tandem_expert_pairs_total{tier="warm"}
  metrics::Counter* pairs_cold;       // tandem_expert_pairs_total{tier="cold"}
  metrics::Counter* neurons;          // tandem_expert_neurons_total (widths run, summed)
};

// tandem-prefill: prompts and the KV shipped for them.
struct PrefillMetrics {
  explicit PrefillMetrics(metrics::Registry* registry);
  metrics::Gauge* queue_depth;           // tandem_prefill_queue_depth
  metrics::Counter* prompt_tokens;       // tandem_prefill_tokens_total
  metrics::Histogram* compute_seconds;   // tandem_prefill_compute_seconds
  metrics::Counter* transfer_bytes;      // tandem_kv_transfer_bytes_total
  metrics::Histogram* transfer_seconds;  // tandem_kv_transfer_seconds
  metrics::Counter* transfer_failures;   // tandem_kv_transfer_failures_total
};

// The prefix cache of an engine's KV pool (tandem-serve, tandem-prefill).
struct PrefixCacheMetrics {
  explicit PrefixCacheMetrics(metrics::Registry* registry);
  metrics::Counter* query_tokens;    // tandem_prefix_cache_query_tokens_total
  metrics::Counter* hit_tokens;      // tandem_prefix_cache_hit_tokens_total
  metrics::Gauge* cached_blocks;     // tandem_prefix_cache_blocks{state="cached"}
  metrics::Gauge* evictable_blocks;  // tandem_prefix_cache_blocks{state="evictable"}
  metrics::Gauge* state_blocks;      // tandem_prefix_cache_blocks{state="with_state"}
  metrics::Counter* evictions;       // tandem_prefix_cache_evictions_total
};

// tandem-gateway: what clients see.
struct GatewayMetrics {
  explicit GatewayMetrics(metrics::Registry* registry);
  metrics::Counter* requests_ok;              // tandem_requests_total{outcome="ok"}
  metrics::Counter* requests_error;           // tandem_requests_total{outcome="error"}
  metrics::Counter* requests_cancelled;       // tandem_requests_total{outcome="cancelled"}
  metrics::Counter* requests_rejected;        // tandem_requests_total{outcome="rejected"}: overload
  metrics::Histogram* time_to_first_token;    // tandem_time_to_first_token_seconds
  metrics::Histogram* inter_token;            // tandem_inter_token_latency_seconds
  metrics::Histogram* end_to_end;             // tandem_request_duration_seconds
  metrics::Counter* prompt_tokens;            // tandem_prompt_tokens_total (finished requests)
  metrics::Counter* generation_tokens;        // tandem_generation_tokens_total (finished requests)
  metrics::Histogram* request_prompt_tokens;  // tandem_request_prompt_tokens
  metrics::Histogram* request_generation_tokens;  // tandem_request_generation_tokens
  // tandem_http_requests_total{path, code}: the OpenAI front's answers (known paths only).
  metrics::Family<metrics::Counter>* http_requests;
  metrics::Gauge* running;         // tandem_gateway_running_requests: dispatched now
  metrics::Gauge* queued;          // tandem_gateway_queued_requests: waiting for a place
  metrics::Histogram* queue_wait;  // tandem_gateway_queue_wait_seconds
};

}  // namespace tandem::serving
