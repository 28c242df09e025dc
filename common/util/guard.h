// The last line of defence against exceptions: no exception may leave a request handler, a
// reactor or a thread of ours (one that does ends the process). Code that can throw (JSON
// libraries, allocation) is meant to be checked before it runs; Guarded catches what still
// escapes, logs it with where it happened, counts it (tandem_internal_errors_total on every
// service's /metrics) and lets the caller answer with an internal error.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string_view>
#include <utility>

namespace tandem::util {

// Records an exception caught at `where` (logs it, counts it, tells the listener).
void ReportInternalError(std::string_view where, std::string_view what);
// Internal errors caught so far in this process.
int64_t InternalErrorCount();
// Called (from any thread) after each internal error, e.g. to count it in a metric; one
// listener per process, set at start-up.
void SetInternalErrorListener(std::function<void(std::string_view where)> listener);

// Runs `fn()`. Returns true if it returned normally, false if it threw (the exception is
// reported and swallowed).
template <typename F>
bool Guarded(std::string_view where, F&& fn) noexcept {
  try {
    std::forward<F>(fn)();
    return true;
  } catch (const std::exception& e) {
    ReportInternalError(where, e.what());
  } catch (...) {
    ReportInternalError(where, "an exception of unknown type");
  }
  return false;
}

}  // namespace tandem::util
