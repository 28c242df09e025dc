#include "services/decode/decode_service.h"

#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/guard.h"
#include "common/rpc/queued_writer.h"
#include "common/rpc/status.h"
#include "common/util/clock.h"
#include "services/common/serving.h"

namespace tandem::decode {
namespace {

using tandem::v1::GenerateStreamResponse;

constexpr int kMaxPromptIds = 1 << 20;

}  // namespace

DecodeService::DecodeService(std::string model_name, tandem::v1::KvGeometry geometry,
                             engine::EngineLoop* loop, kv::KvInbox* inbox,
                             const kv::KvTransport* transport, int vocab_size,
                             const DecodeServiceOptions& options, rpc::RpcMetrics* metrics,
                             serving::DecodeMetrics* serving_metrics)
    : model_name_(std::move(model_name)),
      geometry_(std::move(geometry)),
      loop_(loop),
      inbox_(inbox),
      transport_name_(transport->name()),
      self_(transport->self()),
      vocab_size_(vocab_size),
      options_(options),
      metrics_(metrics),
      serving_metrics_(serving_metrics),
      auth_(options.internal_secret) {}

DecodeService::~DecodeService() {
  timers_.reset();  // no lease expiry runs from here on
  absl::MutexLock lock(&mu_);
  for (auto& [handle, r] : reservations_) Drop(r);
  reservations_.clear();
}

grpc::ServerUnaryReactor* DecodeService::Done(grpc::CallbackServerContext* context,
                                              absl::string_view rpc, const absl::Status& status,
                                              util::Instant start) {
  const grpc::Status grpc_status = rpc::ToGrpcStatus(status);
  metrics_->Record(rpc, grpc_status, util::Since(start));
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc_status);
  return reactor;
}

void DecodeService::Drop(Reservation& r) {
  inbox_->Close(r.token);
  r.table.ReleaseAll(loop_->pool());
}

void DecodeService::BlockGauges() {
  auto* pool = loop_->pool();
  serving_metrics_->kv_blocks_free->Set(pool->num_free());
  serving_metrics_->kv_blocks_used->Set(pool->num_total() - pool->num_free());
}

void DecodeService::Expire(const std::string& handle) {
  {
    absl::MutexLock lock(&mu_);
    auto it = reservations_.find(handle);
    if (it == reservations_.end()) return;  // claimed or released meanwhile
    Drop(it->second);
    reservations_.erase(it);
  }
  serving_metrics_->leases_expired->Increment();
  BlockGauges();
}

grpc::ServerUnaryReactor* DecodeService::Reserve(grpc::CallbackServerContext* context,
                                                 const tandem::v1::ReserveRequest* request,
                                                 tandem::v1::ReserveResponse* response) {
  return rpc::GuardedUnary(context, "Reserve", [&]() -> grpc::ServerUnaryReactor* {
    const util::Instant start = util::Instant::Now();
    if (absl::Status s = auth_.Check(*context); !s.ok()) return Done(context, "Reserve", s, start);
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
    const int block_size = pool->config().block_size;
    const int prompt_blocks = (request->prompt_tokens() + block_size - 1) / block_size;
    engine::BlockTable table;
    if (absl::Status reserved = table.Reserve(pool, request->prompt_tokens() + max_tokens);
        !reserved.ok()) {
      BlockGauges();
      return Done(context, "Reserve",
                  absl::ResourceExhaustedError(absl::StrCat(
                      "no room for ", request->prompt_tokens() + max_tokens, " tokens of KV: ",
                      pool->num_free(), " of ", pool->num_total(), " blocks free")),
                  start);
    }
    absl::StatusOr<std::string> token = inbox_->Open(
        std::vector<int32_t>(table.blocks().begin(), table.blocks().begin() + prompt_blocks),
        table.state_slot());
    if (!token.ok()) {
      table.ReleaseAll(pool);
      return Done(context, "Reserve", token.status(), start);
    }
    const std::string handle = absl::BytesToHexString(kv::RandomToken());
    tandem::v1::KvTarget* target = response->mutable_target();
    target->set_transport(transport_name_);
    target->set_agent(self_.agent);
    target->set_agent_address(self_.address);
    *target->mutable_geometry() = geometry_;
    target->set_token(*token);
    target->set_num_blocks(prompt_blocks);
    response->set_handle(handle);
    response->set_lease_ms(absl::ToInt64Milliseconds(options_.lease));
    {
      absl::MutexLock lock(&mu_);
      Reservation& r = reservations_[handle];
      r.table = std::move(table);
      r.prompt_tokens = request->prompt_tokens();
      r.max_tokens = max_tokens;
      r.token = *std::move(token);
      r.lease_timer = timers_->ScheduleAfter(options_.lease, [this, handle] { Expire(handle); });
    }
    BlockGauges();
    return Done(context, "Reserve", absl::OkStatus(), start);
  });
}

grpc::ServerWriteReactor<GenerateStreamResponse>* DecodeService::Decode(
    grpc::CallbackServerContext* context, const tandem::v1::DecodeRequest* request) {
  return rpc::GuardedStream<GenerateStreamResponse>(
      "Decode", [&]() -> grpc::ServerWriteReactor<GenerateStreamResponse>* {
        auto fail = [&](const absl::Status& status) {
          const grpc::Status grpc_status = rpc::ToGrpcStatus(status);
          metrics_->Record("Decode", grpc_status, absl::ZeroDuration());
          return rpc::FinishedWriter<GenerateStreamResponse>(grpc_status);
        };
        if (absl::Status s = auth_.Check(*context); !s.ok()) return fail(s);
        auto sampling = serving::SamplingFromProto(request->sampling(), vocab_size_);
        if (!sampling.ok()) return fail(sampling.status());
        if (request->first_token_id() < 0 || request->first_token_id() >= vocab_size_) {
          return fail(absl::InvalidArgumentError(absl::StrCat(
              "first_token_id ", request->first_token_id(), " is outside the vocabulary")));
        }
        std::optional<engine::TokenLogprobs> first_logprobs;
        if (sampling->logprobs >= 0) {
          if (!request->has_first_token_logprobs()) {
            return fail(absl::InvalidArgumentError(
                "sampling.logprobs is set but first_token_logprobs is missing"));
          }
          if (absl::Status s =
                  serving::CheckLogprobs(request->first_token_logprobs(), request->first_token_id(),
                                         vocab_size_, sampling->logprobs);
              !s.ok()) {
            return fail(s);
          }
          first_logprobs = serving::LogprobsFromProto(request->first_token_logprobs());
        }
        if (request->prompt_token_ids_size() > kMaxPromptIds) {
          return fail(absl::InvalidArgumentError("too many prompt token ids"));
        }
        for (int32_t id : request->prompt_token_ids()) {
          if (id < 0 || id >= vocab_size_) {
            return fail(absl::InvalidArgumentError(
                absl::StrCat("prompt token id ", id, " is outside the vocabulary")));
          }
        }
        engine::BlockTable table;
        util::TimerQueue::Id timer = 0;
        {
          absl::MutexLock lock(&mu_);
          auto it = reservations_.find(request->handle());
          if (it == reservations_.end()) {
            return fail(
                absl::NotFoundError("the reservation is unknown, released or past its lease"));
          }
          Reservation& r = it->second;
          if (r.prompt_tokens != request->prompt_token_ids_size()) {
            return fail(absl::InvalidArgumentError(absl::StrCat(
                "the reservation is for ", r.prompt_tokens, " prompt tokens; the request has ",
                request->prompt_token_ids_size())));
          }
          if (sampling->max_tokens > r.max_tokens) {
            return fail(absl::InvalidArgumentError(absl::StrCat("max_tokens ", sampling->max_tokens,
                                                                " is more than the ", r.max_tokens,
                                                                " the reservation has room for")));
          }
          if (absl::Status complete = inbox_->CheckComplete(r.token); !complete.ok()) {
            return fail(complete);
          }
          inbox_->Close(r.token);  // complete: it takes no more bytes anyway
          table = std::move(r.table);
          timer = r.lease_timer;
          reservations_.erase(it);
        }
        timers_->Cancel(timer);
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
            std::move(first_logprobs),
            [feed, request_id = request->request_id(), prompt_tokens,
             completion = std::make_shared<int>(0)](const engine::SequenceOutput& out) {
              if (!out.status.ok()) {
                feed->End(rpc::ToGrpcStatus(out.status));
                return;
              }
              GenerateStreamResponse response;
              response.set_request_id(request_id);
              serving::FillChunk(out, prompt_tokens, completion.get(), &response);
              const bool last = out.finish != engine::FinishReason::kNone;
              feed->Push(std::move(response));
              if (last) feed->End(grpc::Status::OK);
            });
        if (!id.ok()) {
          feed->End(rpc::ToGrpcStatus(id.status()));
        } else {
          feed->SetOnCancel([loop = loop_, id = *id] { loop->Cancel(id); });
        }
        return stream;
      });
}

grpc::ServerUnaryReactor* DecodeService::Release(grpc::CallbackServerContext* context,
                                                 const tandem::v1::ReleaseRequest* request,
                                                 tandem::v1::ReleaseResponse* response) {
  return rpc::GuardedUnary(context, "Release", [&]() -> grpc::ServerUnaryReactor* {
    const util::Instant start = util::Instant::Now();
    if (absl::Status s = auth_.Check(*context); !s.ok()) return Done(context, "Release", s, start);
    util::TimerQueue::Id timer = 0;
    {
      absl::MutexLock lock(&mu_);
      auto it = reservations_.find(request->handle());
      if (it == reservations_.end()) {
        return Done(context, "Release",
                    absl::NotFoundError("the reservation is unknown, released or past its lease"),
                    start);
      }
      Drop(it->second);
      timer = it->second.lease_timer;
      reservations_.erase(it);
    }
    timers_->Cancel(timer);
    BlockGauges();
    return Done(context, "Release", absl::OkStatus(), start);
  });
}

grpc::ServerUnaryReactor* DecodeService::GetInfo(grpc::CallbackServerContext* context,
                                                 const tandem::v1::InstanceInfoRequest* request,
                                                 tandem::v1::InstanceInfo* response) {
  return rpc::GuardedUnary(context, "GetInfo", [&]() -> grpc::ServerUnaryReactor* {
    if (absl::Status s = auth_.Check(*context); !s.ok()) {
      return Done(context, "GetInfo", s, util::Instant::Now());
    }
    const engine::EngineLoop::Load load = loop_->load();
    response->set_role("decode");
    response->set_model(model_name_);
    *response->mutable_geometry() = geometry_;
    response->set_running(load.running);
    response->set_queue_depth(load.waiting);
    response->set_free_kv_blocks(loop_->pool()->num_free());
    response->set_total_kv_blocks(load.total_blocks);
    return Done(context, "GetInfo", absl::OkStatus(), util::Instant::Now());
  });
}

}  // namespace tandem::decode
