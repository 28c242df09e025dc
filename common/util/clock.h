// Monotonic time, for deadlines, leases, timeouts and measured intervals: it never steps when the
// wall clock does (an NTP correction, a virtual machine resynchronised after a pause), so a
// deadline, a lease or a measured latency is the time that really passed. A wall clock stepped
// 12 s forward would otherwise expire every lease and idle timeout at once, and report 12 s
// latencies.
//
// absl::Now() (the wall clock) stays for what leaves the process as a date (log lines, an OpenAI
// `created`) and for gRPC deadlines, which gRPC turns into its own monotonic deadline at once.
// An Instant is a different type from absl::Time, so the two cannot be mixed: a wait on an absl
// primitive takes a timeout, `Until(deadline)`, never an Instant.
#pragma once

#include <chrono>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem::util {

class Instant {
 public:
  // The steady clock's origin (some time in the past; only differences mean anything).
  constexpr Instant() = default;

  static Instant Now() {
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now().time_since_epoch())
                           .count();
    return Instant(absl::Nanoseconds(ns));
  }
  // Later than every other instant: a deadline that never comes.
  static Instant Never() { return Instant(absl::InfiniteDuration()); }

  friend absl::Duration operator-(Instant a, Instant b) { return a.since_ - b.since_; }
  friend Instant operator+(Instant a, absl::Duration d) { return Instant(a.since_ + d); }
  friend Instant operator-(Instant a, absl::Duration d) { return Instant(a.since_ - d); }
  Instant& operator+=(absl::Duration d) {
    since_ += d;
    return *this;
  }
  friend bool operator==(Instant a, Instant b) { return a.since_ == b.since_; }
  friend bool operator!=(Instant a, Instant b) { return a.since_ != b.since_; }
  friend bool operator<(Instant a, Instant b) { return a.since_ < b.since_; }
  friend bool operator<=(Instant a, Instant b) { return a.since_ <= b.since_; }
  friend bool operator>(Instant a, Instant b) { return a.since_ > b.since_; }
  friend bool operator>=(Instant a, Instant b) { return a.since_ >= b.since_; }

 private:
  explicit Instant(absl::Duration since) : since_(since) {}
  absl::Duration since_;
};

// The time since `start`.
inline absl::Duration Since(Instant start) { return Instant::Now() - start; }

// The time left until `deadline`, zero once it has passed (infinite for Instant::Never()): the
// timeout of a wait on an absl::Mutex or absl::CondVar. Such a wait still measures its timeout on
// the wall clock (this abseil), so a waiter re-checks its Instant deadline when it wakes.
inline absl::Duration Until(Instant deadline) {
  const absl::Duration left = deadline - Instant::Now();
  return left > absl::ZeroDuration() ? left : absl::ZeroDuration();
}

// An Instant as a wall-clock deadline, for an API that takes one (a gRPC call's deadline, which
// gRPC turns back into a monotonic one at once). Instant::Never() gives absl::InfiniteFuture().
inline absl::Time ToWallDeadline(Instant deadline) { return absl::Now() + Until(deadline); }

// A wall-clock deadline (gRPC's context.deadline(), a client's deadline) as an Instant: the time
// left on it, from now. absl::InfiniteFuture() gives Instant::Never().
inline Instant FromWallDeadline(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return Instant::Never();
  return Instant::Now() + (deadline - absl::Now());
}

}  // namespace tandem::util
