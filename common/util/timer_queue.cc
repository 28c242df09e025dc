#include "common/util/timer_queue.h"

#include <algorithm>

#include "common/util/guard.h"

namespace tandem::util {
namespace {

constexpr absl::Duration kIdleWait = absl::Seconds(1);  // with no timer, a wait's longest

}  // namespace

TimerQueue::TimerQueue() {
  thread_ = std::thread([this] { Run(); });
  thread_id_ = thread_.get_id();
}

TimerQueue::~TimerQueue() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

TimerQueue& TimerQueue::Shared() {
  static TimerQueue* const queue = new TimerQueue;  // never destroyed: used until exit
  return *queue;
}

TimerQueue::Id TimerQueue::Schedule(Instant when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  const Id id = next_id_++;
  timers_.emplace(when, std::make_pair(id, std::move(fn)));
  when_[id] = when;
  changed_ = true;  // the loop may be waiting for a later one
  return id;
}

bool TimerQueue::Cancel(Id id) {
  absl::MutexLock lock(&mu_);
  auto it = when_.find(id);
  if (it == when_.end()) {
    // Wait for it to finish if it is running now (unless it is cancelling itself).
    if (running_ == id && std::this_thread::get_id() != thread_id_) {
      auto done = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ != id; };
      mu_.Await(absl::Condition(&done));
    }
    return false;
  }
  auto range = timers_.equal_range(it->second);
  for (auto t = range.first; t != range.second; ++t) {
    if (t->second.first == id) {
      timers_.erase(t);
      break;
    }
  }
  when_.erase(it);
  return true;
}

void TimerQueue::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    changed_ = false;
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || changed_; };
    // The wait re-checks the monotonic time when it ends: this abseil ends a wait at a wall-clock
    // time, so a wall clock stepped forward ends it early (harmless), and one stepped back while
    // it waits lengthens that wait by the step.
    const absl::Duration wait =
        timers_.empty() ? kIdleWait : std::min(Until(timers_.begin()->first), kIdleWait);
    if (wait > absl::ZeroDuration()) mu_.AwaitWithTimeout(absl::Condition(&woken), wait);
    if (stop_) return;
    if (timers_.empty() || timers_.begin()->first > Instant::Now()) continue;
    auto first = timers_.begin();
    const Id id = first->second.first;
    std::function<void()> fn = std::move(first->second.second);
    timers_.erase(first);
    when_.erase(id);
    running_ = id;
    mu_.Unlock();
    Guarded("timer callback", fn);
    fn = nullptr;
    mu_.Lock();
    running_ = 0;
  }
}

}  // namespace tandem::util
