// Streams expert weights into the forward pass from an expert cache over a backing tier
// (expert_store.h), on an I/O thread of its own: each layer's experts are loaded in the order
// the forward pass asks for them (widest first), and the forward pass computes each as soon as
// it is in, so wide experts' compute hides narrow experts' loads. Without overlap, a layer's
// loads all finish before its compute starts (for comparison).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/engine/forward.h"
#include "common/moe/expert_store.h"

namespace tandem::moe {

struct StreamStats {
  CacheStats cache;  // hits, misses, widenings, bytes loaded, load seconds (I/O thread)
  int64_t backing_bytes_read = 0;  // what the backing read (aligned blocks for a file)
  double wait_seconds = 0;         // the forward pass blocked waiting for loads
  // Load time not spent waiting: hidden behind compute (load_seconds - wait_seconds, >= 0).
  double hidden_seconds() const { return std::max(0.0, cache.load_seconds - wait_seconds); }
};

class ExpertStream : public engine::ExpertProvider {
 public:
  // `backing` must outlive the stream. INVALID_ARGUMENT as ExpertCache::Create.
  static absl::StatusOr<std::unique_ptr<ExpertStream>> Create(
      ExpertBacking* backing, int64_t cache_bytes, bool overlap,
      absl::Duration deadline = absl::Seconds(60));
  ~ExpertStream() override;

  absl::Status BeginLayer(int layer, absl::Span<const engine::ExpertLoad> loads) override;
  absl::StatusOr<engine::ExpertView> Wait(int layer, int expert, int width) override;
  void EndLayer(int layer) override;

  // Replacement priority weights of the cache (see ExpertCache::SetPriorityWeights); call
  // between steps.
  void SetPriorityWeights(std::vector<std::vector<double>> weights);
  // Call between steps (while no layer's loads run).
  StreamStats stats() const;
  int64_t cache_bytes() const { return cache_->capacity_bytes(); }

 private:
  struct Job {
    int layer = 0;
    engine::ExpertLoad load;
    bool done = false;
    absl::Status status;
    const ResidentExpert* expert = nullptr;
  };
  ExpertStream(ExpertBacking* backing, std::unique_ptr<ExpertCache> cache, bool overlap,
               absl::Duration deadline)
      : backing_(backing), cache_(std::move(cache)), overlap_(overlap), deadline_(deadline) {}
  void Run();  // the I/O thread

  ExpertBacking* const backing_;
  const std::unique_ptr<ExpertCache> cache_;  // touched by the I/O thread only while it runs
  const bool overlap_;
  const absl::Duration deadline_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Job> jobs_;  // this layer's, in load order
  size_t next_job_ = 0;    // the next one the I/O thread takes
  bool stop_ = false;
  double wait_seconds_ = 0;
  std::thread thread_;
};

}  // namespace tandem::moe
