#include "services/decode/decode_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/queued_writer.h"
#include "common/rpc/status.h"
#include "services/common/serving.h"

namespace tandem::decode {
namespace {

using tandem::v1::GenerateStreamResponse;

}  // namespace

DecodeService::DecodeService(std::string model_name, tandem::v1::KvGeometry geometry,
                             engine::EngineLoop* loop, kv::MemoryDescriptor pool_region,
                             int vocab_size, const DecodeServiceOptions& options,
                             rpc::RpcMetrics* metrics, serving::DecodeMetrics* serving_metrics)
    : model_name_(std::move(model_name)),
      geometry_(std::move(geometry)),
      loop_(loop),
      pool_region_(std::move(pool_region)),
      vocab_size_(vocab_size),
      options_(options),
      metrics_(metrics),
      serving_metrics_(serving_metrics) {}

DecodeService::~DecodeService() {
  absl::MutexLock lock(&mu_);
  for (auto& [handle, r] : reservations_) {
    r.table.ReleaseAll(loop_->pool());
  }
}

grpc::ServerUnaryReactor* DecodeService::Done(grpc::CallbackServerContext* context,
                                              absl::string_view rpc, const absl::Status& status,
                                              absl::Time start) {
  const grpc::Status grpc_status = rpc::ToGrpcStatus(status);
  metrics_->Record(rpc, grpc_status, absl::Now() - start);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc_status);
  return reactor;
}

void DecodeService::Expire() {
  const absl::Time now = absl::Now();
  auto* pool = loop_->pool();
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    if (it->second.expires <= now) {
      it->second.table.ReleaseAll(pool);
      serving_metrics_->leases_expired->Increment();
      reservations_.erase(it++);
    } else {
      ++it;
    }
  }
}

grpc::ServerUnaryReactor* DecodeService::Reserve(grpc::CallbackServerContext* context,
                                                 const tandem::v1::ReserveRequest* request,
                                                 tandem::v1::ReserveResponse* response) {
  const absl::Time start = absl::Now();
  const int max_tokens =
      request->max_tokens() == 0 ? serving::kDefaultMaxTokens : request->max_tokens();
  if (request->prompt_tokens() < 1 || max_tokens < 1 ||
      request->prompt_tokens() + int64_t{max_tokens} > geometry_.max_position_embeddings()) {
    return Done(context, "Reserve",
                absl::InvalidArgumentError(absl::StrCat(
                    "prompt_tokens (", request->prompt_tokens(), ") and max_tokens (", max_tokens,
                    ") must be >= 1 and together within the context length ",
                    geometry_.max_position_embeddings())),
                start);
  }
  auto* pool = loop_->pool();
  engine::BlockTable table;
  absl::MutexLock lock(&mu_);
  Expire();
  absl::Status reserved = table.Reserve(pool, request->prompt_tokens() + max_tokens);
  serving_metrics_->kv_blocks_free->Set(pool->num_free());
  serving_metrics_->kv_blocks_used->Set(pool->num_total() - pool->num_free());
  if (!reserved.ok()) {
    return Done(context, "Reserve",
                absl::ResourceExhaustedError(absl::StrCat(
                    "no room for ", request->prompt_tokens() + max_tokens, " tokens of KV: ",
                    pool->num_free(), " of ", pool->num_total(), " blocks free")),
                start);
  }
  const std::string handle = absl::StrCat(request->request_id(), "#", next_handle_++);
  tandem::v1::KvTarget* target = response->mutable_target();
  serving::DescribeRegion(pool_region_, pool->config(), target);
  *target->mutable_geometry() = geometry_;
  const int prompt_blocks =
      (request->prompt_tokens() + pool->config().block_size - 1) / pool->config().block_size;
  for (int i = 0; i < prompt_blocks; ++i) target->add_block_ids(table.blocks()[i]);
  response->set_handle(handle);
  response->set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
  reservations_[handle] = {std::move(table), request->prompt_tokens(),
                           absl::Now() + options_.lease};
  return Done(context, "Reserve", absl::OkStatus(), start);
}

grpc::ServerWriteReactor<GenerateStreamResponse>* DecodeService::Decode(
    grpc::CallbackServerContext* context, const tandem::v1::DecodeRequest* request) {
  auto fail = [&](const absl::Status& status) {
    const grpc::Status grpc_status = rpc::ToGrpcStatus(status);
    metrics_->Record("Decode", grpc_status, absl::ZeroDuration());
    return rpc::FinishedWriter<GenerateStreamResponse>(grpc_status);
  };
  auto sampling = serving::SamplingFromProto(request->sampling(), vocab_size_);
  if (!sampling.ok()) return fail(sampling.status());
  engine::BlockTable table;
  {
    absl::MutexLock lock(&mu_);
    Expire();
    auto it = reservations_.find(request->handle());
    if (it == reservations_.end()) {
      return fail(absl::NotFoundError(absl::StrCat("reservation \"", request->handle(),
                                                   "\" is unknown, released or past its lease")));
    }
    if (it->second.prompt_tokens != request->prompt_token_ids_size()) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("the reservation is for ", it->second.prompt_tokens,
                       " prompt tokens; the request has ", request->prompt_token_ids_size())));
    }
    table = std::move(it->second.table);
    reservations_.erase(it);
  }
  table.Append(request->prompt_token_ids_size());  // prefill wrote them
  engine::SequenceRequest sequence;
  sequence.prompt_ids.assign(request->prompt_token_ids().begin(),
                             request->prompt_token_ids().end());
  sequence.params = *std::move(sampling);
  // The engine thread feeds the stream; a client that goes away cancels the sequence.
  auto* stream = new rpc::QueuedWriter<GenerateStreamResponse>(metrics_, "Decode");
  std::shared_ptr<rpc::QueuedWriter<GenerateStreamResponse>::Feed> feed = stream->feed();
  GenerateStreamResponse heartbeat;
  heartbeat.set_request_id(request->request_id());
  heartbeat.set_heartbeat(true);
  rpc::QueuedWriter<GenerateStreamResponse>::Feed::StartHeartbeats(
      feed, options_.heartbeat_interval, std::move(heartbeat));
  const int prompt_tokens = request->prompt_token_ids_size();
  auto id = loop_->SubmitPrefilled(
      std::move(sequence), std::move(table), request->first_token_id(),
      [feed, request_id = request->request_id(), prompt_tokens,
       completion = std::make_shared<int>(0)](const engine::SequenceOutput& out) {
        if (!out.status.ok()) {
          feed->End(rpc::ToGrpcStatus(out.status));
          return;
        }
        GenerateStreamResponse response;
        response.set_request_id(request_id);
        if (out.token.has_value()) {
          response.add_token_ids(*out.token);
          ++*completion;
        }
        response.set_text(out.text);
        const bool last = out.finish != engine::FinishReason::kNone;
        if (last) {
          response.set_finish_reason(serving::FinishToProto(out.finish));
          response.mutable_usage()->set_prompt_tokens(prompt_tokens);
          response.mutable_usage()->set_completion_tokens(*completion);
        }
        feed->Push(std::move(response));
        if (last) feed->End(grpc::Status::OK);
      });
  if (!id.ok()) {
    feed->End(rpc::ToGrpcStatus(id.status()));
  } else {
    feed->SetOnCancel([loop = loop_, id = *id] { loop->Cancel(id); });
  }
  return stream;
}

grpc::ServerUnaryReactor* DecodeService::Release(grpc::CallbackServerContext* context,
                                                 const tandem::v1::ReleaseRequest* request,
                                                 tandem::v1::ReleaseResponse* response) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  auto it = reservations_.find(request->handle());
  if (it == reservations_.end()) {
    return Done(context, "Release",
                absl::NotFoundError(absl::StrCat("reservation \"", request->handle(),
                                                 "\" is unknown, released or past its lease")),
                start);
  }
  it->second.table.ReleaseAll(loop_->pool());
  reservations_.erase(it);
  return Done(context, "Release", absl::OkStatus(), start);
}

grpc::ServerUnaryReactor* DecodeService::GetInfo(grpc::CallbackServerContext* context,
                                                 const tandem::v1::InstanceInfoRequest* request,
                                                 tandem::v1::InstanceInfo* response) {
  {
    absl::MutexLock lock(&mu_);
    Expire();
  }
  const engine::EngineLoop::Load load = loop_->load();
  response->set_role("decode");
  response->set_model(model_name_);
  *response->mutable_geometry() = geometry_;
  response->set_running(load.running);
  response->set_queue_depth(load.waiting);
  response->set_free_kv_blocks(loop_->pool()->num_free());
  response->set_total_kv_blocks(load.total_blocks);
  return Done(context, "GetInfo", absl::OkStatus(), absl::Now());
}

}  // namespace tandem::decode
