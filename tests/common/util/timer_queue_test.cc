// Monotonic instants (util/clock.h) and the timer queue that runs callbacks at them: instants
// order and subtract, the time left on a deadline never goes below zero, a wall-clock deadline
// converts both ways, and timers run in order, not before their time, once, unless cancelled.
#include "common/util/timer_queue.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/util/clock.h"

namespace tandem::util {
namespace {

TEST(InstantTest, OrdersAndSubtracts) {
  const Instant a = Instant::Now();
  const Instant b = a + absl::Milliseconds(250);
  EXPECT_LT(a, b);
  EXPECT_GT(b, a);
  EXPECT_LE(a, a);
  EXPECT_EQ(b - a, absl::Milliseconds(250));
  EXPECT_EQ(b - absl::Milliseconds(250), a);
  Instant c = a;
  c += absl::Seconds(1);
  EXPECT_EQ(c - a, absl::Seconds(1));
  EXPECT_NE(c, a);
  EXPECT_GE(Instant::Now(), a);  // never goes back
}

TEST(InstantTest, NeverIsLaterThanEveryInstant) {
  const Instant far = Instant::Now() + absl::Hours(24 * 365 * 100);
  EXPECT_GT(Instant::Never(), far);
  EXPECT_EQ(Until(Instant::Never()), absl::InfiniteDuration());
  EXPECT_EQ(ToWallDeadline(Instant::Never()), absl::InfiniteFuture());
  EXPECT_EQ(FromWallDeadline(absl::InfiniteFuture()), Instant::Never());
}

TEST(InstantTest, UntilIsTheTimeLeftAndNeverNegative) {
  const absl::Duration left = Until(Instant::Now() + absl::Seconds(10));
  EXPECT_GT(left, absl::Seconds(9));
  EXPECT_LE(left, absl::Seconds(10));
  EXPECT_EQ(Until(Instant::Now() - absl::Seconds(1)), absl::ZeroDuration());
  const Instant start = Instant::Now();
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_GE(Since(start), absl::Milliseconds(20));
}

TEST(InstantTest, WallDeadlinesConvertBothWays) {
  const absl::Time wall = absl::Now() + absl::Seconds(30);
  const Instant deadline = FromWallDeadline(wall);
  EXPECT_GT(Until(deadline), absl::Seconds(29));
  EXPECT_LE(Until(deadline), absl::Seconds(30));
  const absl::Duration back = ToWallDeadline(deadline) - wall;
  EXPECT_LT(absl::AbsDuration(back), absl::Seconds(1));
  // A wall deadline already past is an instant already past.
  EXPECT_EQ(Until(FromWallDeadline(absl::Now() - absl::Seconds(5))), absl::ZeroDuration());
}

TEST(TimerQueueTest, RunsTimersInOrderAndNotEarly) {
  TimerQueue queue;
  absl::Mutex mu;
  std::vector<int> ran;
  std::vector<absl::Duration> late;  // how long after its time each ran
  absl::Notification all;
  const Instant start = Instant::Now();
  for (int i : {3, 1, 2}) {
    const Instant when = start + absl::Milliseconds(40 * i);
    queue.Schedule(when, [&, i, when] {
      absl::MutexLock lock(&mu);
      ran.push_back(i);
      late.push_back(Instant::Now() - when);
      if (ran.size() == 3) all.Notify();
    });
  }
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
  for (absl::Duration d : late) EXPECT_GE(d, absl::ZeroDuration());
}

TEST(TimerQueueTest, APastTimeRunsAtOnceAndACancelledTimerNever) {
  TimerQueue queue;
  absl::Notification past;
  queue.Schedule(Instant::Now() - absl::Seconds(1), [&] { past.Notify(); });
  EXPECT_TRUE(past.WaitForNotificationWithTimeout(absl::Seconds(5)));

  // A second away, so that it is still pending when cancelled however loaded the machine; a
  // timer at the same instant, scheduled after it, would run after it had it not been removed.
  absl::Notification cancelled_ran, later;
  const Instant when = Instant::Now() + absl::Seconds(1);
  const TimerQueue::Id id = queue.Schedule(when, [&] { cancelled_ran.Notify(); });
  EXPECT_TRUE(queue.Cancel(id));
  EXPECT_FALSE(queue.Cancel(id));  // no longer pending
  queue.Schedule(when, [&] { later.Notify(); });
  ASSERT_TRUE(later.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(cancelled_ran.HasBeenNotified());
}

TEST(TimerQueueTest, AnExceptionInACallbackDoesNotStopTheQueue) {
  TimerQueue queue;
  absl::Notification after;
  queue.ScheduleAfter(absl::ZeroDuration(), [] { throw std::runtime_error("callback failed"); });
  queue.ScheduleAfter(absl::Milliseconds(10), [&] { after.Notify(); });
  EXPECT_TRUE(after.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

}  // namespace
}  // namespace tandem::util
