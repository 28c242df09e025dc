// Test helpers that start real processes: a Subprocess (RAII: terminated and reaped when
// destroyed), port files written by the services, and polling with a deadline.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::testing {

class Subprocess {
 public:
  // Starts `argv[0]` with `argv`; stdout and stderr go to `log_path` (appended).
  static absl::StatusOr<Subprocess> Start(std::vector<std::string> argv,
                                          const std::string& log_path);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&&) = delete;
  Subprocess(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // Sends `signal`, waits up to `deadline` for exit; SIGKILLs after that. Returns the exit
  // status as waitpid reports it, or an error if it had to be killed.
  absl::StatusOr<int> Stop(int signal, absl::Duration deadline);
  // True while the process has not exited (reaps it if it has).
  bool Running();

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  int exit_status_ = -1;
};

struct Ports {
  int grpc_port = 0;
  int http_port = 0;
  int pid = 0;
};

// Waits for a service's --port_file to appear and parses it.
absl::StatusOr<Ports> WaitForPortFile(const std::string& path, absl::Duration deadline);

// Whether process `pid` is stopped (SIGSTOP, or a service that stopped itself): its state in
// /proc/PID/stat.
bool Stopped(pid_t pid);

// Polls `ready` every 50 ms until it returns true or `deadline` passes.
bool WaitUntil(const std::function<bool()>& ready, absl::Duration deadline);

// A fresh directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Service binaries started for one test, each on ephemeral loopback ports written to a port
// file, logging to a file of its own; stopped (SIGTERM, then SIGKILL) when this goes away.
class ServiceSet {
 public:
  // Services get --model=`model_dir` (the shipped tiny model by default).
  explicit ServiceSet(std::string model_dir = "");

  // Starts BinDir()/`binary` with --model, --port_file, --drain_timeout_s=2 and `extra`, and
  // waits up to 30 s for its ports; FAILED_PRECONDITION if it exits first. Errors carry the
  // service's log.
  // `launcher`, if given, goes before the binary (e.g. {"ip", "netns", "exec", NAME} or
  // {"env", "VAR=value"}: programs that exec the binary, so it keeps their pid).
  absl::StatusOr<Ports> Start(const std::string& binary, const std::vector<std::string>& extra,
                              const std::vector<std::string>& launcher = {});
  // A disaggregated cluster: tandem-prefill, tandem-decode and a tandem-gateway over the two,
  // each with its own extra flags (the gateway gets --prefill and --decode).
  struct Cluster {
    Ports prefill, decode, gateway;
  };
  absl::StatusOr<Cluster> StartCluster(const std::vector<std::string>& prefill_flags,
                                       const std::vector<std::string>& decode_flags,
                                       const std::vector<std::string>& gateway_flags = {});
  // What `binary` has logged so far.
  std::string Log(const std::string& binary) const;
  const std::string& dir() const { return dir_.path(); }
  // In the order started.
  std::vector<Subprocess>& processes() { return processes_; }

 private:
  TempDir dir_;
  std::string model_dir_;
  std::vector<Subprocess> processes_;
};

// A client on a raw socket: connects to 127.0.0.1:`port` and sends `bytes` (an HTTP request);
// the socket, left to the caller to read or close, or -1.
int ConnectAndSend(int port, const std::string& bytes);

// Reads from the socket `fd` until `text` has arrived, the peer closes, or `timeout` passes;
// returns what was read. ReadUntilClosed: until the peer closes (or `timeout`).
std::string ReadUntil(int fd, const std::string& text, absl::Duration timeout = absl::Seconds(10));
std::string ReadUntilClosed(int fd, absl::Duration timeout = absl::Seconds(10));

// The value of the first sample of `name` on the /metrics page of the service on
// `http_port` whose labels contain `label`; -1 when absent or unreachable.
double MetricValue(int http_port, const std::string& name, const std::string& label = "");
// The same for a service listening on `host` (a network namespace's address).
double MetricValueAt(const std::string& host, int http_port, const std::string& name,
                     const std::string& label = "");

// What a shell command printed on stdout, and its exit status as pclose reports it.
std::pair<std::string, int> RunCommand(const std::string& command);

// Directory of the built binaries ($TANDEM_BIN_DIR, set by CTest).
std::string BinDir();
// Repository root ($TANDEM_SOURCE_DIR, set by CTest).
std::string SourceDir();
// How many times slower than usual the code under test runs: $TANDEM_TEST_TIME_SCALE (set in a
// sanitizer build's test environment), 1 when unset. For timings a test relies on, not deadlines.
int TimeScale();

}  // namespace tandem::testing
