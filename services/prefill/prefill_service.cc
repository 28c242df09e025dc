#include "services/prefill/prefill_service.h"

#include <signal.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/engine/sampling.h"
#include "common/kv/geometry.h"
#include "common/kv/kv_stream.h"
#include "common/rpc/guard.h"
#include "common/rpc/status.h"
#include "common/util/guard.h"
#include "common/util/status.h"
#include "services/common/serving.h"

namespace tandem::prefill {

PrefillService::PrefillService(std::string model_name, tandem::v1::KvGeometry geometry,
                               engine::ForwardPass* forward, kv::KvTransport* transport,
                               const PrefillServiceOptions& options, rpc::RpcMetrics* metrics,
                               serving::PrefillMetrics* serving_metrics)
    : model_name_(std::move(model_name)),
      geometry_(std::move(geometry)),
      forward_(forward),
      transport_(transport),
      options_(options),
      metrics_(metrics),
      serving_metrics_(serving_metrics),
      auth_(options.internal_secret),
      worker_([this] { Work(); }) {}

PrefillService::~PrefillService() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  worker_.join();
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
  if (absl::Status s = auth_.Check(*context); !s.ok()) {
    const grpc::Status status = rpc::ToGrpcStatus(s);
    metrics_->Record("Prefill", status, absl::ZeroDuration());
    reactor->Finish(status);
    return reactor;
  }
  absl::MutexLock lock(&mu_);
  if (stop_ || static_cast<int>(queue_.size()) >= options_.max_queue) {
    const grpc::Status status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        stop_ ? "the prefill instance is stopping"
              : absl::StrCat("the prefill queue is full (", options_.max_queue, " prompts)"));
    metrics_->Record("Prefill", status, absl::ZeroDuration());
    reactor->Finish(status);
    return reactor;
  }
  queue_.push_back({context, request, response, reactor, absl::Now()});
  serving_metrics_->queue_depth->Set(static_cast<double>(queue_.size()) + (busy_ ? 1 : 0));
  return reactor;
}

void PrefillService::Work() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](PrefillService* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->stop_ || !s->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping, nothing left
      job = queue_.front();
      queue_.pop_front();
      if (stop_) {
        const grpc::Status status(grpc::StatusCode::UNAVAILABLE, "the prefill instance stopped");
        metrics_->Record("Prefill", status, absl::Now() - job.start);
        job.reactor->Finish(status);
        continue;
      }
      busy_ = true;
    }
    absl::Status result = absl::InternalError("internal error while running the prompt");
    util::Guarded("prefill", [&] { result = Run(job.context, *job.request, job.response); });
    const grpc::Status status = rpc::ToGrpcStatus(result);
    metrics_->Record("Prefill", status, absl::Now() - job.start);
    job.reactor->Finish(status);
    absl::MutexLock lock(&mu_);
    busy_ = false;
    serving_metrics_->queue_depth->Set(static_cast<double>(queue_.size()));
  }
}

absl::StatusOr<engine::SamplingParams> CheckPrefillRequest(
    const tandem::v1::PrefillRequest& request, const tandem::v1::KvGeometry& geometry,
    const model::ModelConfig& config, int block_size, std::string_view transport) {
  const int n = request.prompt_token_ids_size();
  if (n < 1) return absl::InvalidArgumentError("prompt_token_ids is empty");
  if (n >= config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", n, " tokens; the context length is ", config.max_position_embeddings));
  }
  ASSIGN_OR_RETURN(
      engine::SamplingParams params,
      serving::SamplingFromProto(request.sampling(), static_cast<int>(config.vocab_size)));
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

absl::Status PrefillService::Run(grpc::CallbackServerContext* context,
                                 const tandem::v1::PrefillRequest& request,
                                 tandem::v1::PrefillResponse* response) {
  // The call's deadline (the gateway sets it within the reservation's lease) and its
  // cancellation, checked before each piece of work.
  const auto chrono_deadline = context->deadline();
  const absl::Time deadline =
      chrono_deadline > std::chrono::system_clock::now() + std::chrono::hours(24 * 365)
          ? absl::InfiniteFuture()
          : absl::FromChrono(chrono_deadline);
  auto stopped = [&]() -> absl::Status {
    if (context->IsCancelled()) return absl::CancelledError("the prefill call was cancelled");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          "the prefill call is past its deadline (the reservation's lease)");
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(stopped());
  const model::ModelConfig& c = forward_->weights().config;
  const tandem::v1::KvTarget& target = request.target();
  const int n = request.prompt_token_ids_size();
  engine::KvBlockPool* pool = forward_->pool();
  const int blocks = (n + pool->config().block_size - 1) / pool->config().block_size;
  ASSIGN_OR_RETURN(
      engine::SamplingParams params,
      CheckPrefillRequest(request, geometry_, c, pool->config().block_size, transport_->name()));
  const std::vector<int32_t> ids(request.prompt_token_ids().begin(),
                                 request.prompt_token_ids().end());

  const absl::Time start = absl::Now();
  engine::BlockTable table;
  RETURN_IF_ERROR(table.Reserve(pool, n));
  std::vector<std::vector<float>> logits;
  std::vector<engine::TokenLogprobs> prompt_logprobs;
  absl::Status status;
  for (int begin = 0; begin < n && status.ok(); begin += options_.chunk_tokens) {
    status = stopped();
    if (!status.ok()) break;
    const int len = std::min(options_.chunk_tokens, n - begin);
    // Scoring the prompt takes every row; otherwise only the last chunk's last one matters.
    const engine::LogitRows rows = params.prompt_logprobs >= 0 ? engine::LogitRows::kAll
                                   : begin + len < n           ? engine::LogitRows::kNone
                                                               : engine::LogitRows::kLast;
    engine::StepInput in{absl::MakeConstSpan(ids).subspan(begin, len), begin, &table, rows};
    status = forward_->Step({&in, 1}, {}, &logits);
    if (status.ok() && rows == engine::LogitRows::kAll) {
      engine::AppendPromptLogprobs(logits[0], begin, len, ids, params.prompt_logprobs,
                                   &prompt_logprobs);
      // The last row is the next-token distribution, as kLast would have given it.
      const size_t vocab = logits[0].size() / len;
      logits[0].erase(logits[0].begin(), logits[0].end() - vocab);
    }
  }
  if (status.ok()) status = stopped();
  if (!status.ok()) {
    table.ReleaseAll(pool);
    return status;
  }
  for (const engine::TokenLogprobs& p : prompt_logprobs) {
    serving::LogprobsToProto(p, response->add_prompt_logprobs());
  }
  const absl::Time computed = absl::Now();
  serving_metrics_->prompt_tokens->Increment(n);
  serving_metrics_->compute_seconds->Observe(absl::ToDoubleSeconds(computed - start));
  response->set_request_id(request.request_id());
  response->set_prefill_seconds(absl::ToDoubleSeconds(computed - start));
  if (params.max_tokens == 0) {  // scored only
    table.ReleaseAll(pool);
    return absl::OkStatus();
  }
  engine::Sampler sampler(params, ids);
  const int32_t first = sampler.Sample(logits[0]);
  response->set_first_token_id(first);
  if (params.logprobs >= 0) {
    serving::LogprobsToProto(engine::ComputeLogprobs(logits[0], first, params.logprobs),
                             response->mutable_first_token_logprobs());
  }

  // Send the prompt's blocks as the reservation's KV stream. The transport reads them while
  // it sends; once the transfer is released it never does again, and only then are they freed.
  absl::StatusOr<kv::KvStream> stream = kv::KvStream::Of(
      pool, std::vector<int32_t>(table.blocks().begin(), table.blocks().begin() + blocks));
  uint64_t bytes = 0;
  if (stream.ok()) {
    bytes = stream->size();
    const kv::KvStream* source = &*stream;
    const int64_t stop_at = options_.stop_after_kv_bytes;
    absl::StatusOr<kv::TransferId> id =
        transport_->PostSend(serving::PeerOf(target), target.token(), bytes,
                             [this, source, stop_at](uint64_t offset, absl::Span<char> out) {
                               if (stop_at > 0 && offset >= static_cast<uint64_t>(stop_at) &&
                                   !stopped_for_test_.exchange(true)) {
                                 raise(SIGSTOP);  // a fault test stalls this process mid-transfer
                               }
                               return source->Read(offset, out);
                             });
    status = id.status();
    if (id.ok()) {
      status = kv::WaitForTransfer(*transport_, *id,
                                   std::min(deadline, absl::Now() + options_.transfer_deadline),
                                   [context] { return context->IsCancelled(); });
      transport_->Release(*id);
    }
  } else {
    status = stream.status();
  }
  table.ReleaseAll(pool);
  if (!status.ok()) {
    serving_metrics_->transfer_failures->Increment();
    return status;
  }
  serving_metrics_->transfer_bytes->Increment(static_cast<double>(bytes));
  serving_metrics_->transfer_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - computed));
  response->set_kv_bytes(static_cast<int64_t>(bytes));
  response->set_transfer_seconds(absl::ToDoubleSeconds(absl::Now() - computed));
  return absl::OkStatus();
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
    response->set_queue_depth(static_cast<int>(queue_.size()) + (busy_ ? 1 : 0));
  }
  response->set_queue_capacity(options_.max_queue + 1);
  response->set_free_kv_blocks(forward_->pool()->num_free());
  response->set_total_kv_blocks(forward_->pool()->num_total());
  metrics_->Record("GetInfo", grpc::Status::OK, absl::ZeroDuration());
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem::prefill
