#include "common/kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace tandem::kernels::cpu {
namespace {

// Runs ParallelFor and checks that the ranges are well formed and cover [0, n) exactly once.
void ExpectCoversOnce(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int> bad_ranges{0};
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    if (begin < 0 || end > n || begin >= end) {
      bad_ranges.fetch_add(1);
      return;
    }
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
  });
  EXPECT_EQ(bad_ranges.load(), 0) << "n=" << n << " grain=" << grain;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(hits[i].load(), 1) << "index " << i << " n=" << n << " grain=" << grain;
  }
}

TEST(ThreadPoolTest, SizesToTheAvailableCpusByDefault) {
  ThreadPool pool;
  EXPECT_EQ(pool.num_threads(), AvailableCpus());
  EXPECT_GE(AvailableCpus(), 1);
  EXPECT_LE(AvailableCpus(), std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  EXPECT_EQ(ThreadPool(3).num_threads(), 3);
  EXPECT_EQ(DefaultThreadPool().num_threads(), pool.num_threads());
  // Once the default pool exists its size is fixed.
  EXPECT_FALSE(SetDefaultThreadCount(1));
  EXPECT_EQ(DefaultThreadPool().num_threads(), pool.num_threads());
}

TEST(ThreadPoolTest, AvailableCpusFollowTheAffinityMask) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_EQ(AvailableCpus(), 1);  // as under taskset -c N, or a pinned container
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  EXPECT_GE(AvailableCpus(), 1);
}

TEST(ThreadPoolTest, CgroupQuotasRoundUpToWholeCpus) {
  EXPECT_EQ(CpusOfQuota("200000 100000"), 2);
  EXPECT_EQ(CpusOfQuota("150000 100000\n"), 2);  // 1.5 CPUs: two threads, throttled a little
  EXPECT_EQ(CpusOfQuota("50000 100000"), 1);
  EXPECT_EQ(CpusOfQuota("max 100000"), 0);  // no limit
  EXPECT_EQ(CpusOfQuota("-1 100000"), 0);   // cgroup v1's "no limit"
  EXPECT_EQ(CpusOfQuota(""), 0);
  EXPECT_EQ(CpusOfQuota("lots 100000"), 0);
  EXPECT_EQ(CpusOfQuota("100000 0"), 0);
}

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 4, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 100003}) {
      for (int64_t grain : {0, 1, 3, 64, 200000}) ExpectCoversOnce(pool, n, grain);
    }
  }
}

TEST(ThreadPoolTest, RespectsTheGrain) {
  ThreadPool pool(4);
  std::atomic<int> short_ranges{0};
  pool.ParallelFor(1000, 64, [&](int64_t begin, int64_t end) {
    if (end - begin < 64 && end != 1000) short_ranges.fetch_add(1);
  });
  EXPECT_EQ(short_ranges.load(), 0);
}

TEST(ThreadPoolTest, UsesSeveralThreadsForSlowWork) {
  ThreadPool pool(4);
  std::mutex mu;
  std::vector<std::thread::id> ids;
  pool.ParallelFor(16, 1, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> lock(mu);
    ids.push_back(std::this_thread::get_id());
  });
  std::sort(ids.begin(), ids.end());
  EXPECT_GT(std::unique(ids.begin(), ids.end()) - ids.begin(), 1);
}

TEST(ThreadPoolTest, ManyCallsInARow) {
  ThreadPool pool(4);
  for (int i = 0; i < 2000; ++i) {
    std::atomic<int64_t> sum{0};
    pool.ParallelFor(100, 1, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) sum.fetch_add(j, std::memory_order_relaxed);
    });
    ASSERT_EQ(sum.load(), 4950) << "call " << i;
  }
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(50 * 40);
  pool.ParallelFor(50, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pool.ParallelFor(40, 1, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) hits[i * 40 + j].fetch_add(1);
      });
    }
  });
  for (const auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPoolTest, ConcurrentCallersBothFinish) {
  ThreadPool pool(4);
  auto caller = [&] {
    for (int i = 0; i < 200; ++i) ExpectCoversOnce(pool, 1000, 10);
  };
  std::thread other(caller);
  caller();
  other.join();
}

TEST(ThreadPoolTest, RethrowsTheFirstExceptionAfterAllRangesStop) {
  ThreadPool pool(4);
  std::atomic<int> running{0};
  EXPECT_THROW(pool.ParallelFor(100, 1,
                                [&](int64_t begin, int64_t) {
                                  running.fetch_add(1);
                                  std::this_thread::sleep_for(std::chrono::milliseconds(1));
                                  running.fetch_sub(1);
                                  if (begin == 0) throw std::runtime_error("boom");
                                }),
               std::runtime_error);
  EXPECT_EQ(running.load(), 0);
  ExpectCoversOnce(pool, 1000, 1);  // Still usable.
}

TEST(ThreadPoolTest, DestroysWhileIdle) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool never_used(4);
  }
  ThreadPool pool(4);
  ExpectCoversOnce(pool, 1000, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));  // Workers back to waiting.
}

}  // namespace
}  // namespace tandem::kernels::cpu
