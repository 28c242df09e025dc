#include "services/router-gateway/dispatcher.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/logging.h"

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

absl::StatusOr<std::vector<std::string>> LookupTarget(const std::string& target) {
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", target, "' is not host:port"));
  }
  const std::string host = target.substr(0, colon);
  const std::string port = target.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::NotFoundError(absl::StrCat(target, ": ", gai_strerror(rc)));
  }
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
  if (out.empty()) return absl::NotFoundError(absl::StrCat(target, ": no addresses"));
  return out;
}

std::vector<std::string> ResolveTarget(const std::string& target) {
  absl::StatusOr<std::vector<std::string>> found = LookupTarget(target);
  return found.ok() ? *std::move(found) : std::vector<std::string>{target};
}

Dispatcher::Dispatcher(const std::vector<std::string>& prefill_targets,
                       const std::vector<std::string>& decode_targets,
                       const DispatcherOptions& options)
    : options_(options), prefill_targets_(prefill_targets), decode_targets_(decode_targets) {
  Refresh(/*first=*/true);
  health_ = std::thread([this] {
    absl::Time next_resolve = absl::Now() + options_.resolve_interval;
    while (true) {
      if (options_.resolve_interval > absl::ZeroDuration() && absl::Now() >= next_resolve) {
        Refresh(/*first=*/false);
        next_resolve = absl::Now() + options_.resolve_interval;
      }
      CheckHealth();
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      absl::Duration wait = options_.health_interval;
      if (options_.resolve_interval > absl::ZeroDuration()) {
        wait = std::max(absl::ZeroDuration(), std::min(wait, next_resolve - absl::Now()));
      }
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), wait)) return;
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

void Dispatcher::Refresh(bool first) {
  const Resolver resolve = options_.resolve ? options_.resolve : Resolver(LookupTarget);
  Pool old_prefill, old_decode;
  {
    absl::MutexLock lock(&mu_);
    old_prefill = prefill_;
    old_decode = decode_;
  }
  std::vector<std::string> added, removed;
  auto update = [&](const std::vector<std::string>& targets, const Pool& old, bool is_decode) {
    Pool pool;
    auto has = [&](const std::string& address) {
      return std::any_of(pool.begin(), pool.end(),
                         [&](const auto& instance) { return instance->address == address; });
    };
    for (const std::string& target : targets) {
      absl::StatusOr<std::vector<std::string>> found = resolve(target);
      if (!found.ok() && !first) {
        // A name that does not resolve now (DNS trouble, no ready pods) keeps its instances;
        // the health checks put any that are gone last.
        TANDEM_LOG(WARNING) << "gateway: " << found.status() << "; keeping its instances";
        for (const auto& instance : old) {
          if (instance->target == target && !has(instance->address)) pool.push_back(instance);
        }
        continue;
      }
      // At start-up an unresolvable target is kept as given: its channel reports why.
      for (const std::string& address : found.ok() ? *found : std::vector<std::string>{target}) {
        if (has(address)) continue;
        auto kept = std::find_if(old.begin(), old.end(), [&](const auto& instance) {
          return instance->address == address;
        });
        if (kept != old.end()) {
          pool.push_back(*kept);
          continue;
        }
        auto instance = std::make_shared<Instance>();
        instance->target = target;
        instance->address = address;
        auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
        if (is_decode) {
          instance->decode = tandem::v1::Decode::NewStub(channel);
        } else {
          instance->prefill = tandem::v1::Prefill::NewStub(channel);
        }
        pool.push_back(std::move(instance));
        added.push_back(address);
      }
    }
    for (const auto& instance : old) {
      if (std::find(pool.begin(), pool.end(), instance) == pool.end()) {
        removed.push_back(instance->address);
      }
    }
    std::sort(pool.begin(), pool.end(),
              [](const auto& a, const auto& b) { return a->address < b->address; });
    return pool;
  };
  Pool prefill = update(prefill_targets_, old_prefill, /*is_decode=*/false);
  Pool decode = update(decode_targets_, old_decode, /*is_decode=*/true);
  const size_t num_prefill = prefill.size(), num_decode = decode.size();
  {
    absl::MutexLock lock(&mu_);
    prefill_ = std::move(prefill);
    decode_ = std::move(decode);
    std::map<const Instance*, Health> health;
    for (const Pool* pool : {&prefill_, &decode_}) {
      for (const auto& instance : *pool) {
        auto it = health_of_.find(instance.get());
        health[instance.get()] = it == health_of_.end() ? Health() : it->second;
      }
    }
    health_of_ = std::move(health);
  }
  if (!first && added.empty() && removed.empty()) return;
  if (!first) {
    TANDEM_LOG(INFO) << "gateway: instances changed: added [" << absl::StrJoin(added, ", ")
                     << "], removed [" << absl::StrJoin(removed, ", ") << "]";
  }
  if (options_.on_instances) options_.on_instances(num_prefill, num_decode);
}

std::vector<std::string> Dispatcher::prefill_addresses() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& instance : prefill_) out.push_back(instance->address);
  return out;
}

std::vector<std::string> Dispatcher::decode_addresses() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& instance : decode_) out.push_back(instance->address);
  return out;
}

void Dispatcher::CheckHealth() {
  const absl::Duration deadline = std::min(options_.health_interval, absl::Seconds(2));
  Pool prefill, decode;
  {
    absl::MutexLock lock(&mu_);
    prefill = prefill_;
    decode = decode_;
  }
  std::map<const Instance*, Health> checked;
  for (const auto& instance : prefill) {
    tandem::v1::InstanceInfo info;
    auto context = ContextWithin(deadline);
    Health& h = checked[instance.get()];
    h.healthy = instance->prefill->GetInfo(context.get(), {}, &info).ok();
    h.queue_depth = info.queue_depth();
  }
  for (const auto& instance : decode) {
    tandem::v1::InstanceInfo info;
    auto context = ContextWithin(deadline);
    Health& h = checked[instance.get()];
    h.healthy = instance->decode->GetInfo(context.get(), {}, &info).ok();
    h.free_kv_blocks = info.free_kv_blocks();
    h.running = info.running();
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [instance, h] : checked) {
    auto it = health_of_.find(instance);
    if (it != health_of_.end()) it->second = h;  // not if a refresh dropped it meanwhile
  }
}

Dispatcher::Pool Dispatcher::DecodeOrder() {
  absl::MutexLock lock(&mu_);
  Pool order;
  const uint64_t rotate = next_decode_++;
  for (size_t i = 0; i < decode_.size(); ++i)
    order.push_back(decode_[(rotate + i) % decode_.size()]);
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    const Health& x = health_of_[a.get()];
    const Health& y = health_of_[b.get()];
    if (x.healthy != y.healthy) return x.healthy;
    if (x.free_kv_blocks != y.free_kv_blocks) return x.free_kv_blocks > y.free_kv_blocks;
    return x.running < y.running;
  });
  return order;
}

Dispatcher::Pool Dispatcher::PrefillOrder() {
  absl::MutexLock lock(&mu_);
  Pool order;
  const uint64_t rotate = next_prefill_++;
  for (size_t i = 0; i < prefill_.size(); ++i) {
    order.push_back(prefill_[(rotate + i) % prefill_.size()]);
  }
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    const Health& x = health_of_[a.get()];
    const Health& y = health_of_[b.get()];
    if (x.healthy != y.healthy) return x.healthy;
    return x.queue_depth < y.queue_depth;
  });
  return order;
}

absl::Status Dispatcher::Run(
    const std::string& request_id, const std::vector<int32_t>& prompt,
    const tandem::v1::SamplingParams& sampling, int max_tokens, DispatchCall* call,
    const std::function<void(const tandem::v1::GenerateStreamResponse&)>& on_chunk) {
  const Pool decode_order = DecodeOrder();
  const Pool prefill_order = PrefillOrder();
  if (prefill_order.empty() || decode_order.empty()) {
    return absl::UnavailableError(
        "this gateway has no prefill or no decode instances (--prefill, --decode)");
  }
  // 1. Reserve KV blocks on a decode instance.
  std::vector<std::string> failures;
  bool all_full = true;  // every decode instance answered that it has no room
  tandem::v1::ReserveResponse reserved;
  std::shared_ptr<Instance> d;
  for (const auto& k : decode_order) {
    if (d != nullptr) break;
    tandem::v1::ReserveRequest reserve;
    reserve.set_request_id(request_id);
    reserve.set_prompt_tokens(static_cast<int>(prompt.size()));
    reserve.set_max_tokens(max_tokens);
    auto context = ContextWithin(options_.reserve_deadline);
    const grpc::Status s = k->decode->Reserve(context.get(), reserve, &reserved);
    if (s.ok()) {
      d = k;
    } else if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      return FromGrpc(s);
    } else {
      all_full = all_full && s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      failures.push_back(absl::StrCat("decode ", k->address, ": ", s.error_message()));
    }
  }
  if (d == nullptr) {
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
    (void)d->decode->Release(context.get(), r, &ignored);
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
  for (const auto& k : prefill_order) {
    if (done) break;
    if (call->cancelled()) {
      release();
      return absl::CancelledError("the client went away");
    }
    auto context = ContextWithin(options_.prefill_deadline);
    call->OnCancel([c = context.get()] { c->TryCancel(); });
    const grpc::Status s = k->prefill->Prefill(context.get(), prefill, &prefilled);
    call->ClearOnCancel();
    if (s.ok()) {
      done = true;
    } else if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      release();
      return FromGrpc(s);
    } else {
      all_queues_full = all_queues_full && s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      failures.push_back(absl::StrCat("prefill ", k->address, ": ", s.error_message()));
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
  auto reader = d->decode->Decode(context.get(), decode);
  tandem::v1::GenerateStreamResponse chunk;
  while (reader->Read(&chunk)) on_chunk(chunk);
  const grpc::Status s = reader->Finish();
  call->ClearOnCancel();
  if (!s.ok()) {
    if (call->cancelled()) return absl::CancelledError("the client went away");
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("decode ", d->address, ": ", s.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace tandem::gateway
