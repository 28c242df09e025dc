#include "common/kv/transfer.h"

#include <sys/random.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/util/clock.h"
#include "common/util/logging.h"

namespace tandem::kv {

absl::Status WaitForTransfer(KvTransport& transport, TransferId id, util::Instant deadline,
                             const std::function<bool()>& cancelled) {
  absl::Duration backoff = absl::Microseconds(5);
  while (true) {
    absl::StatusOr<bool> done = transport.Poll(id);
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    if (cancelled && cancelled()) {
      return absl::CancelledError("the KV transfer was abandoned: its request was cancelled");
    }
    const util::Instant now = util::Instant::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("KV transfer ", static_cast<uint64_t>(id),
                                                      " over ", std::string(transport.name()),
                                                      " did not finish before its deadline"));
    }
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, absl::Milliseconds(1));
  }
}

std::string RandomToken() {
  std::string token(kTokenBytes, '\0');
  size_t filled = 0;
  while (filled < token.size()) {
    const ssize_t n = getrandom(token.data() + filled, token.size() - filled, 0);
    if (n > 0) {
      filled += static_cast<size_t>(n);
    } else {
      TANDEM_CHECK(errno == EINTR) << "getrandom failed: errno " << errno;
    }
  }
  return token;
}

}  // namespace tandem::kv
