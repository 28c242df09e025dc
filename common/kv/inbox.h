// Decode's side of a KV transfer: one inbox per reservation, the only way bytes from a peer
// reach the pool. An inbox accepts the KV stream (kv_stream.h) of its blocks under its token,
// each byte once, until a commit finds them all; once closed, nothing more for it is written
// anywhere. Writes happen under the inbox's lock, so Close returning means no write into the
// reservation's blocks is under way or will ever start.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/kv_cache.h"
#include "common/kv/kv_stream.h"
#include "common/kv/transfer.h"

namespace tandem::kv {

class KvInbox : public KvReceiver {
 public:
  // `pool` must outlive the inbox. `on_dropped`, if set, hears of every write refused (its
  // bytes), e.g. for a metric; it is called under the inbox's lock and must be quick.
  explicit KvInbox(engine::KvBlockPool* pool, std::function<void(uint64_t bytes)> on_dropped = {})
      : pool_(pool), on_dropped_(std::move(on_dropped)) {}

  // Opens an inbox for the KV of `blocks` (in sequence order) and, where the pool keeps
  // recurrent state, the sequence's `state_slot`, and returns its token (random, kTokenBytes):
  // what a sender must present.
  absl::StatusOr<std::string> Open(std::vector<int32_t> blocks, int32_t state_slot = -1);
  // Closes it: from here on bytes sent under `token` are dropped. False if it was not open.
  bool Close(const std::string& token);
  // OK once its KV is complete (committed with every byte); FAILED_PRECONDITION saying how much
  // arrived otherwise; NOT_FOUND if it is not open.
  absl::Status CheckComplete(const std::string& token) const;
  int num_open() const;

  absl::Status Write(std::string_view token, uint64_t offset, std::string_view data) override;
  absl::Status Commit(std::string_view token, uint64_t size) override;

 private:
  struct Entry {
    KvStream stream;
    std::map<uint64_t, uint64_t> received;  // [begin, end) ranges, disjoint, merged
    uint64_t bytes = 0;
    bool complete = false;
  };

  absl::Status Drop(absl::Status why, uint64_t bytes) const;

  engine::KvBlockPool* const pool_;
  const std::function<void(uint64_t)> on_dropped_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kv
