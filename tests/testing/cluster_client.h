// The SDK side of the cluster tests: a client of a service a ServiceSet started, and the golden
// prompts' greedy continuations through it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tandem/client.h"
#include "tests/testing/subprocess.h"

namespace tandem::testing {

// A client of the gRPC port of `ports`; null (and a test failure) when it cannot connect.
std::unique_ptr<sdk::Client> ConnectClient(const Ports& ports);

// tests/golden/MODEL/manifest.json: the golden prompts and the reference's greedy tokens.
nlohmann::json LoadGoldenManifest(const std::string& model = "tiny-moe");

// The reference's greedy tokens of golden prompt `k`, the first `max_tokens` of them.
std::vector<int32_t> ReferenceTokens(const nlohmann::json& manifest, size_t k, int max_tokens);

// The greedy continuation of at most `max_tokens` of every golden prompt of `manifest`,
// through `client`, in the manifest's order (exactly `max_tokens` with `ignore_eos`); an empty
// one (and a test failure) where a request failed.
std::vector<std::vector<int32_t>> GreedyContinuations(sdk::Client* client,
                                                      const nlohmann::json& manifest,
                                                      int max_tokens, bool ignore_eos = false);

// The same through colocated tandem-serve on `model_dir` with `serve_flags`, started and
// stopped here; empty (and a test failure) when it does not start.
std::vector<std::vector<int32_t>> ColocatedContinuations(
    const std::string& model_dir, const std::vector<std::string>& serve_flags,
    const nlohmann::json& manifest, int max_tokens);

// A pruning plan served both ways on the golden prompts: a cluster whose decoder runs
// `plan_flag` (--plan=FILE, with `decode_flags`) fed by a full prefill, then colocated
// tandem-serve with the same plan; their greedy continuations of `max_tokens`, the decoder's
// tandem_experts_resident and tandem_expert_weight_bytes and tandem-serve's weight bytes, and
// the decoder's streaming counters (for a decoder given --expert_pack).
struct PlanServing {
  std::vector<std::vector<int32_t>> disaggregated, colocated;
  double decode_experts = -1, decode_bytes = -1, serve_bytes = -1;
  // tandem_expert_cache_requests_total{result="miss"}, tandem_expert_pairs_total{tier="warm"}
  // and {tier="cold"}, tandem_expert_neurons_total.
  double cache_misses = -1, warm_pairs = -1, cold_pairs = -1, neurons = -1;
};
PlanServing ServePlanBothWays(const std::string& model_dir, const nlohmann::json& manifest,
                              int max_tokens, const std::string& plan_flag,
                              std::vector<std::string> decode_flags = {});
// ServePlanBothWays for a decoder that streams expert `pack` through a cache of `cache_bytes`
// (with `decode_flags`) against colocated serving with every expert resident, both with
// `plan` (a file) on `model_dir`; expects their continuations to be the same.
PlanServing ServeStreamedBothWays(const std::string& model_dir, const std::string& plan,
                                  const std::string& pack, int64_t cache_bytes,
                                  const nlohmann::json& manifest, int max_tokens,
                                  std::vector<std::string> decode_flags = {});

// Expects the two to give the same tokens on every prompt, `tokens` of them, each starting
// with the reference's first token (the full prefill's), and the plan to change at least one
// continuation from the reference's.
void ExpectPrunedDecoderEqualsColocated(const PlanServing& runs, const nlohmann::json& manifest,
                                        int tokens);

// Expects `got` to equal `want` prompt for prompt, each `want` of `tokens` tokens.
void ExpectSameContinuations(const std::vector<std::vector<int32_t>>& got,
                             const std::vector<std::vector<int32_t>>& want, int tokens);

}  // namespace tandem::testing
