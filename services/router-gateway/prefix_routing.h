// KV-aware routing across prefill instances (docs/kv-cache.md "KV-aware routing"): the gateway
// keeps, for each prefill instance, a model of the prompt blocks it has sent there (the
// instance's prefix cache keeps the same full blocks, evicted least recently used), and ranks
// instances by the prefill work a prompt would cost on each:
//
//   cost(i) = (prompt tokens - tokens of the prompt's leading blocks i holds)
//             + load_weight * (prompt tokens this gateway has in flight at i)
//
// The first term is what i would compute for this prompt; the second what it computes before
// (a prompt's time to first token grows with both: the batch shares the instance's compute).
// load_weight (default 1) prices queued tokens against tokens to compute; 0 routes by prefix
// alone, a large weight by load alone. Routing "load" ignores the prefix: the least loaded
// instance, as before this existed. Ties go to the earlier instance in the rotation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem::gateway {

enum class PrefillRouting { kKvAware, kLoad };

// "kv_aware" or "load"; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<PrefillRouting> ParsePrefillRouting(const std::string& value);

// The chain keys of `tokens`' full blocks of `block_size`: key i stands for tokens
// [0, (i + 1) * block_size), so equal keys mean equal prefixes (to 64-bit hash strength: a
// collision only misroutes, the instance's own cache compares tokens).
std::vector<uint64_t> PrefixBlockKeys(absl::Span<const int32_t> tokens, int block_size);

// One instance's blocks as the gateway last sent them, at most `capacity` of them, least
// recently sent evicted first. Not thread-safe.
class PrefixModel {
 public:
  explicit PrefixModel(size_t capacity) : capacity_(capacity) {}
  // Moves keep the list's nodes, so the index stays valid; copies would not.
  PrefixModel(PrefixModel&&) = default;
  PrefixModel& operator=(PrefixModel&&) = default;
  PrefixModel(const PrefixModel&) = delete;
  PrefixModel& operator=(const PrefixModel&) = delete;

  // How many of `keys`' leading blocks it holds.
  int Overlap(absl::Span<const uint64_t> keys) const;
  // Records that the instance now holds `keys` (most recently used, the last the newest of
  // them), evicting the least recently sent blocks beyond the capacity.
  void Add(absl::Span<const uint64_t> keys);
  // A new bound (the instance's pool size); evicts down to it.
  void SetCapacity(size_t capacity);
  size_t size() const { return lru_.size(); }

 private:
  void Trim();

  size_t capacity_;
  std::list<uint64_t> lru_;  // least recently sent first
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

// What the ranking needs to know of one prefill instance.
struct PrefillCandidate {
  bool healthy = true;
  bool room = true;           // below the queue capacity it advertises
  int cached_tokens = 0;      // of this prompt, by its PrefixModel
  int64_t queued_tokens = 0;  // prompt tokens this gateway has in flight there
  int queue_depth = 0;        // prompts in the instance, by its last health check
};

enum class RoutingReason {
  kPrefix,          // the chosen instance holds some of the prompt
  kLoad,            // no instance holds any of it: the least loaded one
  kLoadOverPrefix,  // another instance holds more of it, but its queue costs more
};
const char* RoutingReasonName(RoutingReason reason);

struct PrefillRanking {
  std::vector<size_t> order;  // candidate indices, best first
  RoutingReason reason = RoutingReason::kLoad;
};

// Healthy instances first, then those with room, then by cost (kKvAware) or by load (kLoad:
// queued tokens, then queue depth); stable, so ties keep the candidates' order.
PrefillRanking RankPrefill(absl::Span<const PrefillCandidate> candidates, int prompt_tokens,
                           PrefillRouting routing, double load_weight);

}  // namespace tandem::gateway
