#include "services/router-gateway/dispatcher.h"

#include <grpcpp/grpcpp.h>

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

Dispatcher::Dispatcher(const std::vector<std::string>& prefill_targets,
                       const std::vector<std::string>& decode_targets,
                       const DispatcherOptions& options)
    : options_(options) {
  for (const std::string& address : prefill_targets) {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    prefill_.push_back({address, channel});
    prefill_stubs_.push_back(tandem::v1::Prefill::NewStub(channel));
  }
  for (const std::string& address : decode_targets) {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    decode_.push_back({address, channel});
    decode_stubs_.push_back(tandem::v1::Decode::NewStub(channel));
  }
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
  tandem::v1::ReserveResponse reserved;
  size_t d = decode_.size();
  const uint64_t first_decode = next_decode_++;
  for (size_t i = 0; i < decode_.size() && d == decode_.size(); ++i) {
    const size_t k = (first_decode + i) % decode_.size();
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
      failures.push_back(absl::StrCat("decode ", decode_[k].address, ": ", s.error_message()));
    }
  }
  if (d == decode_.size()) {
    return absl::UnavailableError(
        absl::StrCat("no decode instance could take the request: ", absl::StrJoin(failures, "; ")));
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
  const uint64_t first_prefill = next_prefill_++;
  for (size_t i = 0; i < prefill_.size() && !done; ++i) {
    if (call->cancelled()) {
      release();
      return absl::CancelledError("the client went away");
    }
    const size_t k = (first_prefill + i) % prefill_.size();
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
      failures.push_back(absl::StrCat("prefill ", prefill_[k].address, ": ", s.error_message()));
    }
  }
  if (!done) {
    release();
    return absl::UnavailableError(
        absl::StrCat("no prefill instance could run the prompt: ", absl::StrJoin(failures, "; ")));
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
