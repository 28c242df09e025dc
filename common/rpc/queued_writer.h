// A server-streaming reactor fed from other threads (an engine loop, a dispatch thread). Push
// queues a message, End sets the final status; messages go out one write at a time, in order,
// and the stream finishes once the last one is out. When the client goes away the stream
// finishes CANCELLED at once and the cancel hook runs (to stop the work that feeds it). What
// producers touch lives in the Feed, which outlives the reactor: gRPC deletes the reactor in
// OnDone while a producer may still be pushing.
#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/rpc/rpc_metrics.h"

namespace tandem::rpc {

template <typename T>
class QueuedWriter : public grpc::ServerWriteReactor<T> {
 public:
  class Feed {
   public:
    // Queues `message`; dropped once the stream has finished.
    void Push(T message) {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finished_) return;
      pending_.push_back(std::move(message));
      reactor_->Pump();
    }
    // No more messages: the stream finishes with `status` once the queued ones are out.
    void End(const grpc::Status& status) {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finished_) return;
      done_ = true;
      final_status_ = status;
      reactor_->Pump();
    }
    // What to do when the client goes away; runs at once if it already has.
    void SetOnCancel(std::function<void()> on_cancel) {
      absl::MutexLock lock(&mu_);
      on_cancel_ = std::move(on_cancel);
      if (cancelled_) on_cancel_();
    }

   private:
    friend class QueuedWriter;
    absl::Mutex mu_;
    QueuedWriter* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;
    std::deque<T> pending_ ABSL_GUARDED_BY(mu_);
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool done_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
    bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
    grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
    std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
  };

  // Records the RPC as `rpc` in `metrics` when it is done.
  QueuedWriter(RpcMetrics* metrics, std::string rpc)
      : metrics_(metrics),
        rpc_(std::move(rpc)),
        start_(absl::Now()),
        feed_(std::make_shared<Feed>()) {
    absl::MutexLock lock(&feed_->mu_);
    feed_->reactor_ = this;
  }

  std::shared_ptr<Feed> feed() const { return feed_; }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&feed_->mu_);
    feed_->writing_ = false;
    feed_->pending_.pop_front();
    if (!ok) {  // the client is gone
      CancelLocked();
      return;
    }
    Pump();
  }
  void OnCancel() override {
    absl::MutexLock lock(&feed_->mu_);
    CancelLocked();
  }
  void OnDone() override {
    grpc::Status status;
    {
      absl::MutexLock lock(&feed_->mu_);
      feed_->reactor_ = nullptr;
      status = feed_->final_status_;
    }
    metrics_->Record(rpc_, status, absl::Now() - start_);
    delete this;
  }

 private:
  // Starts the next write, or finishes once the last message is out.
  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(feed_->mu_) {
    if (feed_->finished_ || feed_->writing_) return;
    if (!feed_->pending_.empty()) {
      feed_->writing_ = true;
      this->StartWrite(&feed_->pending_.front());
    } else if (feed_->done_) {
      feed_->finished_ = true;
      this->Finish(feed_->final_status_);
    }
  }
  void CancelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(feed_->mu_) {
    if (feed_->finished_) return;
    feed_->cancelled_ = true;
    if (feed_->on_cancel_) feed_->on_cancel_();
    feed_->finished_ = true;
    feed_->final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
    this->Finish(feed_->final_status_);
  }

  RpcMetrics* const metrics_;
  const std::string rpc_;
  const absl::Time start_;
  const std::shared_ptr<Feed> feed_;
};

}  // namespace tandem::rpc
