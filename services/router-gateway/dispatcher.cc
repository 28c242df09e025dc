#include "services/router-gateway/dispatcher.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/clock.h"
#include "common/util/guard.h"
#include "common/util/logging.h"
#include "common/util/timer_queue.h"

namespace tandem::gateway {

// DispatchCall

void DispatchCall::Cancel() {
  std::map<uint64_t, std::function<void()>> hooks;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    hooks.swap(hooks_);
  }
  for (auto& [id, fn] : hooks) util::Guarded("cancel hook", fn);
}

bool DispatchCall::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

uint64_t DispatchCall::OnCancel(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_) {
      const uint64_t id = next_id_++;
      hooks_[id] = std::move(fn);
      return id;
    }
  }
  util::Guarded("cancel hook", fn);
  return 0;
}

void DispatchCall::RemoveOnCancel(uint64_t id) {
  absl::MutexLock lock(&mu_);
  hooks_.erase(id);
}

// Name resolution

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

namespace {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view prefix = "") {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(prefix, s.error_message()));
}

// Health checks failed in a row after which a prefill instance's attempts in flight are
// abandoned and tried elsewhere: one miss may be a busy moment, two are a host gone.
constexpr int kAbandonAfterFailedChecks = 2;

// Codes after which the same request may be tried on another prefill instance.
bool Retriable(grpc::StatusCode code) {
  return code != grpc::StatusCode::INVALID_ARGUMENT && code != grpc::StatusCode::NOT_FOUND &&
         code != grpc::StatusCode::UNIMPLEMENTED && code != grpc::StatusCode::UNAUTHENTICATED &&
         code != grpc::StatusCode::PERMISSION_DENIED;
}

}  // namespace

// Core

class Dispatcher::Core : public std::enable_shared_from_this<Dispatcher::Core> {
 public:
  // The last health check of one instance.
  struct Health {
    bool healthy = true;  // optimistic until the first check
    int failures = 0;     // checks failed in a row
    int free_kv_blocks = 0;
    int running = 0;
    int queue_depth = 0;
    int queue_capacity = 0;  // prompts the instance takes at once; 0: it did not say
    int block_size = 0;      // of its KV cache; 0: it did not say
    int total_kv_blocks = 0;
  };
  // One address of a target; shared with the calls using it, so a refresh that drops it does
  // not pull it from under them.
  struct Instance {
    std::string target;  // the --prefill / --decode entry it came from
    std::string address;
    std::unique_ptr<tandem::v1::Prefill::Stub> prefill;  // set in prefill instances
    std::unique_ptr<tandem::v1::Decode::Stub> decode;    // set in decode instances
    std::atomic<int> outstanding{0};             // prefill calls this gateway has in flight to it
    std::atomic<int64_t> outstanding_tokens{0};  // and their prompt tokens
    // The prefill attempts in flight on it, each with what abandons it (cancels its call, so
    // that the generation tries another instance).
    absl::Mutex attempts_mu;
    std::map<uint64_t, std::function<void()>> attempts ABSL_GUARDED_BY(attempts_mu);
    uint64_t AddAttempt(std::function<void()> abandon) {
      absl::MutexLock lock(&attempts_mu);
      const uint64_t id = next_attempt++;
      attempts[id] = std::move(abandon);
      return id;
    }
    void RemoveAttempt(uint64_t id) {
      absl::MutexLock lock(&attempts_mu);
      attempts.erase(id);
    }
    uint64_t next_attempt ABSL_GUARDED_BY(attempts_mu) = 0;
  };
  using Pool = std::vector<std::shared_ptr<Instance>>;

  Core(const std::vector<std::string>& prefill_targets,
       const std::vector<std::string>& decode_targets, const DispatcherOptions& options)
      : options(options), prefill_targets_(prefill_targets), decode_targets_(decode_targets) {}

  const DispatcherOptions options;
  util::TimerQueue timers;

  // A client context for a downstream call: deadline and the internal API's metadata.
  std::shared_ptr<grpc::ClientContext> NewContext(util::Instant deadline) const {
    auto context = std::make_shared<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(util::ToWallDeadline(deadline)));
    for (const auto& [key, value] : options.call_metadata) context->AddMetadata(key, value);
    return context;
  }

  void Refresh(bool first);
  void CheckHealth();
  Pool DecodeOrder();
  // A prompt's block keys (PrefixBlockKeys) by block size, each computed once per generation.
  using PromptKeys = std::map<int, std::vector<uint64_t>>;
  // Healthy instances with room in their queue first, then as prefix_routing.h ranks them for
  // `prompt` (whose keys it adds to `keys`); `any_room` is false when every healthy instance is
  // at its capacity.
  Pool PrefillOrder(absl::Span<const int32_t> prompt, PromptKeys* keys, bool* any_room);
  // `prompt` is on its way to `instance`: its blocks join the instance's prefix model.
  void NotePrefill(const Instance* instance, absl::Span<const int32_t> prompt, PromptKeys* keys);
  std::vector<std::string> Addresses(bool prefill) const;

  bool stopping() const {
    absl::MutexLock lock(&mu_);
    return stop_;
  }
  // Registers a live generation; false once stopping.
  bool Enter(uint64_t* id, std::function<void()> cancel);
  void Leave(uint64_t id);
  int running() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(live_.size());
  }
  // Stops and cancels the live generations; waits up to `deadline` for them to end.
  void Stop(absl::Duration deadline);
  bool WaitStop(absl::Duration interval) {
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    return mu_.AwaitWithTimeout(absl::Condition(&stopping), interval);
  }

 private:
  const std::vector<std::string> prefill_targets_, decode_targets_;
  std::atomic<uint64_t> next_prefill_{0}, next_decode_{0};
  mutable absl::Mutex mu_;
  Pool prefill_ ABSL_GUARDED_BY(mu_), decode_ ABSL_GUARDED_BY(mu_);
  std::map<const Instance*, Health> health_of_ ABSL_GUARDED_BY(mu_);
  // What each prefill instance holds of the prompts sent to it (kKvAware only).
  std::map<const Instance*, PrefixModel> prefix_of_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_live_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::function<void()>> live_ ABSL_GUARDED_BY(mu_);  // id -> its cancel
};

void Dispatcher::Core::Refresh(bool first) {
  const Resolver resolve = options.resolve ? options.resolve : Resolver(LookupTarget);
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
        grpc::ChannelArguments args;
        // A long prompt's log-probabilities (prefill's answer) outgrow gRPC's 4 MiB default;
        // the services send up to 64 MiB.
        args.SetMaxReceiveMessageSize(64 << 20);
        if (!options.tls_server_name.empty()) {
          args.SetSslTargetNameOverride(options.tls_server_name);
        }
        auto channel = grpc::CreateCustomChannel(address,
                                                 options.credentials != nullptr
                                                     ? options.credentials
                                                     : grpc::InsecureChannelCredentials(),
                                                 args);
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
    std::map<const Instance*, PrefixModel> prefix;
    for (const auto& instance : prefill_) {
      auto it = prefix_of_.find(instance.get());
      if (it == prefix_of_.end()) {
        prefix.emplace(instance.get(), PrefixModel(0));  // sized by its first health check
      } else {
        prefix.emplace(instance.get(), std::move(it->second));
      }
    }
    prefix_of_ = std::move(prefix);
  }
  if (!first && added.empty() && removed.empty()) return;
  if (!first) {
    TANDEM_LOG(INFO) << "gateway: instances changed: added [" << absl::StrJoin(added, ", ")
                     << "], removed [" << absl::StrJoin(removed, ", ") << "]";
  }
  if (options.on_instances) options.on_instances(num_prefill, num_decode);
}

std::vector<std::string> Dispatcher::Core::Addresses(bool prefill) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& instance : prefill ? prefill_ : decode_) out.push_back(instance->address);
  return out;
}

void Dispatcher::Core::CheckHealth() {
  // Every instance is asked at once, each under the same deadline: an unreachable instance
  // costs the round one deadline, not every instance checked after it.
  const util::Instant deadline =
      util::Instant::Now() + std::min(options.health_interval, absl::Seconds(2));
  Pool prefill, decode;
  {
    absl::MutexLock lock(&mu_);
    prefill = prefill_;
    decode = decode_;
  }
  struct Check {
    std::shared_ptr<Instance> instance;
    std::shared_ptr<grpc::ClientContext> context;
    tandem::v1::InstanceInfo info;
    bool done = false;
    bool ok = false;
  };
  std::vector<Check> checks(prefill.size() + decode.size());
  const tandem::v1::InstanceInfoRequest request;
  absl::Mutex done_mu;
  for (size_t i = 0; i < checks.size(); ++i) {
    Check& c = checks[i];
    c.instance = i < prefill.size() ? prefill[i] : decode[i - prefill.size()];
    c.context = NewContext(deadline);
    auto on_done = [&c, &done_mu](grpc::Status s) {
      absl::MutexLock lock(&done_mu);
      c.ok = s.ok();
      c.done = true;
    };
    if (c.instance->prefill != nullptr) {
      c.instance->prefill->async()->GetInfo(c.context.get(), &request, &c.info, on_done);
    } else {
      c.instance->decode->async()->GetInfo(c.context.get(), &request, &c.info, on_done);
    }
  }
  {
    // gRPC ends each call by its deadline; the margin only guards against a callback that
    // never comes, and then the calls are cancelled and waited for (they touch `checks`).
    auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu) {
      return std::all_of(checks.begin(), checks.end(), [](const Check& c) { return c.done; });
    };
    absl::MutexLock lock(&done_mu);
    if (!done_mu.AwaitWithTimeout(absl::Condition(&all_done),
                                  util::Until(deadline + absl::Seconds(1)))) {
      for (Check& c : checks) c.context->TryCancel();
      done_mu.Await(absl::Condition(&all_done));
    }
  }
  std::map<Instance*, Health> checked;
  for (const Check& c : checks) {
    Health& h = checked[c.instance.get()];
    h.healthy = c.ok;
    h.queue_depth = c.info.queue_depth();
    h.queue_capacity = c.info.queue_capacity();
    h.block_size = c.info.geometry().block_size();
    h.total_kv_blocks = c.info.total_kv_blocks();
    h.free_kv_blocks = c.info.free_kv_blocks();
    h.running = c.info.running();
  }
  size_t healthy_prefill = 0, healthy_decode = 0;
  std::vector<Instance*> unreachable;  // prefill instances whose attempts are abandoned
  {
    absl::MutexLock lock(&mu_);
    for (auto& [instance, h] : checked) {
      auto it = health_of_.find(instance);
      if (it == health_of_.end()) continue;  // a refresh dropped it meanwhile
      h.failures = h.healthy ? 0 : it->second.failures + 1;
      if (instance->prefill != nullptr && h.failures >= kAbandonAfterFailedChecks) {
        unreachable.push_back(instance);
      }
      if (it->second.healthy != h.healthy) {
        TANDEM_LOG(WARNING) << "gateway: " << (instance->prefill != nullptr ? "prefill" : "decode")
                            << " " << instance->address
                            << (h.healthy ? " answers its health check again"
                                          : " failed its health check");
      }
      it->second = h;
      auto model = prefix_of_.find(instance);
      if (model != prefix_of_.end() && h.healthy) model->second.SetCapacity(h.total_kv_blocks);
    }
    for (const auto& instance : prefill_) healthy_prefill += health_of_[instance.get()].healthy;
    for (const auto& instance : decode_) healthy_decode += health_of_[instance.get()].healthy;
  }
  if (options.on_health) options.on_health(healthy_prefill, healthy_decode);
  // Prompts on an instance that stopped answering would wait for their reservations' leases:
  // they go elsewhere now. (The instances stay alive meanwhile: `checks` holds them.)
  for (Instance* instance : unreachable) {
    std::vector<std::function<void()>> abandons;
    {
      absl::MutexLock lock(&instance->attempts_mu);
      for (const auto& entry : instance->attempts) abandons.push_back(entry.second);
    }
    for (const auto& abandon : abandons) util::Guarded("abandoning a prefill attempt", abandon);
  }
}

Dispatcher::Core::Pool Dispatcher::Core::DecodeOrder() {
  absl::MutexLock lock(&mu_);
  Pool order;
  const uint64_t rotate = next_decode_++;
  for (size_t i = 0; i < decode_.size(); ++i) {
    order.push_back(decode_[(rotate + i) % decode_.size()]);
  }
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    const Health& x = health_of_[a.get()];
    const Health& y = health_of_[b.get()];
    if (x.healthy != y.healthy) return x.healthy;
    if (x.free_kv_blocks != y.free_kv_blocks) return x.free_kv_blocks > y.free_kv_blocks;
    return x.running < y.running;
  });
  return order;
}

namespace {

const std::vector<uint64_t>& KeysFor(absl::Span<const int32_t> prompt, int block_size,
                                     Dispatcher::Core::PromptKeys* keys) {
  auto it = keys->find(block_size);
  if (it == keys->end()) it = keys->emplace(block_size, PrefixBlockKeys(prompt, block_size)).first;
  return it->second;
}

}  // namespace

Dispatcher::Core::Pool Dispatcher::Core::PrefillOrder(absl::Span<const int32_t> prompt,
                                                      PromptKeys* keys, bool* any_room) {
  absl::MutexLock lock(&mu_);
  Pool rotated;
  const uint64_t rotate = next_prefill_++;
  for (size_t i = 0; i < prefill_.size(); ++i) {
    rotated.push_back(prefill_[(rotate + i) % prefill_.size()]);
  }
  // "No room" only when some instance is healthy and every healthy one is at its capacity:
  // without a healthy instance the attempts go on and fail with their reasons.
  bool any_healthy = false, healthy_room = false;
  std::vector<PrefillCandidate> candidates;
  for (const auto& instance : rotated) {
    const Health& h = health_of_[instance.get()];
    PrefillCandidate c;
    c.healthy = h.healthy;
    c.room = h.queue_capacity == 0 || instance->outstanding.load() < h.queue_capacity;
    c.queued_tokens = instance->outstanding_tokens.load();
    c.queue_depth = std::max(h.queue_depth, instance->outstanding.load());
    if (options.prefill_routing == PrefillRouting::kKvAware && h.block_size > 0) {
      auto model = prefix_of_.find(instance.get());
      if (model != prefix_of_.end()) {
        c.cached_tokens = model->second.Overlap(KeysFor(prompt, h.block_size, keys)) * h.block_size;
      }
    }
    any_healthy |= c.healthy;
    healthy_room |= c.healthy && c.room;
    candidates.push_back(c);
  }
  *any_room = !any_healthy || healthy_room;
  const PrefillRanking ranking = RankPrefill(candidates, static_cast<int>(prompt.size()),
                                             options.prefill_routing, options.routing_load_weight);
  Pool order;
  for (size_t i : ranking.order) order.push_back(rotated[i]);
  if (!order.empty() && options.on_routing) {
    util::Guarded("routing observer", [&] { options.on_routing(ranking.reason); });
  }
  return order;
}

void Dispatcher::Core::NotePrefill(const Instance* instance, absl::Span<const int32_t> prompt,
                                   PromptKeys* keys) {
  if (options.prefill_routing != PrefillRouting::kKvAware) return;
  absl::MutexLock lock(&mu_);
  const int block_size = health_of_[instance].block_size;
  auto model = prefix_of_.find(instance);
  if (block_size < 1 || model == prefix_of_.end()) return;
  model->second.Add(KeysFor(prompt, block_size, keys));
}

bool Dispatcher::Core::Enter(uint64_t* id, std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  if (stop_) return false;
  *id = next_live_++;
  live_[*id] = std::move(cancel);
  return true;
}

void Dispatcher::Core::Leave(uint64_t id) {
  absl::MutexLock lock(&mu_);
  live_.erase(id);
}

void Dispatcher::Core::Stop(absl::Duration deadline) {
  std::vector<std::function<void()>> cancels;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& [id, cancel] : live_) cancels.push_back(cancel);
  }
  for (auto& cancel : cancels) util::Guarded("dispatcher stop", cancel);
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&idle), deadline)) {
    TANDEM_LOG(WARNING) << "gateway: " << live_.size()
                        << " generations still running at shutdown; they end on their own";
  }
}

// One generation's way through the cluster.
namespace {

using Core = Dispatcher::Core;
using tandem::v1::GenerateStreamResponse;

class Generation;

// The decode stream's reader (gRPC deletes nothing here: it deletes itself in OnDone).
class DecodeReader : public grpc::ClientReadReactor<GenerateStreamResponse> {
 public:
  explicit DecodeReader(std::shared_ptr<Generation> generation)
      : generation_(std::move(generation)) {}
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;
  GenerateStreamResponse message;

 private:
  std::shared_ptr<Generation> generation_;
};

class Generation : public std::enable_shared_from_this<Generation> {
 public:
  Generation(std::shared_ptr<Core> core, GenerationRequest request,
             std::shared_ptr<DispatchCall> call, std::shared_ptr<GenerationSink> sink)
      : core_(std::move(core)),
        request_(std::move(request)),
        call_(std::move(call)),
        sink_(std::move(sink)) {}

  void Start();
  void OnDecodeMessage(const GenerateStreamResponse& message);
  void OnDecodeDone(const grpc::Status& status);

 private:
  // Tries decode instances from decode_order_[i] on.
  void Reserve(size_t i);
  void OnReserved(size_t i, const grpc::Status& status);
  // Runs the prompt on prefill_order_[next_prefill_], or the next one that has room.
  void Prefill();
  void OnPrefilled(const std::shared_ptr<Core::Instance>& p, const grpc::Status& status);
  // Another prefill instance, with a fresh reservation; or the end.
  void RetryPrefill();
  void StartDecode();
  // Drops the reservation now held, if any (asynchronously; its answer does not matter).
  void ReleaseReservation();
  void CheckIdle();
  void Finish(absl::Status status);
  // max_tokens 0: the prompt is scored by prefill alone.
  bool scoring() const { return request_.max_tokens == 0; }
  // Makes `context` the call that cancelling cancels.
  void Track(std::shared_ptr<grpc::ClientContext> context);
  void Cancel();
  bool cancelled();
  // Cancels the prefill call `context` if it is still the call in flight, marking it abandoned
  // (its instance stopped answering health checks).
  void Abandon(const std::weak_ptr<grpc::ClientContext>& context);

 public:
  // Cancels the call in flight (after an internal error while handling its output).
  void CancelCall() { Cancel(); }

 private:
  const std::shared_ptr<Core> core_;
  const GenerationRequest request_;
  const std::shared_ptr<DispatchCall> call_;
  const std::shared_ptr<GenerationSink> sink_;
  uint64_t live_id_ = 0;
  uint64_t cancel_hook_ = 0;

  Core::Pool decode_order_, prefill_order_;
  Core::PromptKeys prompt_keys_;  // the prompt's block keys, for prefill routing
  size_t next_prefill_ = 0;
  std::vector<std::string> failures_;
  bool all_decode_full_ = true;
  bool all_prefill_full_ = true;

  // The reservation held now.
  std::shared_ptr<Core::Instance> decode_;
  tandem::v1::ReserveRequest reserve_request_;
  tandem::v1::ReserveResponse reserved_;
  util::Instant reserve_sent_;
  bool holding_ = false;
  tandem::v1::PrefillRequest prefill_request_;
  tandem::v1::PrefillResponse prefilled_;
  tandem::v1::DecodeRequest decode_request_;

  absl::Mutex mu_;
  std::shared_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(mu_);  // the call in flight
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;  // the prefill call in flight was abandoned
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  util::Instant last_message_ ABSL_GUARDED_BY(mu_);
  bool idle_expired_ ABSL_GUARDED_BY(mu_) = false;
  util::TimerQueue::Id idle_timer_ ABSL_GUARDED_BY(mu_) = 0;
};

void DecodeReader::OnReadDone(bool ok) {
  if (!ok) return;  // the stream ended: OnDone follows
  if (!util::Guarded("decode stream read", [&] { generation_->OnDecodeMessage(message); })) {
    generation_->CancelCall();  // ends the stream; OnDone reports it
  }
  StartRead(&message);
}

void DecodeReader::OnDone(const grpc::Status& status) {
  util::Guarded("decode stream end", [&] { generation_->OnDecodeDone(status); });
  delete this;
}

void Generation::Start() {
  if (!core_->Enter(&live_id_, [weak = weak_from_this()] {
        if (auto self = weak.lock()) self->Cancel();
      })) {
    sink_->OnDone(absl::UnavailableError("the gateway is stopping"));
    return;
  }
  cancel_hook_ = call_->OnCancel([weak = weak_from_this()] {
    if (auto self = weak.lock()) self->Cancel();
  });
  decode_order_ = core_->DecodeOrder();
  bool any_room = false;
  prefill_order_ = core_->PrefillOrder(request_.prompt, &prompt_keys_, &any_room);
  if (prefill_order_.empty() || decode_order_.empty()) {
    return Finish(absl::UnavailableError(
        "this gateway has no prefill or no decode instances (--prefill, --decode)"));
  }
  if (!any_room) {
    // Every prefill queue this gateway knows of is full: hold no reservation meanwhile.
    return Finish(absl::ResourceExhaustedError("every prefill instance's queue is full"));
  }
  // Scoring a prompt (max_tokens 0) needs the full prefill only: no reservation, no decode.
  if (scoring()) return Prefill();
  Reserve(0);
}

void Generation::Cancel() {
  std::shared_ptr<grpc::ClientContext> context;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    context = context_;
  }
  if (context != nullptr) context->TryCancel();
}

void Generation::Track(std::shared_ptr<grpc::ClientContext> context) {
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    context_ = context;
    cancelled = cancelled_;
  }
  if (cancelled) context->TryCancel();
}

bool Generation::cancelled() {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void Generation::Abandon(const std::weak_ptr<grpc::ClientContext>& context) {
  std::shared_ptr<grpc::ClientContext> call = context.lock();
  {
    absl::MutexLock lock(&mu_);
    if (call == nullptr || call != context_) return;  // that call is over
    abandoned_ = true;
  }
  call->TryCancel();
}

void Generation::Reserve(size_t i) {
  if (i == decode_order_.size()) {
    // All full is overload (retry later); anything else means no instance can serve now.
    const std::string why =
        absl::StrCat("no decode instance could take the request: ", absl::StrJoin(failures_, "; "));
    return Finish(all_decode_full_ ? absl::ResourceExhaustedError(why)
                                   : absl::UnavailableError(why));
  }
  if (cancelled()) return Finish(absl::CancelledError("the client went away"));
  const std::shared_ptr<Core::Instance>& d = decode_order_[i];
  reserve_request_.set_request_id(request_.request_id);
  reserve_request_.set_prompt_tokens(static_cast<int>(request_.prompt.size()));
  reserve_request_.set_max_tokens(request_.max_tokens);
  reserved_.Clear();
  // Measured before the call: the lease starts no earlier at the decode instance.
  reserve_sent_ = util::Instant::Now();
  auto context = core_->NewContext(reserve_sent_ + core_->options.reserve_deadline);
  Track(context);
  d->decode->async()->Reserve(context.get(), &reserve_request_, &reserved_,
                              [self = shared_from_this(), i, context](grpc::Status s) {
                                util::Guarded("reserve done", [&] { self->OnReserved(i, s); });
                              });
}

void Generation::OnReserved(size_t i, const grpc::Status& s) {
  const std::shared_ptr<Core::Instance>& d = decode_order_[i];
  if (s.ok()) {
    decode_ = d;
    holding_ = true;
    return Prefill();
  }
  if (cancelled()) return Finish(absl::CancelledError("the client went away"));
  if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) return Finish(FromGrpc(s));
  all_decode_full_ = all_decode_full_ && s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  failures_.push_back(absl::StrCat("decode ", d->address, ": ", s.error_message()));
  Reserve(i + 1);
}

void Generation::Prefill() {
  if (cancelled()) {
    ReleaseReservation();
    return Finish(absl::CancelledError("the client went away"));
  }
  std::shared_ptr<Core::Instance> p = prefill_order_[next_prefill_];
  // Within the lease, less a margin: the decode instance frees the blocks when it ends.
  util::Instant deadline = util::Instant::Now() + core_->options.prefill_deadline;
  if (!scoring()) {
    const absl::Duration lease = absl::Milliseconds(reserved_.lease_ms());
    const absl::Duration margin = std::max(core_->options.lease_margin, lease / 20);
    deadline = std::min(deadline, reserve_sent_ + lease - margin);
  }
  prefill_request_.set_request_id(request_.request_id);
  prefill_request_.mutable_prompt_token_ids()->Assign(request_.prompt.begin(),
                                                      request_.prompt.end());
  *prefill_request_.mutable_sampling() = request_.sampling;
  prefill_request_.mutable_sampling()->set_max_tokens(request_.max_tokens);
  if (scoring()) {
    prefill_request_.clear_target();
  } else {
    *prefill_request_.mutable_target() = reserved_.target();
  }
  prefilled_.Clear();
  auto context = core_->NewContext(deadline);
  Track(context);
  const int64_t tokens = static_cast<int64_t>(request_.prompt.size());
  p->outstanding.fetch_add(1);
  p->outstanding_tokens.fetch_add(tokens);
  core_->NotePrefill(p.get(), request_.prompt, &prompt_keys_);
  {
    absl::MutexLock lock(&mu_);
    abandoned_ = false;
  }
  const uint64_t attempt = p->AddAttempt(
      [weak = weak_from_this(), weak_context = std::weak_ptr<grpc::ClientContext>(context)] {
        if (auto self = weak.lock()) self->Abandon(weak_context);
      });
  p->prefill->async()->Prefill(
      context.get(), &prefill_request_, &prefilled_,
      [self = shared_from_this(), p, context, tokens, attempt](grpc::Status s) {
        p->RemoveAttempt(attempt);
        p->outstanding.fetch_sub(1);
        p->outstanding_tokens.fetch_sub(tokens);
        util::Guarded("prefill done", [&] { self->OnPrefilled(p, s); });
      });
}

void Generation::OnPrefilled(const std::shared_ptr<Core::Instance>& p, const grpc::Status& s) {
  bool abandoned;
  {
    absl::MutexLock lock(&mu_);
    abandoned = abandoned_ && s.error_code() == grpc::StatusCode::CANCELLED;
    abandoned_ = false;
  }
  if (s.ok()) {
    // The prompt's log-probabilities come from the full prefill, ahead of decode's stream.
    GenerateStreamResponse scored;
    scored.set_request_id(request_.request_id);
    scored.mutable_prompt_logprobs()->Swap(prefilled_.mutable_prompt_logprobs());
    if (scoring()) {
      scored.set_finish_reason(tandem::v1::FINISH_REASON_LENGTH);
      scored.mutable_usage()->set_prompt_tokens(static_cast<int>(request_.prompt.size()));
      sink_->OnChunk(scored);
      return Finish(absl::OkStatus());
    }
    if (scored.prompt_logprobs_size() > 0) sink_->OnChunk(scored);
    return StartDecode();
  }
  if (cancelled()) {
    ReleaseReservation();
    return Finish(absl::CancelledError("the client went away"));
  }
  if (!Retriable(s.error_code())) {
    ReleaseReservation();
    return Finish(FromGrpc(s, absl::StrCat("prefill ", p->address, ": ")));
  }
  all_prefill_full_ = all_prefill_full_ && s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  if (abandoned) {
    failures_.push_back(absl::StrCat("prefill ", p->address, ": abandoned: it failed ",
                                     kAbandonAfterFailedChecks, " health checks in a row"));
  } else if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    failures_.push_back(absl::StrCat("prefill ", p->address,
                                     ": did not finish within the reservation's lease (",
                                     reserved_.lease_ms(), " ms)"));
  } else {
    failures_.push_back(absl::StrCat("prefill ", p->address, ": ", s.error_message()));
  }
  RetryPrefill();
}

void Generation::RetryPrefill() {
  if (core_->options.on_retry) {
    util::Guarded("retry observer", [&] { core_->options.on_retry(); });
  }
  // The failed attempt may still write (a stalled instance that resumes): its reservation
  // goes, and with it everything that attempt could reach.
  ReleaseReservation();
  ++next_prefill_;
  if (next_prefill_ >= prefill_order_.size()) {
    const std::string why =
        absl::StrCat("no prefill instance could run the prompt: ", absl::StrJoin(failures_, "; "));
    return Finish(all_prefill_full_ ? absl::ResourceExhaustedError(why)
                                    : absl::UnavailableError(why));
  }
  if (scoring()) return Prefill();  // nothing was reserved
  // A fresh reservation (OnReserved goes on with prefill_order_[next_prefill_]).
  decode_order_ = core_->DecodeOrder();
  all_decode_full_ = true;
  Reserve(0);
}

void Generation::ReleaseReservation() {
  if (!holding_) return;
  holding_ = false;
  auto release = std::make_shared<tandem::v1::ReleaseRequest>();
  release->set_handle(reserved_.handle());
  auto response = std::make_shared<tandem::v1::ReleaseResponse>();
  auto context = core_->NewContext(util::Instant::Now() + core_->options.reserve_deadline);
  decode_->decode->async()->Release(context.get(), release.get(), response.get(),
                                    [context, release, response](grpc::Status) {});
}

void Generation::StartDecode() {
  if (cancelled()) {
    ReleaseReservation();
    return Finish(absl::CancelledError("the client went away"));
  }
  decode_request_.set_request_id(request_.request_id);
  decode_request_.set_handle(reserved_.handle());
  decode_request_.mutable_prompt_token_ids()->Assign(request_.prompt.begin(),
                                                     request_.prompt.end());
  decode_request_.set_first_token_id(prefilled_.first_token_id());
  if (prefilled_.has_first_token_logprobs()) {
    *decode_request_.mutable_first_token_logprobs() = prefilled_.first_token_logprobs();
  }
  *decode_request_.mutable_sampling() = request_.sampling;
  decode_request_.mutable_sampling()->set_max_tokens(request_.max_tokens);
  auto context = core_->NewContext(util::Instant::Now() + core_->options.decode_deadline);
  // From here the decode instance owns the blocks: it frees them when the stream ends.
  holding_ = false;
  Track(context);
  {
    absl::MutexLock lock(&mu_);
    last_message_ = util::Instant::Now();
  }
  CheckIdle();
  auto* reader = new DecodeReader(shared_from_this());
  decode_->decode->async()->Decode(context.get(), &decode_request_, reader);
  reader->StartRead(&reader->message);
  reader->StartCall();
}

void Generation::CheckIdle() {
  const absl::Duration timeout = core_->options.stream_idle_timeout;
  std::shared_ptr<grpc::ClientContext> expired;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (util::Since(last_message_) > timeout) {
      idle_expired_ = true;
      expired = context_;
    } else {
      idle_timer_ = core_->timers.ScheduleAfter(std::max(timeout / 4, absl::Milliseconds(10)),
                                                [weak = weak_from_this()] {
                                                  if (auto self = weak.lock()) self->CheckIdle();
                                                });
    }
  }
  if (expired != nullptr) expired->TryCancel();
}

void Generation::OnDecodeMessage(const GenerateStreamResponse& message) {
  {
    absl::MutexLock lock(&mu_);
    last_message_ = util::Instant::Now();
  }
  if (message.heartbeat()) {
    sink_->OnKeepAlive();
    return;
  }
  sink_->OnChunk(message);
}

void Generation::OnDecodeDone(const grpc::Status& s) {
  bool cancelled, idle;
  {
    absl::MutexLock lock(&mu_);
    cancelled = cancelled_;
    idle = idle_expired_;
  }
  if (s.ok()) return Finish(absl::OkStatus());
  if (idle) {
    return Finish(absl::UnavailableError(
        absl::StrCat("decode ", decode_->address, " sent nothing for ",
                     absl::FormatDuration(core_->options.stream_idle_timeout))));
  }
  if (cancelled) return Finish(absl::CancelledError("the client went away"));
  Finish(FromGrpc(s, absl::StrCat("decode ", decode_->address, ": ")));
}

void Generation::Finish(absl::Status status) {
  util::TimerQueue::Id timer;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    context_ = nullptr;
    timer = idle_timer_;
  }
  if (timer != 0) core_->timers.Cancel(timer);
  call_->RemoveOnCancel(cancel_hook_);
  util::Guarded("generation sink", [&] { sink_->OnDone(status); });
  core_->Leave(live_id_);
}

}  // namespace

// Dispatcher

Dispatcher::Dispatcher(const std::vector<std::string>& prefill_targets,
                       const std::vector<std::string>& decode_targets,
                       const DispatcherOptions& options)
    : core_(std::make_shared<Core>(prefill_targets, decode_targets, options)) {
  core_->Refresh(/*first=*/true);
  health_ = std::thread([core = core_] {
    util::Instant next_resolve = util::Instant::Now() + core->options.resolve_interval;
    while (true) {
      // A round starts every health_interval, however long the last one waited for answers.
      const util::Instant round = util::Instant::Now();
      util::Guarded("gateway health check", [&] {
        if (core->options.resolve_interval > absl::ZeroDuration() &&
            util::Instant::Now() >= next_resolve) {
          core->Refresh(/*first=*/false);
          next_resolve = util::Instant::Now() + core->options.resolve_interval;
        }
        core->CheckHealth();
      });
      absl::Duration wait =
          std::max(absl::ZeroDuration(), core->options.health_interval - util::Since(round));
      if (core->options.resolve_interval > absl::ZeroDuration()) {
        wait = std::min(wait, util::Until(next_resolve));
      }
      if (core->WaitStop(wait)) return;
    }
  });
}

Dispatcher::~Dispatcher() {
  core_->Stop(absl::Seconds(10));
  health_.join();
}

void Dispatcher::Start(GenerationRequest request, std::shared_ptr<DispatchCall> call,
                       std::shared_ptr<GenerationSink> sink) {
  auto generation =
      std::make_shared<Generation>(core_, std::move(request), std::move(call), std::move(sink));
  generation->Start();
}

std::vector<std::string> Dispatcher::prefill_addresses() const { return core_->Addresses(true); }
std::vector<std::string> Dispatcher::decode_addresses() const { return core_->Addresses(false); }
int Dispatcher::running() const { return core_->running(); }

}  // namespace tandem::gateway
