#include "tandem/client.h"

#include "common/util/timer_queue.h"

#include "absl/strings/str_cat.h"
#include "common/rpc/status.h"
#include "common/util/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace tandem::sdk {

void Cancellation::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

bool Cancellation::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void Cancellation::Attach(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  context_ = context;
  if (cancelled_ && context != nullptr) context->TryCancel();
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : channel_(std::move(channel)),
      stub_(tandem::v1::Gateway::NewStub(channel_)),
      options_(options) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        ClientOptions options,
                                                        absl::Duration connect_timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tls_root_certs.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs;
    credentials = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateCustomChannel(target, credentials, args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("cannot connect to the gateway at ", target,
                                               " within ", absl::FormatDuration(connect_timeout)));
  }
  return std::unique_ptr<Client>(new Client(std::move(channel), options));
}

void Client::SetDeadline(grpc::ClientContext* context) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
}

absl::StatusOr<tandem::v1::GenerateResponse> Client::Generate(
    const tandem::v1::GenerateRequest& request, Cancellation* cancel) {
  grpc::ClientContext context;
  SetDeadline(&context);
  if (cancel != nullptr) cancel->Attach(&context);
  tandem::v1::GenerateResponse response;
  grpc::Status status = stub_->Generate(&context, request, &response);
  if (cancel != nullptr) cancel->Attach(nullptr);
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  return response;
}

absl::StatusOr<std::vector<tandem::v1::GenerateResponse>> Client::GenerateChoices(
    const tandem::v1::GenerateRequest& request, int n) {
  constexpr int kMaxChoices = 16;
  if (n < 1 || n > kMaxChoices) {
    return absl::InvalidArgumentError(
        absl::StrCat("n is ", n, "; it must be in [1, ", kMaxChoices, "]"));
  }
  struct Call {
    grpc::ClientContext context;
    tandem::v1::GenerateRequest request;
    tandem::v1::GenerateResponse response;
    grpc::Status status;
  };
  std::vector<Call> calls(n);
  absl::Mutex mu;
  int remaining = n;
  for (int i = 0; i < n; ++i) {
    Call& call = calls[i];
    call.request = request;
    if (request.sampling().has_seed()) {
      call.request.mutable_sampling()->set_seed(request.sampling().seed() + i);
    }
    if (!request.request_id().empty()) absl::StrAppend(call.request.mutable_request_id(), "-", i);
    SetDeadline(&call.context);
    stub_->async()->Generate(&call.context, &call.request, &call.response,
                             [&call, &mu, &remaining](grpc::Status status) {
                               absl::MutexLock lock(&mu);
                               call.status = std::move(status);
                               --remaining;
                             });
  }
  {
    // Every call has a deadline, so every callback comes; should one be late past it, the
    // calls are cancelled, which ends them at once.
    absl::MutexLock lock(&mu);
    const absl::Condition done(
        +[](int* left) { return *left == 0; }, &remaining);
    if (!mu.AwaitWithTimeout(done, options_.timeout + absl::Seconds(5))) {
      for (Call& call : calls) call.context.TryCancel();
      mu.Await(done);
    }
  }
  std::vector<tandem::v1::GenerateResponse> out;
  for (Call& call : calls) {
    if (!call.status.ok()) return rpc::FromGrpcStatus(call.status);
    out.push_back(std::move(call.response));
  }
  return out;
}

absl::Status Client::GenerateStream(
    const tandem::v1::GenerateRequest& request,
    const std::function<void(const tandem::v1::GenerateStreamResponse&)>& on_chunk,
    Cancellation* cancel) {
  grpc::ClientContext context;
  SetDeadline(&context);
  if (cancel != nullptr) cancel->Attach(&context);
  auto reader = stub_->GenerateStream(&context, request);
  // The gateway sends a keep-alive whenever it has had nothing to say for a while; a stream
  // silent for idle_timeout is a dead one.
  struct Watch {
    absl::Mutex mu;
    util::Instant last ABSL_GUARDED_BY(mu) = util::Instant::Now();
    bool idle ABSL_GUARDED_BY(mu) = false;
    bool done ABSL_GUARDED_BY(mu) = false;
  };
  auto watch = std::make_shared<Watch>();
  std::function<void()> check;
  const absl::Duration idle = options_.idle_timeout;
  check = [watch, idle, &context, &check] {
    absl::MutexLock lock(&watch->mu);
    if (watch->done) return;
    if (util::Since(watch->last) > idle) {
      watch->idle = true;
      context.TryCancel();
      return;
    }
    util::TimerQueue::Shared().ScheduleAfter(idle / 4, check);
  };
  if (idle > absl::ZeroDuration()) util::TimerQueue::Shared().ScheduleAfter(idle / 4, check);
  tandem::v1::GenerateStreamResponse chunk;
  while (reader->Read(&chunk)) {
    {
      absl::MutexLock lock(&watch->mu);
      watch->last = util::Instant::Now();
    }
    if (chunk.heartbeat()) continue;
    on_chunk(chunk);
  }
  const grpc::Status status = reader->Finish();
  bool went_idle;
  {
    // From here the watch touches nothing (`context` and `check` go with this frame).
    absl::MutexLock lock(&watch->mu);
    watch->done = true;
    went_idle = watch->idle;
  }
  if (cancel != nullptr) cancel->Attach(nullptr);
  if (went_idle) {
    return absl::UnavailableError(absl::StrCat("the gateway sent nothing for ",
                                               absl::FormatDuration(idle), " (idle_timeout)"));
  }
  return rpc::FromGrpcStatus(status);
}

absl::StatusOr<tandem::v1::TokenizeResponse> Client::Tokenize(
    const tandem::v1::TokenizeRequest& request) {
  grpc::ClientContext context;
  SetDeadline(&context);
  tandem::v1::TokenizeResponse response;
  grpc::Status status = stub_->Tokenize(&context, request, &response);
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  return response;
}

absl::StatusOr<tandem::v1::ListModelsResponse> Client::ListModels() {
  grpc::ClientContext context;
  SetDeadline(&context);
  tandem::v1::ListModelsResponse response;
  grpc::Status status = stub_->ListModels(&context, tandem::v1::ListModelsRequest(), &response);
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  return response;
}

absl::Status Client::Health() {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext context;
  SetDeadline(&context);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError("gateway reports NOT_SERVING");
  }
  return absl::OkStatus();
}

}  // namespace tandem::sdk
