// A fixed-size pool of threads for splitting one loop across the cores (the kernels use it for
// large matrix products). The caller of ParallelFor works too, so a pool of N threads has N - 1
// background workers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tandem::kernels::cpu {

class ThreadPool {
 public:
  // `num_threads` threads run each ParallelFor, the caller included; <= 0 means one per CPU
  // this process may use (AvailableCpus()).
  explicit ThreadPool(int num_threads = 0);
  // Waits for the workers to finish what they are running (nothing, unless a ParallelFor is
  // still in flight) and joins them.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges that together cover [0, n) exactly once, each at
  // least `grain` long except the last, from the caller and the workers; returns when all calls
  // have returned. If a call throws, ranges not yet started are skipped and the first exception
  // is rethrown here. Runs everything inline in the caller when n <= grain, when the pool has
  // one thread, or when the pool is already running a ParallelFor (a nested call from inside
  // `fn`, or a second caller thread), so it never waits on another caller's work.
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  struct Job;

  void WorkerLoop();
  static void RunChunks(Job& job);

  std::mutex mu_;
  std::condition_variable wake_;
  std::shared_ptr<Job> job_;  // Guarded by mu_; the job the workers should help with.
  uint64_t generation_ = 0;   // Guarded by mu_; bumped for each new job.
  // generation_ as idle workers poll it while spinning (all ones once stopping).
  std::atomic<uint64_t> published_{0};
  bool stop_ = false;              // Guarded by mu_.
  std::atomic<bool> busy_{false};  // A ParallelFor is using the workers.
  std::vector<std::thread> workers_;
};

// The CPUs this process may run on: those of its CPU affinity mask (taskset, cpusets, the
// Kubernetes static CPU manager), capped by a cgroup CPU quota rounded up (a container's CPU
// limit). std::thread::hardware_concurrency() counts the whole machine's.
int AvailableCpus();
// The CPUs a cgroup quota allows: `cpu_max` is cgroup v2's cpu.max ("QUOTA PERIOD" or
// "max PERIOD"); 0 when there is no quota or the text is not one.
int CpusOfQuota(const std::string& cpu_max);

// The process-wide pool the kernels use, created on first use and never destroyed: with
// SetDefaultThreadCount's threads, or one per available CPU.
ThreadPool& DefaultThreadPool();
// Sets the default pool's thread count (0: AvailableCpus()). Only before its first use (false
// after, when it changes nothing); call it first thing in main().
bool SetDefaultThreadCount(int num_threads);

}  // namespace tandem::kernels::cpu
