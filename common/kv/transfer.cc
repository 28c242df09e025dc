#include "common/kv/transfer.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::kv {

absl::Status WaitForTransfer(KvTransport& transport, TransferId id, absl::Time deadline) {
  absl::Duration backoff = absl::Microseconds(5);
  while (true) {
    absl::StatusOr<bool> done = transport.Poll(id);
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("KV transfer ", static_cast<uint64_t>(id),
                                                      " over ", std::string(transport.name()),
                                                      " did not finish before its deadline"));
    }
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, absl::Milliseconds(1));
  }
}

absl::Status CheckSpans(absl::Span<const CopySpan> spans, uint64_t src_size, uint64_t dst_size) {
  for (size_t i = 0; i < spans.size(); ++i) {
    const CopySpan& s = spans[i];
    if (s.length == 0 || s.src_offset > src_size || s.length > src_size - s.src_offset ||
        s.dst_offset > dst_size || s.length > dst_size - s.dst_offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "span ", i, " (", s.length, " bytes from offset ", s.src_offset, " to ", s.dst_offset,
          ") is empty or outside the regions (", src_size, " and ", dst_size, " bytes)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::kv
