#include "tests/testing/netns.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/util/status.h"
#include "tests/testing/subprocess.h"

namespace tandem::testing {
namespace {

constexpr char kNamespacePrefix[] = "tandem-net-";
constexpr char kBridgePrefix[] = "tnb";

// Whether a process with this pid exists.
bool Alive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

// The pid in a name made by this harness ("<prefix><pid>" or "<prefix><pid>-..."), 0 if none.
int PidIn(absl::string_view name, absl::string_view prefix) {
  if (!absl::ConsumePrefix(&name, prefix)) return 0;
  const size_t end = name.find('-');
  int pid = 0;
  return absl::SimpleAtoi(name.substr(0, end), &pid) ? pid : 0;
}

}  // namespace

absl::Status VirtualNetwork::Ip(const std::string& args) const {
  auto [out, status] = RunCommand(absl::StrCat(ip_, " ", args, " 2>&1"));
  if (status == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("'ip ", args, "' failed: ", out));
}

absl::StatusOr<std::unique_ptr<VirtualNetwork>> VirtualNetwork::Create() {
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        "network namespaces need root (CAP_NET_ADMIN); this process is not root");
  }
  std::unique_ptr<VirtualNetwork> net(new VirtualNetwork());
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) {
      net->ip_ = path;
      break;
    }
  }
  if (net->ip_.empty()) return absl::FailedPreconditionError("no ip binary (install iproute2)");
  net->tag_ = absl::StrCat(getpid());

  // One run at a time chooses a subnet and claims it (the lock goes with the descriptor).
  const int lock = open("/run/tandem-netns.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (lock < 0 || flock(lock, LOCK_EX) != 0) {
    if (lock >= 0) close(lock);
    return absl::FailedPreconditionError("cannot lock /run/tandem-netns.lock");
  }
  struct Unlock {
    int fd;
    ~Unlock() { close(fd); }
  } unlock{lock};

  // What runs that died (a crash, a test killed at its timeout) left behind.
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/run/netns", ec)) {
    const std::string name = entry.path().filename().string();
    const int pid = PidIn(name, kNamespacePrefix);
    if (pid != 0 && !Alive(pid)) (void)net->Ip("netns del " + name);
  }
  for (const auto& entry : std::filesystem::directory_iterator("/sys/class/net", ec)) {
    const std::string name = entry.path().filename().string();
    const int pid = PidIn(name, kBridgePrefix);
    if (pid != 0 && !Alive(pid)) (void)net->Ip("link del " + name);
  }

  // A /24 no other interface here has.
  const auto [addresses, status] = RunCommand(net->ip_ + " -o -4 addr show 2>/dev/null");
  if (status != 0) return absl::FailedPreconditionError("'ip addr show' failed");
  for (int i = 0; i < 250 && net->subnet_.empty(); ++i) {
    const std::string subnet = absl::StrCat("10.243.", (getpid() + i) % 250 + 1, ".");
    if (!absl::StrContains(addresses, " " + subnet)) net->subnet_ = subnet;
  }
  if (net->subnet_.empty()) return absl::FailedPreconditionError("no free 10.243.N.0/24");
  net->bridge_ = kBridgePrefix + net->tag_;
  net->client_address_ = net->subnet_ + "1";
  for (const std::string& step : {
           absl::StrCat("link add ", net->bridge_, " type bridge"),
           absl::StrCat("addr add ", net->client_address_, "/24 dev ", net->bridge_),
           absl::StrCat("link set ", net->bridge_, " up"),
       }) {
    if (absl::Status s = net->Ip(step); !s.ok()) {
      (void)net->Ip("link del " + net->bridge_);
      net->bridge_.clear();
      return s;
    }
  }
  return net;
}

VirtualNetwork::~VirtualNetwork() {
  // The veth pairs explicitly: a namespace's own teardown runs later, in the kernel's time,
  // and the next network of this process may want the names at once.
  for (const Host& host : hosts_) (void)Ip("link del " + host.port);
  for (const Host& host : hosts_) (void)Ip("netns del " + host.ns);
  if (!bridge_.empty()) (void)Ip("link del " + bridge_);
}

absl::StatusOr<VirtualNetwork::Host> VirtualNetwork::AddHost(const std::string& name) {
  const int index = static_cast<int>(hosts_.size());
  if (index >= 200) return absl::ResourceExhaustedError("at most 200 hosts");
  Host host;
  host.name = name;
  host.ns = absl::StrCat(kNamespacePrefix, tag_, "-", index, "-", name);
  host.address = absl::StrCat(subnet_, 10 + index);
  host.device = "eth0";
  host.port = absl::StrCat("tnh", tag_, "x", index);
  const std::string peer = absl::StrCat("tnp", tag_, "x", index);
  RETURN_IF_ERROR(Ip("netns add " + host.ns));
  hosts_.push_back(host);  // removed with the others from here on, whatever fails next
  for (const std::string& step : {
           absl::StrCat("-n ", host.ns, " link set lo up"),
           absl::StrCat("link add ", host.port, " type veth peer name ", peer),
           absl::StrCat("link set ", peer, " netns ", host.ns),
           absl::StrCat("-n ", host.ns, " link set ", peer, " name ", host.device),
           absl::StrCat("-n ", host.ns, " addr add ", host.address, "/24 dev ", host.device),
           absl::StrCat("-n ", host.ns, " link set ", host.device, " up"),
           absl::StrCat("link set ", host.port, " master ", bridge_),
           absl::StrCat("link set ", host.port, " up"),
       }) {
    RETURN_IF_ERROR(Ip(step));
  }
  return host;
}

std::vector<std::string> VirtualNetwork::Launcher(const Host& host) const {
  // `ip netns exec` and `env` exec the binary: it keeps their pid (signals reach it).
  return {ip_, "netns", "exec", host.ns, "env", "UCX_NET_DEVICES=" + host.device};
}

std::vector<std::string> VirtualNetwork::ListenFlags(const Host& host, bool kv) {
  std::vector<std::string> flags = {"--host=" + host.address};
  if (kv) flags.push_back("--kv_listen_host=" + host.address);
  return flags;
}

absl::Status VirtualNetwork::Disconnect(const Host& host) {
  return Ip(absl::StrCat("link set ", host.port, " down"));
}

absl::Status VirtualNetwork::Reconnect(const Host& host) {
  return Ip(absl::StrCat("link set ", host.port, " up"));
}

absl::Status VirtualNetwork::Cut(const Host& a, const Host& b) {
  RETURN_IF_ERROR(Ip(absl::StrCat("-n ", a.ns, " route add blackhole ", b.address, "/32")));
  return Ip(absl::StrCat("-n ", b.ns, " route add blackhole ", a.address, "/32"));
}

absl::Status VirtualNetwork::Heal(const Host& a, const Host& b) {
  RETURN_IF_ERROR(Ip(absl::StrCat("-n ", a.ns, " route del blackhole ", b.address, "/32")));
  return Ip(absl::StrCat("-n ", b.ns, " route del blackhole ", a.address, "/32"));
}

}  // namespace tandem::testing
