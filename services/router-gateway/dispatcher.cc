#include "services/router-gateway/dispatcher.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::gateway {
namespace {

std::unique_ptr<grpc::ClientContext> ContextWithin(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  return context;
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

void DispatchCall::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (on_cancel_) on_cancel_();
}

bool DispatchCall::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void DispatchCall::OnCancel(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  on_cancel_ = std::move(fn);
  if (cancelled_) on_cancel_();
}

void DispatchCall::ClearOnCancel() {
  absl::MutexLock lock(&mu_);
  on_cancel_ = nullptr;
}

std::vector<std::string> ResolveTarget(const std::string& target) {
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos) return {target};
  const std::string host = target.substr(0, colon);
  const std::string port = target.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return {target};
  std::vector<std::string> out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof(text));
      out.push_back(absl::StrCat(text, ":", port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                sizeof(text));
      out.push_back(absl::StrCat("[", text, "]:", port));
    }
  }
  freeaddrinfo(found);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out.empty() ? std::vector<std::string>{target} : out;
}

Dispatcher::Dispatcher(const std::vector<std::string>& prefill_targets,
                       const std::vector<std::string>& decode_targets,
                       const DispatcherOptions& options)
    : options_(options) {
  for (const std::string& target : prefill_targets) {
    for (const std::string& address : ResolveTarget(target)) {
      auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
      prefill_.push_back({address, channel});
      prefill_stubs_.push_back(tandem::v1::Prefill::NewStub(channel));
    }
  }
  for (const std::string& target : decode_targets) {
    for (const std::string& address : ResolveTarget(target)) {
      auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
      decode_.push_back({address, channel});
      decode_stubs_.push_back(tandem::v1::Decode::NewStub(channel));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    prefill_health_.resize(prefill_.size());
    decode_health_.resize(decode_.size());
  }
  health_ = std::thread([this] {
    while (true) {
      CheckHealth();
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.health_interval)) return;
    }
  });
}

Dispatcher::~Dispatcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  health_.join();
}

void Dispatcher::CheckHealth() {
  const absl::Duration deadline = std::min(options_.health_interval, absl::Seconds(2));
  std::vector<Health> prefill(prefill_.size()), decode(decode_.size());
  for (size_t i = 0; i < prefill_.size(); ++i) {
    tandem::v1::InstanceInfo info;
    auto context = ContextWithin(deadline);
    prefill[i].healthy = prefill_stubs_[i]->GetInfo(context.get(), {}, &info).ok();
    prefill[i].queue_depth = info.queue_depth();
  }
  for (size_t i = 0; i < decode_.size(); ++i) {
    tandem::v1::InstanceInfo info;
    auto context = ContextWithin(deadline);
    decode[i].healthy = decode_stubs_[i]->GetInfo(context.get(), {}, &info).ok();
    decode[i].free_kv_blocks = info.free_kv_blocks();
    decode[i].running = info.running();
  }
  absl::MutexLock lock(&mu_);
  prefill_health_ = std::move(prefill);
  decode_health_ = std::move(decode);
}

std::vector<size_t> Dispatcher::DecodeOrder() {
  std::vector<size_t> order(decode_.size());
  const uint64_t rotate = next_decode_++;
  for (size_t i = 0; i < order.size(); ++i) order[i] = (rotate + i) % order.size();
  absl::MutexLock lock(&mu_);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Health& x = decode_health_[a];
    const Health& y = decode_health_[b];
    if (x.healthy != y.healthy) return x.healthy;
    if (x.free_kv_blocks != y.free_kv_blocks) return x.free_kv_blocks > y.free_kv_blocks;
    return x.running < y.running;
  });
  return order;
}

std::vector<size_t> Dispatcher::PrefillOrder() {
  std::vector<size_t> order(prefill_.size());
  const uint64_t rotate = next_prefill_++;
  for (size_t i = 0; i < order.size(); ++i) order[i] = (rotate + i) % order.size();
  absl::MutexLock lock(&mu_);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Health& x = prefill_health_[a];
    const Health& y = prefill_health_[b];
    if (x.healthy != y.healthy) return x.healthy;
    return x.queue_depth < y.queue_depth;
  });
  return order;
}

absl::Status Dispatcher::Run(
    const std::string& request_id, const std::vector<int32_t>& prompt,
    const tandem::v1::SamplingParams& sampling, int max_tokens, DispatchCall* call,
    const std::function<void(const tandem::v1::GenerateStreamResponse&)>& on_chunk) {
  if (prefill_.empty() || decode_.empty()) {
    return absl::UnavailableError(
        "this gateway has no prefill or no decode instances (--prefill, --decode)");
  }
  // 1. Reserve KV blocks on a decode instance.
  std::vector<std::string> failures;
  bool all_full = true;  // every decode instance answered that it has no room
  tandem::v1::ReserveResponse reserved;
  size_t d = decode_.size();
  for (size_t k : DecodeOrder()) {
    if (d != decode_.size()) break;
    tandem::v1::ReserveRequest reserve;
    reserve.set_request_id(request_id);
    reserve.set_prompt_tokens(static_cast<int>(prompt.size()));
    reserve.set_max_tokens(max_tokens);
    auto context = ContextWithin(options_.reserve_deadline);
    const grpc::Status s = decode_stubs_[k]->Reserve(context.get(), reserve, &reserved);
    if (s.ok()) {
      d = k;
    } else if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      return FromGrpc(s);
    } else {
      all_full = all_full && s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      failures.push_back(absl::StrCat("decode ", decode_[k].address, ": ", s.error_message()));
    }
  }
  if (d == decode_.size()) {
    // All full is overload (retry later); anything else means no instance can serve now.
    const std::string why =
        absl::StrCat("no decode instance could take the request: ", absl::StrJoin(failures, "; "));
    return all_full ? absl::ResourceExhaustedError(why) : absl::UnavailableError(why);
  }
  auto release = [&] {
    tandem::v1::ReleaseRequest r;
    r.set_handle(reserved.handle());
    tandem::v1::ReleaseResponse ignored;
    auto context = ContextWithin(options_.reserve_deadline);
    (void)decode_stubs_[d]->Release(context.get(), r, &ignored);
  };

  // 2. Prefill, writing the KV into the reservation; another instance if one fails.
  tandem::v1::PrefillRequest prefill;
  prefill.set_request_id(request_id);
  prefill.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
  *prefill.mutable_sampling() = sampling;
  prefill.mutable_sampling()->set_max_tokens(max_tokens);
  *prefill.mutable_target() = reserved.target();
  tandem::v1::PrefillResponse prefilled;
  bool done = false;
  bool all_queues_full = true;
  for (size_t k : PrefillOrder()) {
    if (done) break;
    if (call->cancelled()) {
      release();
      return absl::CancelledError("the client went away");
    }
    auto context = ContextWithin(options_.prefill_deadline);
    call->OnCancel([c = context.get()] { c->TryCancel(); });
    const grpc::Status s = prefill_stubs_[k]->Prefill(context.get(), prefill, &prefilled);
    call->ClearOnCancel();
    if (s.ok()) {
      done = true;
    } else if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      release();
      return FromGrpc(s);
    } else {
      all_queues_full = all_queues_full && s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      failures.push_back(absl::StrCat("prefill ", prefill_[k].address, ": ", s.error_message()));
    }
  }
  if (!done) {
    release();
    const std::string why =
        absl::StrCat("no prefill instance could run the prompt: ", absl::StrJoin(failures, "; "));
    return all_queues_full ? absl::ResourceExhaustedError(why) : absl::UnavailableError(why);
  }

  // 3. Decode from that KV cache, streaming.
  tandem::v1::DecodeRequest decode;
  decode.set_request_id(request_id);
  decode.set_handle(reserved.handle());
  decode.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
  decode.set_first_token_id(prefilled.first_token_id());
  *decode.mutable_sampling() = sampling;
  decode.mutable_sampling()->set_max_tokens(max_tokens);
  auto context = ContextWithin(options_.decode_deadline);
  call->OnCancel([c = context.get()] { c->TryCancel(); });
  auto reader = decode_stubs_[d]->Decode(context.get(), decode);
  tandem::v1::GenerateStreamResponse chunk;
  while (reader->Read(&chunk)) on_chunk(chunk);
  const grpc::Status s = reader->Finish();
  call->ClearOnCancel();
  if (!s.ok()) {
    if (call->cancelled()) return absl::CancelledError("the client went away");
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("decode ", decode_[d].address, ": ", s.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace tandem::gateway
