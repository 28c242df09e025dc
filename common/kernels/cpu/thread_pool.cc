#include "common/kernels/cpu/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tandem::kernels::cpu {
namespace {

// How long an idle worker, and a caller waiting for workers, spin before sleeping. A decode
// step issues matrix products back to back, each a few hundred microseconds; waking a worker
// from a condition variable costs tens of microseconds on a VM, which is most of a small
// product's parallel gain. Spinning bridges the gaps inside a step; it ends soon after the
// step, so an idle process does not burn its cores.
constexpr std::chrono::microseconds kSpin(200);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Spins until done() or kSpin has passed; returns done().
template <typename Done>
bool SpinUntil(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  while (true) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

struct ThreadPool::Job {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  int64_t chunk = 0;
  int64_t num_chunks = 0;
  std::atomic<int64_t> next{0};       // Next chunk to claim.
  std::atomic<int64_t> remaining{0};  // Chunks not yet finished.
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable done;
  std::exception_ptr error;  // Guarded by mu.
};

int CpusOfQuota(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota;
  int64_t period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
  char* end = nullptr;
  const long long q = std::strtoll(quota.c_str(), &end, 10);
  if (end == quota.c_str() || *end != '\0' || q <= 0) return 0;
  return static_cast<int>((q + period - 1) / period);
}

int AvailableCpus() {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
    cpus = CPU_COUNT(&set);
  }
  // cgroup v2 (the unified hierarchy), then v1's CFS quota.
  std::ifstream v2("/sys/fs/cgroup/cpu.max");
  std::string text;
  int quota = 0;
  if (v2 && std::getline(v2, text)) {
    quota = CpusOfQuota(text);
  } else {
    std::ifstream q("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        p("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    std::string qt, pt;
    if (q && p && std::getline(q, qt) && std::getline(p, pt)) quota = CpusOfQuota(qt + " " + pt);
  }
  if (quota > 0) cpus = std::min(cpus, quota);
  return std::max(1, cpus);
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = AvailableCpus();
  workers_.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    published_.store(~uint64_t{0}, std::memory_order_release);
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    std::shared_ptr<Job> job;
    SpinUntil([&] { return published_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    // A worker that wakes late may find the job finished: it then claims no chunk, and the
    // shared_ptr keeps the counters alive while it looks.
    if (job != nullptr) RunChunks(*job);
  }
}

void ThreadPool::RunChunks(Job& job) {
  while (true) {
    const int64_t c = job.next.fetch_add(1, std::memory_order_relaxed);
    if (c >= job.num_chunks) return;
    if (!job.failed.load(std::memory_order_relaxed)) {
      const int64_t begin = c * job.chunk;
      try {
        (*job.fn)(begin, std::min(job.n, begin + job.chunk));
      } catch (...) {
        std::lock_guard<std::mutex> lock(job.mu);
        if (!job.error) job.error = std::current_exception();
        job.failed.store(true, std::memory_order_relaxed);
      }
    }
    if (job.remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(job.mu);
      job.done.notify_all();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (workers_.empty() || n <= grain || busy_.exchange(true, std::memory_order_acquire)) {
    fn(0, n);
    return;
  }
  // A few chunks per thread, so that a thread slowed by other load takes fewer of them.
  const int64_t per_thread = (n + 4 * num_threads() - 1) / (4 * num_threads());
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  job->chunk = std::max(grain, per_thread);
  job->num_chunks = (n + job->chunk - 1) / job->chunk;
  job->remaining.store(job->num_chunks, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = job;
    ++generation_;
    published_.store(generation_, std::memory_order_release);
  }
  wake_.notify_all();

  RunChunks(*job);
  // Every chunk is claimed now; wait only for those still running in workers, which finish
  // because fn does.
  auto finished = [&] { return job->remaining.load(std::memory_order_acquire) == 0; };
  if (!SpinUntil(finished)) {
    std::unique_lock<std::mutex> lock(job->mu);
    job->done.wait(lock, finished);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_.reset();
  }
  busy_.store(false, std::memory_order_release);
  if (job->error) std::rethrow_exception(job->error);
}

namespace {

std::mutex g_default_mu;
int g_default_threads = 0;
bool g_default_made = false;

}  // namespace

bool SetDefaultThreadCount(int num_threads) {
  std::lock_guard<std::mutex> lock(g_default_mu);
  if (g_default_made) return false;
  g_default_threads = num_threads;
  return true;
}

ThreadPool& DefaultThreadPool() {
  // Never destroyed (Google style for statics), so kernels stay usable during static
  // destruction; its idle workers simply end with the process.
  static ThreadPool* const pool = [] {
    std::lock_guard<std::mutex> lock(g_default_mu);
    g_default_made = true;
    return new ThreadPool(g_default_threads);
  }();
  return *pool;
}

}  // namespace tandem::kernels::cpu
