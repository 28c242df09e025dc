#include "services/prefill/prefill_service.h"

#include <signal.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/engine/sampling.h"
#include "common/kv/geometry.h"
#include "common/kv/kv_stream.h"
#include "common/rpc/guard.h"
#include "common/rpc/status.h"
#include "common/util/clock.h"
#include "common/util/guard.h"
#include "common/util/status.h"
#include "services/common/serving.h"

namespace tandem::prefill {

namespace {

// How often the shipper looks at its jobs: transfers in flight are polled every
// kTransferPoll; cancellation and deadlines of prompts still computing are checked every
// kComputePoll.
constexpr absl::Duration kTransferPoll = absl::Microseconds(500);
constexpr absl::Duration kComputePoll = absl::Milliseconds(5);

util::Instant CallDeadline(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  return deadline > std::chrono::system_clock::now() + std::chrono::hours(24 * 365)
             ? util::Instant::Never()
             : util::FromWallDeadline(absl::FromChrono(deadline));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PrefillService>> PrefillService::Create(
    std::string model_name, tandem::v1::KvGeometry geometry, engine::ForwardPass* forward,
    const model::Tokenizer* tokenizer, kv::KvTransport* transport,
    const PrefillServiceOptions& options, rpc::RpcMetrics* metrics,
    serving::PrefillMetrics* serving_metrics, serving::PrefixCacheMetrics* prefix_metrics) {
  if (options.max_queue < 1) return absl::InvalidArgumentError("max_queue must be >= 1");
  if (options.prefix_cache) forward->pool()->EnablePrefixCache();
  // Prompts run the full pool (salt 0, as in tandem-serve); nothing is generated here.
  ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Scheduler> scheduler,
      engine::Scheduler::Create(forward, tokenizer, tokenizer != nullptr ? tokenizer->eos_id() : -1,
                                {.max_running = options.max_running,
                                 .max_step_tokens = options.chunk_tokens,
                                 .prefix_salt = 0,
                                 .cache_generated = false}));
  return std::unique_ptr<PrefillService>(new PrefillService(
      std::move(model_name), std::move(geometry), forward, transport, options, metrics,
      serving_metrics, std::move(scheduler),
      serving::WithPrefixCacheMetrics(nullptr, forward->pool(), prefix_metrics)));
}

PrefillService::PrefillService(std::string model_name, tandem::v1::KvGeometry geometry,
                               engine::ForwardPass* forward, kv::KvTransport* transport,
                               const PrefillServiceOptions& options, rpc::RpcMetrics* metrics,
                               serving::PrefillMetrics* serving_metrics,
                               std::unique_ptr<engine::Scheduler> scheduler,
                               engine::EngineLoop::StepObserver observer)
    : model_name_(std::move(model_name)),
      geometry_(std::move(geometry)),
      forward_(forward),
      transport_(transport),
      options_(options),
      metrics_(metrics),
      serving_metrics_(serving_metrics),
      auth_(options.internal_secret) {
  loop_ = engine::EngineLoop::Start(std::move(scheduler), std::move(observer));
  shipper_ = std::thread([this] { Ship(); });
}

PrefillService::~PrefillService() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  shipper_.join();
}

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext* context,
                                                  const tandem::v1::PrefillRequest* request,
                                                  tandem::v1::PrefillResponse* response) {
  return rpc::GuardedUnary(context, "Prefill", [&] { return Enqueue(context, request, response); });
}

grpc::ServerUnaryReactor* PrefillService::Enqueue(grpc::CallbackServerContext* context,
                                                  const tandem::v1::PrefillRequest* request,
                                                  tandem::v1::PrefillResponse* response) {
  auto* reactor = context->DefaultReactor();
  const util::Instant start = util::Instant::Now();
  auto refuse = [&](const absl::Status& s) {
    const grpc::Status status = rpc::ToGrpcStatus(s);
    metrics_->Record("Prefill", status, util::Since(start));
    reactor->Finish(status);
    return reactor;
  };
  if (absl::Status s = auth_.Check(*context); !s.ok()) return refuse(s);
  const engine::KvBlockPool* pool = forward_->pool();
  absl::StatusOr<engine::SamplingParams> params =
      CheckPrefillRequest(*request, geometry_, forward_->weights().config,
                          pool->config().block_size, transport_->name());
  if (!params.ok()) return refuse(params.status());
  if (context->IsCancelled()) return refuse(absl::CancelledError("the prefill call was cancelled"));
  absl::MutexLock lock(&mu_);
  if (stop_ || static_cast<int>(jobs_.size()) >= options_.max_queue) {
    return refuse(absl::ResourceExhaustedError(
        stop_ ? "the prefill instance is stopping"
              : absl::StrCat("the prefill queue is full (", options_.max_queue, " prompts)")));
  }
  auto job = std::make_unique<Job>();
  job->id = next_job_++;
  job->context = context;
  job->request = request;
  job->response = response;
  job->reactor = reactor;
  job->start = start;
  job->deadline = CallDeadline(*context);
  engine::SequenceRequest sequence{
      .prompt_ids = {request->prompt_token_ids().begin(), request->prompt_token_ids().end()},
      .params = *std::move(params),
      .prefill_only = true};
  // The engine calls back only after Submit returns, and OnOutput waits for mu_: the job is
  // in jobs_ by then.
  absl::StatusOr<engine::SequenceId> id = loop_->Submit(
      std::move(sequence),
      [this, job_id = job->id](const engine::SequenceOutput& out) { OnOutput(job_id, out); });
  if (!id.ok()) return refuse(id.status());
  job->sequence = *id;
  jobs_.emplace(job->id, std::move(job));
  wake_ = true;  // the shipper watches it from now on
  SetQueueDepth();
  return reactor;
}

void PrefillService::SetQueueDepth() {
  serving_metrics_->queue_depth->Set(static_cast<double>(jobs_.size()));
}

void PrefillService::OnOutput(int64_t job_id, const engine::SequenceOutput& out) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second->state != Job::State::kComputing) return;  // given up
  Job* job = it->second.get();
  if (!out.status.ok()) {
    Fail(job, out.status);
    return;
  }
  if (out.finish == engine::FinishReason::kNone) return;  // not the last output
  job->computed = util::Instant::Now();
  tandem::v1::PrefillResponse* response = job->response;
  for (const engine::TokenLogprobs& p : out.prompt_logprobs) {
    serving::LogprobsToProto(p, response->add_prompt_logprobs());
  }
  response->set_request_id(job->request->request_id());
  response->set_prefill_seconds(absl::ToDoubleSeconds(job->computed - job->start));
  serving_metrics_->prompt_tokens->Increment(job->request->prompt_token_ids_size());
  serving_metrics_->compute_seconds->Observe(absl::ToDoubleSeconds(job->computed - job->start));
  if (!out.token.has_value()) {  // scored only (max_tokens 0): no KV goes anywhere
    job->state = Job::State::kDone;
    job->status = absl::OkStatus();
  } else if (out.prompt_kv == nullptr) {
    Fail(job, absl::InternalError("the engine finished a prompt without its KV"));
    return;
  } else {
    response->set_first_token_id(*out.token);
    if (out.logprobs.has_value()) {
      serving::LogprobsToProto(*out.logprobs, response->mutable_first_token_logprobs());
    }
    job->kv = out.prompt_kv;
    job->state = Job::State::kComputed;
  }
  wake_ = true;
}

void PrefillService::Fail(Job* job, absl::Status status) {
  if (job->state == Job::State::kDone) return;
  if (job->state == Job::State::kComputing) loop_->Cancel(job->sequence);
  if (job->state == Job::State::kShipping) serving_metrics_->transfer_failures->Increment();
  job->state = Job::State::kDone;
  job->status = std::move(status);
  wake_ = true;
}

void PrefillService::Ship() {
  while (true) {
    std::vector<std::unique_ptr<Job>> done;
    bool stop;
    {
      absl::MutexLock lock(&mu_);
      bool shipping = false;
      for (const auto& [id, job] : jobs_) shipping |= job->state == Job::State::kShipping;
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || wake_; };
      mu_.AwaitWithTimeout(absl::Condition(&ready), jobs_.empty() ? absl::Milliseconds(100)
                                                    : shipping    ? kTransferPoll
                                                                  : kComputePoll);
      wake_ = false;
      stop = stop_;
      if (stop) {
        for (auto& [id, job] : jobs_) {
          Fail(job.get(), absl::UnavailableError("the prefill instance stopped"));
        }
      }
      ShipOnce(&done);
      SetQueueDepth();
    }
    // Answer outside the lock. A job's transfer is released (its `fill` will not run again)
    // before its blocks are: `kv` goes with the job.
    for (std::unique_ptr<Job>& job : done) {
      if (job->transfer.has_value()) transport_->Release(*job->transfer);
      job->stream.reset();
      job->kv.reset();
      if (job->status.ok() && job->bytes > 0) {
        serving_metrics_->transfer_bytes->Increment(static_cast<double>(job->bytes));
        const absl::Duration transfer = util::Since(job->computed);
        serving_metrics_->transfer_seconds->Observe(absl::ToDoubleSeconds(transfer));
        job->response->set_kv_bytes(static_cast<int64_t>(job->bytes));
        job->response->set_transfer_seconds(absl::ToDoubleSeconds(transfer));
      }
      const grpc::Status status = rpc::ToGrpcStatus(job->status);
      metrics_->Record("Prefill", status, util::Since(job->start));
      job->reactor->Finish(status);
    }
    if (stop) {
      absl::MutexLock lock(&mu_);
      if (jobs_.empty()) return;
    }
  }
}

void PrefillService::ShipOnce(std::vector<std::unique_ptr<Job>>* done) {
  const util::Instant now = util::Instant::Now();
  for (auto& [id, owned] : jobs_) {
    Job* job = owned.get();
    if (job->state != Job::State::kDone) {
      if (job->context->IsCancelled()) {
        Fail(job, absl::CancelledError("the prefill call was cancelled"));
      } else if (now >= job->deadline) {
        Fail(job, absl::DeadlineExceededError(
                      "the prefill call is past its deadline (the reservation's lease)"));
      }
    }
    if (job->state == Job::State::kComputed) {
      const tandem::v1::KvTarget& target = job->request->target();
      const engine::BlockTable& table = job->kv->table();
      absl::StatusOr<kv::KvStream> stream =
          kv::KvStream::Of(job->kv->pool(), table.blocks(), table.state_slot());
      if (!stream.ok()) {
        Fail(job, stream.status());
      } else {
        job->stream.emplace(*std::move(stream));
        job->bytes = job->stream->size();
        const kv::KvStream* source = &*job->stream;
        const int64_t stop_at = options_.stop_after_kv_bytes;
        absl::StatusOr<kv::TransferId> transfer = transport_->PostSend(
            serving::PeerOf(target), target.token(), job->bytes,
            [this, source, stop_at](uint64_t offset, absl::Span<char> out) {
              if (stop_at > 0 && offset >= static_cast<uint64_t>(stop_at) &&
                  !stopped_for_test_.exchange(true)) {
                raise(SIGSTOP);  // a fault test stalls this process mid-transfer
              }
              return source->Read(offset, out);
            });
        if (transfer.ok()) {
          job->transfer = *transfer;
          job->state = Job::State::kShipping;
          job->transfer_deadline = std::min(job->deadline, now + options_.transfer_deadline);
        } else {
          serving_metrics_->transfer_failures->Increment();
          job->state = Job::State::kDone;
          job->status = transfer.status();
        }
      }
    }
    if (job->state == Job::State::kShipping) {
      absl::StatusOr<bool> landed = transport_->Poll(*job->transfer);
      if (!landed.ok()) {
        Fail(job, landed.status());
      } else if (*landed) {
        job->state = Job::State::kDone;
        job->status = absl::OkStatus();
      } else if (util::Instant::Now() >= job->transfer_deadline) {
        Fail(job, absl::DeadlineExceededError(absl::StrCat("the KV transfer over ",
                                                           std::string(transport_->name()),
                                                           " did not finish before its deadline")));
      }
    }
  }
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second->state == Job::State::kDone) {
      done->push_back(std::move(it->second));
      jobs_.erase(it++);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<engine::SamplingParams> CheckPrefillRequest(
    const tandem::v1::PrefillRequest& request, const tandem::v1::KvGeometry& geometry,
    const model::ModelConfig& config, int block_size, std::string_view transport) {
  const int n = request.prompt_token_ids_size();
  if (n < 1) return absl::InvalidArgumentError("prompt_token_ids is empty");
  ASSIGN_OR_RETURN(
      engine::SamplingParams params,
      serving::SamplingFromProto(request.sampling(), static_cast<int>(config.vocab_size)));
  // Scoring alone (max_tokens 0) may fill the whole context.
  if (params.max_tokens == 0 ? n > config.max_position_embeddings
                             : n >= config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", n, " tokens; the context length is ", config.max_position_embeddings));
  }
  for (int32_t id : request.prompt_token_ids()) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " outside the vocabulary"));
    }
  }
  // Scoring only: nothing is sampled and no KV goes anywhere.
  if (params.max_tokens == 0) {
    if (request.has_target()) {
      return absl::InvalidArgumentError(
          "a target is given with max_tokens 0 (scoring only, which sends no KV)");
    }
    return params;
  }
  if (!request.has_target()) return absl::InvalidArgumentError("the request has no target");
  const tandem::v1::KvTarget& target = request.target();
  RETURN_IF_ERROR(kv::CheckCompatible(geometry, target.geometry()));
  const int blocks = (n + block_size - 1) / block_size;
  if (target.num_blocks() != blocks) {
    return absl::InvalidArgumentError(absl::StrCat("the target has room for ", target.num_blocks(),
                                                   " blocks; the prompt needs ", blocks));
  }
  if (target.transport() != transport) {
    return absl::InvalidArgumentError(
        absl::StrCat("the target's transport \"", absl::CEscape(target.transport()),
                     "\" is not ours (\"", std::string(transport), "\")"));
  }
  if (target.token().size() != kv::kTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the target's token has ", target.token().size(),
                                                   " bytes, not ", kv::kTokenBytes));
  }
  if (target.agent().empty() || target.agent().size() > 256 ||
      target.agent_address().size() > (64 << 10)) {
    return absl::InvalidArgumentError("the target's agent is empty or too long");
  }
  return params;
}

grpc::ServerUnaryReactor* PrefillService::GetInfo(grpc::CallbackServerContext* context,
                                                  const tandem::v1::InstanceInfoRequest* request,
                                                  tandem::v1::InstanceInfo* response) {
  return rpc::GuardedUnary(context, "GetInfo", [&] { return Info(context, response); });
}

grpc::ServerUnaryReactor* PrefillService::Info(grpc::CallbackServerContext* context,
                                               tandem::v1::InstanceInfo* response) {
  if (absl::Status s = auth_.Check(*context); !s.ok()) {
    metrics_->Record("GetInfo", rpc::ToGrpcStatus(s), absl::ZeroDuration());
    auto* reactor = context->DefaultReactor();
    reactor->Finish(rpc::ToGrpcStatus(s));
    return reactor;
  }
  response->set_role("prefill");
  response->set_model(model_name_);
  *response->mutable_geometry() = geometry_;
  {
    absl::MutexLock lock(&mu_);
    response->set_queue_depth(static_cast<int>(jobs_.size()));
  }
  response->set_queue_capacity(options_.max_queue);
  response->set_free_kv_blocks(forward_->pool()->num_free());
  response->set_total_kv_blocks(forward_->pool()->num_total());
  metrics_->Record("GetInfo", grpc::Status::OK, absl::ZeroDuration());
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem::prefill
