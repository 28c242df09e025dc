#include "common/util/timer_queue.h"

#include "absl/time/clock.h"
#include "common/util/guard.h"

namespace tandem::util {

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

TimerQueue::Id TimerQueue::Schedule(absl::Time when, std::function<void()> fn) {
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
    const absl::Time next =
        timers_.empty() ? absl::Now() + absl::Seconds(1) : timers_.begin()->first;
    if (next > absl::Now()) mu_.AwaitWithDeadline(absl::Condition(&woken), next);
    if (stop_) return;
    if (timers_.empty() || timers_.begin()->first > absl::Now()) continue;
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
