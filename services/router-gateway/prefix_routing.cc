#include "services/router-gateway/prefix_routing.h"

#include <algorithm>
#include <numeric>
#include <string_view>
#include <tuple>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace tandem::gateway {

absl::StatusOr<PrefillRouting> ParsePrefillRouting(const std::string& value) {
  if (value == "kv_aware") return PrefillRouting::kKvAware;
  if (value == "load") return PrefillRouting::kLoad;
  return absl::InvalidArgumentError(
      absl::StrCat("--prefill_routing=", value, " is not kv_aware or load"));
}

std::vector<uint64_t> PrefixBlockKeys(absl::Span<const int32_t> tokens, int block_size) {
  std::vector<uint64_t> keys;
  if (block_size < 1) return keys;
  uint64_t parent = 0;
  for (size_t end = block_size; end <= tokens.size(); end += block_size) {
    const absl::Span<const int32_t> block = tokens.subspan(end - block_size, block_size);
    const std::string_view bytes(reinterpret_cast<const char*>(block.data()),
                                 block.size() * sizeof(int32_t));
    parent = absl::Hash<std::tuple<uint64_t, std::string_view>>()(std::make_tuple(parent, bytes));
    keys.push_back(parent);
  }
  return keys;
}

int PrefixModel::Overlap(absl::Span<const uint64_t> keys) const {
  int n = 0;
  while (n < static_cast<int>(keys.size()) && where_.contains(keys[n])) ++n;
  return n;
}

void PrefixModel::Add(absl::Span<const uint64_t> keys) {
  for (uint64_t key : keys) {
    auto it = where_.find(key);
    if (it != where_.end()) {
      lru_.splice(lru_.end(), lru_, it->second);
    } else {
      where_[key] = lru_.insert(lru_.end(), key);
    }
  }
  Trim();
}

void PrefixModel::SetCapacity(size_t capacity) {
  capacity_ = capacity;
  Trim();
}

void PrefixModel::Trim() {
  while (lru_.size() > capacity_) {
    where_.erase(lru_.front());
    lru_.pop_front();
  }
}

const char* RoutingReasonName(RoutingReason reason) {
  switch (reason) {
    case RoutingReason::kPrefix:
      return "prefix";
    case RoutingReason::kLoad:
      return "load";
    case RoutingReason::kLoadOverPrefix:
      return "load_over_prefix";
  }
  return "unknown";
}

PrefillRanking RankPrefill(absl::Span<const PrefillCandidate> candidates, int prompt_tokens,
                           PrefillRouting routing, double load_weight) {
  PrefillRanking ranking;
  ranking.order.resize(candidates.size());
  std::iota(ranking.order.begin(), ranking.order.end(), 0);
  auto cost = [&](const PrefillCandidate& c) {
    return static_cast<double>(prompt_tokens - c.cached_tokens) +
           load_weight * static_cast<double>(c.queued_tokens);
  };
  std::stable_sort(ranking.order.begin(), ranking.order.end(), [&](size_t a, size_t b) {
    const PrefillCandidate& x = candidates[a];
    const PrefillCandidate& y = candidates[b];
    if (x.healthy != y.healthy) return x.healthy;
    if (x.room != y.room) return x.room;
    if (routing == PrefillRouting::kKvAware && cost(x) != cost(y)) return cost(x) < cost(y);
    if (x.queued_tokens != y.queued_tokens) return x.queued_tokens < y.queued_tokens;
    return x.queue_depth < y.queue_depth;
  });
  if (ranking.order.empty()) return ranking;
  const PrefillCandidate& chosen = candidates[ranking.order.front()];
  int most_cached = 0;
  for (const PrefillCandidate& c : candidates) {
    if (c.healthy && c.room) most_cached = std::max(most_cached, c.cached_tokens);
  }
  ranking.reason = chosen.cached_tokens > 0 ? RoutingReason::kPrefix
                   : most_cached > 0        ? RoutingReason::kLoadOverPrefix
                                            : RoutingReason::kLoad;
  if (chosen.cached_tokens > 0 && chosen.cached_tokens < most_cached) {
    ranking.reason = RoutingReason::kLoadOverPrefix;
  }
  return ranking;
}

}  // namespace tandem::gateway
