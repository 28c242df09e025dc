// Hosts as network namespaces: each service runs in a namespace of its own, with one interface
// (veth) plugged into a Linux bridge, so services talk over real interfaces and UCX's TCP
// transport crosses them. This process is a host too (the client), on the bridge's address.
// Faults are network ones, the process staying alive: a host's port on the bridge down (the
// host unreachable), or the route between two hosts black-holed (a partition between them
// alone). Needs root (CAP_NET_ADMIN) and iproute2; Create says why when it cannot.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::testing {

class VirtualNetwork {
 public:
  struct Host {
    std::string name;     // as given to AddHost
    std::string ns;       // its network namespace
    std::string address;  // its IPv4 address on the bridge
    std::string device;   // its interface, inside `ns` ("eth0")
    std::string port;     // the bridge's end of its veth pair, in this namespace
  };

  // A bridge on a /24 of its own (10.243.N.0/24, N from the pid). FAILED_PRECONDITION saying
  // why when this machine does not let us (not root, no iproute2, no bridge or veth support).
  // Namespaces left by an earlier run that died are removed first.
  static absl::StatusOr<std::unique_ptr<VirtualNetwork>> Create();
  // Removes every host's namespace (and with it its veth pair) and the bridge. Processes still
  // inside a namespace keep it alive until they exit: destroy the services first.
  ~VirtualNetwork();
  VirtualNetwork(const VirtualNetwork&) = delete;
  VirtualNetwork& operator=(const VirtualNetwork&) = delete;

  // A new host on the bridge.
  absl::StatusOr<Host> AddHost(const std::string& name);
  // This process's address on the bridge.
  const std::string& client_address() const { return client_address_; }

  // What to put before a service's binary (ServiceSet::Start's launcher) so that it runs in
  // `host`'s namespace with UCX on its interface alone.
  std::vector<std::string> Launcher(const Host& host) const;
  // The flags that make a service listen on `host`'s address: gRPC and HTTP (--host) and, for
  // prefill and decode, the KV transfer (--kv_listen_host).
  static std::vector<std::string> ListenFlags(const Host& host, bool kv);

  // `host`'s port on the bridge down (a pulled cable): nothing reaches it, it reaches nothing,
  // its processes run on. Reconnect: up again.
  absl::Status Disconnect(const Host& host);
  absl::Status Reconnect(const Host& host);
  // Packets between `a` and `b` dropped, both ways (black-hole routes in both namespaces);
  // each still reaches every other host. Heal: the routes removed.
  absl::Status Cut(const Host& a, const Host& b);
  absl::Status Heal(const Host& a, const Host& b);

 private:
  VirtualNetwork() = default;
  // Runs `ip` with `args`; an error carrying its output when it fails.
  absl::Status Ip(const std::string& args) const;

  std::string ip_;      // the ip binary
  std::string tag_;     // from the pid: names of this run's namespaces and links
  std::string subnet_;  // "10.243.N."
  std::string bridge_;
  std::string client_address_;
  std::vector<Host> hosts_;
};

}  // namespace tandem::testing
