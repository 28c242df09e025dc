// One thread that runs callbacks at given times: the deadlines of waits that have no thread
// of their own (a stream's idle timeout, a queued request's wait, a reservation's lease).
// Callbacks run on the timer thread, one at a time, never while a lock of the queue is held;
// they must be quick (hand longer work elsewhere). An exception a callback throws is caught
// and reported (util/guard.h). Times are monotonic (util/clock.h): a step of the wall clock neither
// runs timers early nor holds them back.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/util/clock.h"

namespace tandem::util {

class TimerQueue {
 public:
  using Id = uint64_t;

  TimerQueue();
  // Stops the thread; callbacks not yet run never run.
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `fn` at `when` (at once if it has passed). The id cancels it.
  Id Schedule(Instant when, std::function<void()> fn);
  Id ScheduleAfter(absl::Duration delay, std::function<void()> fn) {
    return Schedule(Instant::Now() + delay, std::move(fn));
  }
  // True if `id` was still pending (it will not run); false if it ran, is running, or is
  // unknown. Once Cancel returns, the callback is not running unless it runs on this thread.
  bool Cancel(Id id);

  // A process-wide queue for code that has no owner to hold one.
  static TimerQueue& Shared();

 private:
  void Run();

  absl::Mutex mu_;
  std::multimap<Instant, std::pair<Id, std::function<void()>>> timers_ ABSL_GUARDED_BY(mu_);
  std::map<Id, Instant> when_ ABSL_GUARDED_BY(mu_);
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  Id running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool changed_ ABSL_GUARDED_BY(mu_) = false;  // a timer was added
  std::thread::id thread_id_;
  std::thread thread_;
};

}  // namespace tandem::util
