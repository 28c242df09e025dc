#include "common/util/guard.h"

#include <atomic>

#include "absl/synchronization/mutex.h"
#include "common/util/logging.h"

namespace tandem::util {
namespace {

std::atomic<int64_t> g_count{0};

struct Listener {
  absl::Mutex mu;
  std::function<void(std::string_view)> fn ABSL_GUARDED_BY(mu);
};

Listener& TheListener() {
  static Listener* const listener = new Listener;  // never destroyed: threads may outlive main
  return *listener;
}

}  // namespace

void ReportInternalError(std::string_view where, std::string_view what) {
  g_count.fetch_add(1, std::memory_order_relaxed);
  // Logging must not throw either: a failure to log is dropped.
  try {
    TANDEM_LOG(ERROR) << "internal error in " << where << ": " << what;
  } catch (...) {
  }
  std::function<void(std::string_view)> fn;
  {
    Listener& listener = TheListener();
    absl::MutexLock lock(&listener.mu);
    fn = listener.fn;
  }
  if (fn) {
    try {
      fn(where);
    } catch (...) {
    }
  }
}

int64_t InternalErrorCount() { return g_count.load(std::memory_order_relaxed); }

void SetInternalErrorListener(std::function<void(std::string_view where)> listener) {
  Listener& l = TheListener();
  absl::MutexLock lock(&l.mu);
  l.fn = std::move(listener);
}

}  // namespace tandem::util
