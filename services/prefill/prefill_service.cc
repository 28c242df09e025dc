#include "services/prefill/prefill_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/engine/sampling.h"
#include "common/kv/block_spans.h"
#include "common/kv/geometry.h"
#include "common/rpc/status.h"
#include "common/util/status.h"
#include "services/common/serving.h"

namespace tandem::prefill {

PrefillService::PrefillService(std::string model_name, tandem::v1::KvGeometry geometry,
                               engine::ForwardPass* forward, kv::KvTransport* transport,
                               kv::MemoryDescriptor pool_region,
                               const PrefillServiceOptions& options, rpc::RpcMetrics* metrics,
                               serving::PrefillMetrics* serving_metrics)
    : model_name_(std::move(model_name)),
      geometry_(std::move(geometry)),
      forward_(forward),
      transport_(transport),
      pool_region_(std::move(pool_region)),
      options_(options),
      metrics_(metrics),
      serving_metrics_(serving_metrics),
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
  auto* reactor = context->DefaultReactor();
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
  queue_.push_back({request, response, reactor, absl::Now()});
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
    const grpc::Status status = rpc::ToGrpcStatus(Run(*job.request, job.response));
    metrics_->Record("Prefill", status, absl::Now() - job.start);
    job.reactor->Finish(status);
    absl::MutexLock lock(&mu_);
    busy_ = false;
    serving_metrics_->queue_depth->Set(static_cast<double>(queue_.size()));
  }
}

absl::Status PrefillService::Run(const tandem::v1::PrefillRequest& request,
                                 tandem::v1::PrefillResponse* response) {
  const model::ModelConfig& c = forward_->weights().config;
  const tandem::v1::KvTarget& target = request.target();
  const int n = request.prompt_token_ids_size();
  if (n < 1) return absl::InvalidArgumentError("prompt_token_ids is empty");
  RETURN_IF_ERROR(kv::CheckCompatible(geometry_, target.geometry()));
  engine::KvBlockPool* pool = forward_->pool();
  const int block_size = pool->config().block_size;
  const int blocks = (n + block_size - 1) / block_size;
  if (target.block_ids_size() != blocks) {
    return absl::InvalidArgumentError(absl::StrCat("the target has ", target.block_ids_size(),
                                                   " blocks; the prompt needs ", blocks));
  }
  if (target.transport() != transport_->name()) {
    return absl::InvalidArgumentError(absl::StrCat("the target's transport \"", target.transport(),
                                                   "\" is not ours (\"",
                                                   std::string(transport_->name()), "\")"));
  }
  ASSIGN_OR_RETURN(engine::SamplingParams params,
                   serving::SamplingFromProto(request.sampling(), static_cast<int>(c.vocab_size)));
  const std::vector<int32_t> ids(request.prompt_token_ids().begin(),
                                 request.prompt_token_ids().end());
  for (int32_t id : ids) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " outside the vocabulary"));
    }
  }

  const absl::Time start = absl::Now();
  engine::BlockTable table;
  RETURN_IF_ERROR(table.Reserve(pool, n));
  std::vector<std::vector<float>> logits;
  absl::Status status;
  for (int begin = 0; begin < n && status.ok(); begin += options_.chunk_tokens) {
    const int len = std::min(options_.chunk_tokens, n - begin);
    engine::StepInput in{absl::MakeConstSpan(ids).subspan(begin, len), begin, &table,
                         begin + len < n ? engine::LogitRows::kNone : engine::LogitRows::kLast};
    status = forward_->Step({&in, 1}, {}, &logits);
  }
  if (!status.ok()) {
    table.ReleaseAll(pool);
    return status;
  }
  engine::Sampler sampler(params);
  response->set_first_token_id(sampler.Sample(logits[0]));
  const absl::Time computed = absl::Now();
  serving_metrics_->prompt_tokens->Increment(n);
  serving_metrics_->compute_seconds->Observe(absl::ToDoubleSeconds(computed - start));

  engine::KvCacheConfig remote = pool->config();
  remote.num_blocks = target.pool_blocks();
  const std::vector<int32_t> dst(target.block_ids().begin(), target.block_ids().end());
  std::vector<int32_t> src(table.blocks().begin(), table.blocks().begin() + blocks);
  absl::StatusOr<std::vector<kv::CopySpan>> spans = kv::KvBlockCopySpans(*pool, src, remote, dst);
  uint64_t bytes = 0;
  if (spans.ok()) {
    for (const kv::CopySpan& s : *spans) bytes += s.length;
    absl::StatusOr<kv::TransferId> id =
        transport_->PostWrite(pool_region_, serving::DescriptorOf(target), *spans);
    status = id.status();
    if (id.ok()) {
      status = kv::WaitForTransfer(*transport_, *id, absl::Now() + options_.transfer_deadline);
      transport_->Release(*id);
    }
  } else {
    status = spans.status();
  }
  table.ReleaseAll(pool);
  if (!status.ok()) {
    serving_metrics_->transfer_failures->Increment();
    return status;
  }
  serving_metrics_->transfer_bytes->Increment(static_cast<double>(bytes));
  serving_metrics_->transfer_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - computed));
  response->set_request_id(request.request_id());
  response->set_kv_bytes(static_cast<int64_t>(bytes));
  response->set_prefill_seconds(absl::ToDoubleSeconds(computed - start));
  response->set_transfer_seconds(absl::ToDoubleSeconds(absl::Now() - computed));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* PrefillService::GetInfo(grpc::CallbackServerContext* context,
                                                  const tandem::v1::InstanceInfoRequest* request,
                                                  tandem::v1::InstanceInfo* response) {
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
