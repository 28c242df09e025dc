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
#include "common/rpc/rpc_metrics.h"
#include "common/util/clock.h"
#include "common/util/timer_queue.h"

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
      last_push_ = util::Instant::Now();
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
      {
        absl::MutexLock lock(&mu_);
        if (!cancelled_) {
          on_cancel_ = std::move(on_cancel);
          return;
        }
      }
      on_cancel();  // outside the lock: it may end the stream
    }
    // From now on, whenever nothing has been pushed for `interval`, pushes `heartbeat` (a
    // keep-alive the reader can tell from output), until the stream ends.
    static void StartHeartbeats(const std::shared_ptr<Feed>& feed, absl::Duration interval,
                                T heartbeat) {
      {
        absl::MutexLock lock(&feed->mu_);
        feed->last_push_ = util::Instant::Now();
      }
      ScheduleHeartbeat(feed, interval, std::move(heartbeat));
    }

   private:
    friend class QueuedWriter;
    static void ScheduleHeartbeat(const std::shared_ptr<Feed>& feed, absl::Duration interval,
                                  T heartbeat) {
      std::weak_ptr<Feed> weak = feed;
      util::TimerQueue::Shared().ScheduleAfter(
          interval / 2, [weak, interval, heartbeat = std::move(heartbeat)]() mutable {
            std::shared_ptr<Feed> f = weak.lock();
            if (f == nullptr) return;
            {
              absl::MutexLock lock(&f->mu_);
              if (f->reactor_ == nullptr || f->finished_ || f->done_) return;
              if (util::Since(f->last_push_) >= interval) {
                f->last_push_ = util::Instant::Now();
                f->pending_.push_back(heartbeat);
                f->reactor_->Pump();
              }
            }
            ScheduleHeartbeat(f, interval, std::move(heartbeat));
          });
    }

    absl::Mutex mu_;
    util::Instant last_push_ ABSL_GUARDED_BY(mu_);
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
        start_(util::Instant::Now()),
        feed_(std::make_shared<Feed>()) {
    absl::MutexLock lock(&feed_->mu_);
    feed_->reactor_ = this;
  }

  std::shared_ptr<Feed> feed() const { return feed_; }

  void OnWriteDone(bool ok) override {
    std::function<void()> on_cancel;
    {
      absl::MutexLock lock(&feed_->mu_);
      feed_->writing_ = false;
      feed_->pending_.pop_front();
      if (ok) {
        Pump();
        return;
      }
      on_cancel = CancelLocked();  // the client is gone
    }
    if (on_cancel) on_cancel();
  }
  void OnCancel() override {
    std::function<void()> on_cancel;
    {
      absl::MutexLock lock(&feed_->mu_);
      on_cancel = CancelLocked();
    }
    // Outside the lock: stopping the producer may end the stream (Feed::End) at once.
    if (on_cancel) on_cancel();
  }
  void OnDone() override {
    grpc::Status status;
    {
      absl::MutexLock lock(&feed_->mu_);
      feed_->reactor_ = nullptr;
      status = feed_->final_status_;
    }
    metrics_->Record(rpc_, status, util::Since(start_));
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
  // Finishes the stream CANCELLED; returns the producer's cancel hook for the caller to run
  // once it has let go of the lock.
  std::function<void()> CancelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(feed_->mu_) {
    if (feed_->finished_) return nullptr;
    feed_->cancelled_ = true;
    std::function<void()> on_cancel = std::move(feed_->on_cancel_);
    feed_->on_cancel_ = nullptr;
    feed_->finished_ = true;
    feed_->final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
    this->Finish(feed_->final_status_);
    return on_cancel;
  }

  RpcMetrics* const metrics_;
  const std::string rpc_;
  const util::Instant start_;
  const std::shared_ptr<Feed> feed_;
};

}  // namespace tandem::rpc
