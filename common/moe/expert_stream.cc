#include "common/moe/expert_stream.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/util/clock.h"
#include "common/util/status.h"

namespace tandem::moe {

absl::StatusOr<std::unique_ptr<ExpertStream>> ExpertStream::Create(ExpertBacking* backing,
                                                                   int64_t cache_bytes,
                                                                   bool overlap,
                                                                   absl::Duration deadline) {
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertCache> cache, ExpertCache::Create(backing, cache_bytes));
  std::unique_ptr<ExpertStream> stream(
      new ExpertStream(backing, std::move(cache), overlap, deadline));
  stream->thread_ = std::thread([s = stream.get()] { s->Run(); });
  return stream;
}

ExpertStream::~ExpertStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ExpertStream::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || next_job_ < jobs_.size(); });
    if (stop_) return;
    const size_t index = next_job_++;
    const int layer = jobs_[index].layer;
    const engine::ExpertLoad load = jobs_[index].load;
    lock.unlock();
    // The cache is the I/O thread's while a layer's loads run: the forward pass reads only the
    // experts handed to it, which stay pinned (never evicted or widened) until EndLayer.
    absl::StatusOr<const ResidentExpert*> expert = cache_->Acquire(layer, load.expert, load.width);
    lock.lock();
    Job& job = jobs_[index];
    job.done = true;
    if (expert.ok()) {
      job.expert = *expert;
    } else {
      job.status = expert.status();
    }
    cv_.notify_all();
  }
}

absl::Status ExpertStream::BeginLayer(int layer, absl::Span<const engine::ExpertLoad> loads) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.clear();
    for (const engine::ExpertLoad& load : loads) {
      Job job;
      job.layer = layer;
      job.load = load;
      jobs_.push_back(job);
    }
    next_job_ = 0;
  }
  cv_.notify_all();
  if (overlap_ || loads.empty()) return absl::OkStatus();
  // Without overlap: every load of the layer before any compute.
  const engine::ExpertLoad& last = loads.back();
  return Wait(layer, last.expert, last.width).status();
}

absl::StatusOr<engine::ExpertView> ExpertStream::Wait(int layer, int expert, int width) {
  const util::Instant start = util::Instant::Now();
  std::unique_lock<std::mutex> lock(mu_);
  auto job = std::find_if(jobs_.begin(), jobs_.end(), [&](const Job& j) {
    return j.layer == layer && j.load.expert == expert;
  });
  if (job == jobs_.end() || job->load.width < width) {
    return absl::InvalidArgumentError(absl::StrCat("expert ", expert, " of layer ", layer,
                                                   " at width ", width,
                                                   " was not asked for when the layer began"));
  }
  const size_t index = static_cast<size_t>(job - jobs_.begin());
  // Loads run in order: wait for this one (and so every one before it).
  const bool in =
      cv_.wait_for(lock, absl::ToChronoNanoseconds(deadline_), [&] { return jobs_[index].done; });
  wait_seconds_ += absl::ToDoubleSeconds(util::Since(start));
  if (!in) {
    return absl::DeadlineExceededError(absl::StrCat("loading expert ", expert, " of layer ", layer,
                                                    " took over ",
                                                    absl::FormatDuration(deadline_)));
  }
  const Job& done = jobs_[index];
  RETURN_IF_ERROR(done.status);
  if (!overlap_) {  // everything is in: later waits of this layer do not count again
    for (const Job& j : jobs_) RETURN_IF_ERROR(j.status);
  }
  const ResidentExpert& r = *done.expert;
  return engine::ExpertView{r.gate.view(), r.up.view(), r.down.view()};
}

void ExpertStream::EndLayer(int) {
  std::unique_lock<std::mutex> lock(mu_);
  // Loads the forward pass did not wait for (it stopped on an error) finish first.
  cv_.wait(lock, [&] {
    return std::all_of(jobs_.begin(), jobs_.end(), [](const Job& j) { return j.done; });
  });
  jobs_.clear();
  next_job_ = 0;
  cache_->UnpinAll();
}

void ExpertStream::SetPriorityWeights(std::vector<std::vector<double>> weights) {
  std::lock_guard<std::mutex> lock(mu_);
  cache_->SetPriorityWeights(std::move(weights));
}

StreamStats ExpertStream::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  StreamStats s;
  s.cache = cache_->stats();
  s.backing_bytes_read = backing_->bytes_read();
  s.wait_seconds = wait_seconds_;
  return s;
}

}  // namespace tandem::moe
