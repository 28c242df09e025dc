#include "services/common/serving_metrics.h"

#include "common/model/config.h"

#include "common/util/logging.h"

namespace tandem::serving {
namespace {

template <typename T>
T* Must(absl::StatusOr<T*> family_or) {
  TANDEM_CHECK(family_or.ok()) << "metric registration: " << family_or.status();
  return *family_or;
}

}  // namespace

metrics::Labels ServiceLabels(const std::string& role, const std::string& model_dir) {
  return {{"role", role}, {"model", model::ModelNameFromDir(model_dir)}};
}

DecodeMetrics::DecodeMetrics(metrics::Registry* r) {
  running = &Must(r->AddGauge("tandem_running_sequences", "Sequences holding KV blocks."))->Add({});
  waiting =
      &Must(r->AddGauge("tandem_waiting_sequences", "Sequences waiting for the engine."))->Add({});
  auto* blocks = Must(r->AddGauge("tandem_kv_blocks", "KV-cache blocks by state."));
  kv_blocks_used = &blocks->Add(metrics::Labels{{"state", "used"}});
  kv_blocks_free = &blocks->Add(metrics::Labels{{"state", "free"}});
  step_seconds = &Must(r->AddHistogram("tandem_decode_step_seconds", "Engine step duration.",
                                       metrics::LatencyBuckets()))
                      ->Add({});
  step_tokens = &Must(r->AddHistogram("tandem_decode_step_tokens",
                                      "Tokens one engine step ran (its batch size).",
                                      metrics::ExponentialBuckets(1, 2, 11)))
                     ->Add({});
  generated_tokens =
      &Must(r->AddCounter("tandem_generated_tokens_total", "Tokens sampled."))->Add({});
  preemptions = &Must(r->AddCounter("tandem_preemptions_total",
                                    "Sequences preempted for KV blocks (recomputed later)."))
                     ->Add({});
  experts_resident = &Must(r->AddGauge("tandem_experts_resident",
                                       "Experts whose weights this instance holds, all layers."))
                          ->Add({});
  expert_weight_bytes =
      &Must(r->AddGauge("tandem_expert_weight_bytes", "Bytes of expert weights held in memory."))
           ->Add({});
  leases_expired = &Must(r->AddCounter("tandem_reservations_expired_total",
                                       "KV reservations freed because Decode never came."))
                        ->Add({});
  kv_dropped_bytes =
      &Must(r->AddCounter("tandem_kv_receive_dropped_bytes_total",
                          "KV bytes that arrived for no open reservation (late: after it ended) "
                          "or outside it, and were dropped."))
           ->Add({});
  overlay_info = Must(r->AddGauge("tandem_decoder_overlay_info",
                                  "1, labelled with the decoder overlay (tandem distill) generated "
                                  "tokens run with; overlay=\"none\" without one."));
}

ExpertMetrics::ExpertMetrics(metrics::Registry* r) {
  auto* requests = Must(r->AddCounter("tandem_expert_cache_requests_total",
                                      "Expert loads asked of the resident cache, by result."));
  cache_hits = &requests->Add(metrics::Labels{{"result", "hit"}});
  cache_misses = &requests->Add(metrics::Labels{{"result", "miss"}});
  cache_widenings = &requests->Add(metrics::Labels{{"result", "widen"}});
  bytes_loaded = &Must(r->AddCounter("tandem_expert_load_bytes_total",
                                     "Bytes of expert weights read from the backing tier."))
                      ->Add({});
  load_seconds = &Must(r->AddCounter("tandem_expert_load_seconds_total",
                                     "Time the I/O thread spent loading experts."))
                      ->Add({});
  wait_seconds = &Must(r->AddCounter("tandem_expert_load_wait_seconds_total",
                                     "Time the forward pass waited for expert loads (the rest "
                                     "of the load time was hidden behind compute)."))
                      ->Add({});
  auto* pairs = Must(r->AddCounter("tandem_expert_pairs_total",
                                   "Routed expert pairs run by a mixed-width decoder, by tier."));
  pairs_hot = &pairs->Add(metrics::Labels{{"tier", "hot"}});
  pairs_warm = &pairs->Add(metrics::Labels{{"tier", "warm"}});
  pairs_cold = &pairs->Add(metrics::Labels{{"tier", "cold"}});
  neurons = &Must(r->AddCounter("tandem_expert_neurons_total",
                                "Expert neurons run by a mixed-width decoder (widths summed)."))
                 ->Add({});
}

PrefillMetrics::PrefillMetrics(metrics::Registry* r) {
  queue_depth =
      &Must(r->AddGauge("tandem_prefill_queue_depth", "Prompts queued or running."))->Add({});
  prompt_tokens =
      &Must(r->AddCounter("tandem_prefill_tokens_total", "Prompt tokens prefilled."))->Add({});
  compute_seconds =
      &Must(r->AddHistogram("tandem_prefill_compute_seconds",
                            "Time to run a prompt through the model.", metrics::LatencyBuckets()))
           ->Add({});
  transfer_bytes = &Must(r->AddCounter("tandem_kv_transfer_bytes_total",
                                       "KV-cache bytes written to decode instances."))
                        ->Add({});
  transfer_seconds = &Must(r->AddHistogram("tandem_kv_transfer_seconds",
                                           "Time from posting a KV write to its landing.",
                                           metrics::LatencyBuckets()))
                          ->Add({});
  transfer_failures = &Must(r->AddCounter("tandem_kv_transfer_failures_total",
                                          "KV writes that failed or ran out of time."))
                           ->Add({});
}

PrefixCacheMetrics::PrefixCacheMetrics(metrics::Registry* r) {
  query_tokens = &Must(r->AddCounter("tandem_prefix_cache_query_tokens_total",
                                     "Tokens of sequences looked up in the prefix cache as they "
                                     "started."))
                      ->Add({});
  hit_tokens = &Must(r->AddCounter("tandem_prefix_cache_hit_tokens_total",
                                   "Tokens whose KV came from the prefix cache (not computed)."))
                    ->Add({});
  auto* blocks = Must(r->AddGauge("tandem_prefix_cache_blocks",
                                  "KV blocks in the prefix cache: cached (all published blocks), "
                                  "evictable (published, held by no sequence) and with_state "
                                  "(holding a recurrent model's state snapshot)."));
  cached_blocks = &blocks->Add(metrics::Labels{{"state", "cached"}});
  evictable_blocks = &blocks->Add(metrics::Labels{{"state", "evictable"}});
  state_blocks = &blocks->Add(metrics::Labels{{"state", "with_state"}});
  evictions = &Must(r->AddCounter("tandem_prefix_cache_evictions_total",
                                  "Cached blocks taken back for other KV."))
                   ->Add({});
}

GatewayMetrics::GatewayMetrics(metrics::Registry* r) {
  auto* requests = Must(r->AddCounter("tandem_requests_total", "Generations by outcome."));
  requests_ok = &requests->Add(metrics::Labels{{"outcome", "ok"}});
  requests_error = &requests->Add(metrics::Labels{{"outcome", "error"}});
  requests_cancelled = &requests->Add(metrics::Labels{{"outcome", "cancelled"}});
  requests_rejected = &requests->Add(metrics::Labels{{"outcome", "rejected"}});
  time_to_first_token = &Must(r->AddHistogram("tandem_time_to_first_token_seconds",
                                              "From a request's arrival to its first token.",
                                              metrics::LatencyBuckets()))
                             ->Add({});
  inter_token = &Must(r->AddHistogram("tandem_inter_token_latency_seconds",
                                      "Between consecutive tokens of one request.",
                                      metrics::LatencyBuckets()))
                     ->Add({});
  end_to_end = &Must(r->AddHistogram("tandem_request_duration_seconds",
                                     "From a request's arrival to its last token.",
                                     metrics::LatencyBuckets()))
                    ->Add({});
  prompt_tokens =
      &Must(r->AddCounter("tandem_prompt_tokens_total", "Prompt tokens of finished requests."))
           ->Add({});
  generation_tokens = &Must(r->AddCounter("tandem_generation_tokens_total",
                                          "Generated tokens of finished requests."))
                           ->Add({});
  request_prompt_tokens = &Must(r->AddHistogram("tandem_request_prompt_tokens",
                                                "Prompt length of finished requests, in tokens.",
                                                metrics::ExponentialBuckets(1, 2, 14)))
                               ->Add({});
  request_generation_tokens =
      &Must(r->AddHistogram("tandem_request_generation_tokens",
                            "Generated length of finished requests, in tokens.",
                            metrics::ExponentialBuckets(1, 2, 14)))
           ->Add({});
  http_requests = Must(r->AddCounter("tandem_http_requests_total",
                                     "OpenAI-compatible HTTP requests by path and status code."));
  running = &Must(r->AddGauge("tandem_gateway_running_requests",
                              "Generations dispatched now (at most --max_inflight)."))
                 ->Add({});
  queued = &Must(r->AddGauge("tandem_gateway_queued_requests",
                             "Generations waiting for a place (at most --max_queued)."))
                ->Add({});
  queue_wait = &Must(r->AddHistogram("tandem_gateway_queue_wait_seconds",
                                     "Time a generation waited for a place before dispatch.",
                                     metrics::LatencyBuckets()))
                    ->Add({});
}

}  // namespace tandem::serving
