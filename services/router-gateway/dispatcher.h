// Runs generations across the cluster: reserve KV blocks on a decode instance, prefill on a
// prefill instance that writes the prompt's KV into them, then stream the decode. Every step
// is an asynchronous gRPC call (the callback API): a generation holds no thread while it
// waits, so concurrent streams cost memory, not threads.
//
// Choosing instances: a health thread asks every instance at once for its load (GetInfo) every
// health_interval, each answer due within that interval (at most 2 s); decode instances are tried
// most free KV blocks first (then fewest running sequences), prefill instances with room in their
// queue by the cost prefix_routing.h states (the prompt tokens an instance would compute, given the
// blocks of it the gateway has sent there before, plus the prompt tokens in flight there), or with
// prefill_routing kLoad least loaded first; instances that failed their last check go last. The
// gateway counts the prompts it has sent each prefill instance and sends none past the queue that
// instance advertises, so when every queue is full a generation ends at once with
// RESOURCE_EXHAUSTED (the gateway then queues it) instead of holding a reservation. A decode
// instance without room or unreachable is skipped. A failed prefill or KV transfer is retried on
// the next prefill instance, with a fresh reservation (the late writes of a failed attempt can
// never land in the new one; the pruned decoder never recomputes a prompt).
//
// Deadlines: each reservation has a lease (the decode instance says how long); prefill must
// finish within it, less a margin, or the attempt is abandoned and its reservation released.
// The decode stream must show life (tokens, or the decode instance's keep-alives) at least
// every stream_idle_timeout, or it ends with UNAVAILABLE; and it ends within decode_deadline.
// A cancelled generation cancels its downstream call, and a reservation it no longer needs is
// released at once.
//
// Instances behind a DNS name (a Kubernetes headless Service) are resolved again every
// resolve_interval; calls in flight keep their instance.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/router-gateway/backend.h"
#include "services/router-gateway/prefix_routing.h"
#include "tandem/v1/decode.grpc.pb.h"
#include "tandem/v1/prefill.grpc.pb.h"

namespace tandem::gateway {

// What a target name resolves to: "address:port" per address, or an error when it does not
// resolve now.
using Resolver = std::function<absl::StatusOr<std::vector<std::string>>(const std::string&)>;

struct DispatcherOptions {
  absl::Duration health_interval = absl::Milliseconds(500);
  absl::Duration reserve_deadline = absl::Seconds(10);
  // A prefill attempt's own bound; the reservation's lease (less lease_margin) bounds it too.
  absl::Duration prefill_deadline = absl::Seconds(120);
  absl::Duration decode_deadline = absl::Seconds(600);
  // A decode stream silent for this long (no token, no keep-alive) ends with UNAVAILABLE.
  absl::Duration stream_idle_timeout = absl::Seconds(10);
  // How much before its lease ends a prefill attempt is given up: at least this, and at least
  // 5% of the lease.
  absl::Duration lease_margin = absl::Milliseconds(50);
  // How often target names are resolved again; zero: only at start-up.
  absl::Duration resolve_interval = absl::Seconds(10);
  // Resolves target names; LookupTarget (the system resolver) when unset.
  Resolver resolve = nullptr;
  // Called with the numbers of prefill and decode instances after each change (and at
  // start-up), e.g. for a gauge.
  std::function<void(size_t prefill, size_t decode)> on_instances = nullptr;
  // Called after each round of health checks with the numbers of prefill and decode instances
  // that answered theirs (on the health thread).
  std::function<void(size_t prefill, size_t decode)> on_health = nullptr;
  // Called each time a failed prefill or KV transfer is tried again on another instance.
  std::function<void()> on_retry = nullptr;
  // How the gateway reaches prefill and decode: TLS (and a client certificate) when set,
  // plaintext otherwise.
  std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr;
  // With TLS: the name the instances' certificates carry, when it is not the dialled address
  // (instances are dialled by IP address).
  std::string tls_server_name;
  // Sent with every call to prefill and decode (the internal APIs' shared secret).
  std::vector<std::pair<std::string, std::string>> call_metadata;
  // How a prompt's prefill instance is chosen (prefix_routing.h), and the cost's weight of
  // tokens in flight against tokens to compute.
  PrefillRouting prefill_routing = PrefillRouting::kKvAware;
  double routing_load_weight = 1.0;
  // Called with each prompt's routing decision (for a counter), on the generation's thread.
  std::function<void(RoutingReason)> on_routing = nullptr;
};

class Dispatcher : public GenerationBackend {
 public:
  Dispatcher(const std::vector<std::string>& prefill_targets,
             const std::vector<std::string>& decode_targets, const DispatcherOptions& options);
  // Stops the health thread, cancels the generations still running and waits (up to 10 s)
  // for them to end; their sinks get OnDone.
  ~Dispatcher() override;

  void Start(GenerationRequest request, std::shared_ptr<DispatchCall> call,
             std::shared_ptr<GenerationSink> sink) override;

  // The instances' addresses now, sorted.
  std::vector<std::string> prefill_addresses() const;
  std::vector<std::string> decode_addresses() const;
  // Generations running now.
  int running() const;

  // The state generations share (instances, their health, the live generations); it
  // outlives the Dispatcher while a generation still holds it.
  class Core;

 private:
  std::shared_ptr<Core> core_;
  std::thread health_;
};

// "host:port" -> one "address:port" per address the host resolves to (IPv4 and IPv6),
// sorted; NOT_FOUND when it does not resolve, INVALID_ARGUMENT without a port.
absl::StatusOr<std::vector<std::string>> LookupTarget(const std::string& target);

// LookupTarget, or the target itself when it does not resolve (the channel reports that).
std::vector<std::string> ResolveTarget(const std::string& target);

}  // namespace tandem::gateway
