#include "common/kv/inbox.h"

#include "absl/strings/str_cat.h"

namespace tandem::kv {

absl::StatusOr<std::string> KvInbox::Open(std::vector<int32_t> blocks, int32_t state_slot) {
  absl::StatusOr<KvStream> stream = KvStream::Of(pool_, std::move(blocks), state_slot);
  if (!stream.ok()) return stream.status();
  absl::MutexLock lock(&mu_);
  std::string token;
  do {
    token = RandomToken();
  } while (open_.contains(token));
  open_.emplace(token, Entry{*std::move(stream), {}, 0, false});
  return token;
}

bool KvInbox::Close(const std::string& token) {
  absl::MutexLock lock(&mu_);
  return open_.erase(token) > 0;
}

absl::Status KvInbox::CheckComplete(const std::string& token) const {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(token);
  if (it == open_.end()) return absl::NotFoundError("no KV inbox is open for this reservation");
  if (!it->second.complete) {
    return absl::FailedPreconditionError(
        absl::StrCat("the reservation's KV has not all arrived (", it->second.bytes, " of ",
                     it->second.stream.size(), " bytes, not committed)"));
  }
  return absl::OkStatus();
}

int KvInbox::num_open() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(open_.size());
}

absl::Status KvInbox::Write(std::string_view token, uint64_t offset, std::string_view data) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(std::string(token));
  if (it == open_.end()) {
    return Drop(absl::NotFoundError("the reservation is unknown or has ended: its KV is dropped"),
                data.size());
  }
  Entry& e = it->second;
  if (e.complete) {
    return Drop(absl::FailedPreconditionError("the reservation's KV is complete"), data.size());
  }
  if (data.empty()) return absl::OkStatus();
  const uint64_t end = offset + data.size();
  if (offset > e.stream.size() || data.size() > e.stream.size() - offset) {
    return Drop(absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", end,
                                                   ") are outside the reservation's KV stream of ",
                                                   e.stream.size(), " bytes")),
                data.size());
  }
  // Each byte once: a range that overlaps one already received is refused.
  auto next = e.received.lower_bound(offset);
  if (next != e.received.end() && next->first < end) {
    return Drop(absl::AlreadyExistsError("these KV bytes have arrived already"), data.size());
  }
  if (next != e.received.begin() && std::prev(next)->second > offset) {
    return Drop(absl::AlreadyExistsError("these KV bytes have arrived already"), data.size());
  }
  if (absl::Status s = e.stream.Write(offset, data); !s.ok()) return s;
  uint64_t begin = offset, stop = end;
  if (next != e.received.begin() && std::prev(next)->second == offset) {
    auto prev = std::prev(next);
    begin = prev->first;
    e.received.erase(prev);
  }
  if (next != e.received.end() && next->first == end) {
    stop = next->second;
    e.received.erase(next);
  }
  e.received[begin] = stop;
  e.bytes += data.size();
  return absl::OkStatus();
}

absl::Status KvInbox::Drop(absl::Status why, uint64_t bytes) const {
  if (on_dropped_) on_dropped_(bytes);
  return why;
}

absl::Status KvInbox::Commit(std::string_view token, uint64_t size) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(std::string(token));
  if (it == open_.end()) {
    return absl::NotFoundError("the reservation is unknown or has ended (past its lease?)");
  }
  Entry& e = it->second;
  if (size != e.stream.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the sender committed ", size,
                                                   " bytes; the reservation's KV is ",
                                                   e.stream.size(), " bytes"));
  }
  if (e.bytes != e.stream.size()) {
    return absl::DataLossError(absl::StrCat("only ", e.bytes, " of ", e.stream.size(),
                                            " bytes of the reservation's KV arrived"));
  }
  e.complete = true;
  return absl::OkStatus();
}

}  // namespace tandem::kv
