#include "tests/testing/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/http/client.h"
#include "common/http/http_server.h"
#include "common/util/clock.h"
#include "common/util/status.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace tandem::testing {

int ConnectAndSend(int port, const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      send(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string ReadUntil(int fd, const std::string& text, absl::Duration timeout) {
  std::string out;
  const util::Instant deadline = util::Instant::Now() + timeout;
  char buffer[4096];
  while (util::Instant::Now() < deadline && (text.empty() || !absl::StrContains(out, text))) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

std::string ReadUntilClosed(int fd, absl::Duration timeout) { return ReadUntil(fd, "", timeout); }

double MetricValue(int http_port, const std::string& name, const std::string& label) {
  return MetricValueAt("127.0.0.1", http_port, name, label);
}

double MetricValueAt(const std::string& host, int http_port, const std::string& name,
                     const std::string& label) {
  auto page = http::Fetch(host, http_port, "GET", "/metrics", "", 5000);
  if (!page.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(page->body, '\n')) {
    if (!absl::StartsWith(line, name + "{") || !absl::StrContains(line, label)) continue;
    double value;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) return value;
  }
  return -1;
}

absl::StatusOr<Subprocess> Subprocess::Start(std::vector<std::string> argv,
                                             const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The child must not inherit a blocked SIGTERM from a test that blocked it.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc)));
  }
  return Subprocess(pid);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), exit_status_(other.exit_status_) {
  other.pid_ = -1;
}

Subprocess::~Subprocess() {
  if (pid_ > 0) (void)Stop(SIGKILL, absl::Seconds(5));
}

bool Subprocess::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_status_ = status;
    pid_ = -1;
    return false;
  }
  return r == 0;
}

absl::StatusOr<int> Subprocess::Stop(int signal, absl::Duration deadline) {
  if (pid_ <= 0) return exit_status_;
  kill(pid_, signal);
  const util::Instant end = util::Instant::Now() + deadline;
  while (util::Instant::Now() < end) {
    if (!Running()) return exit_status_;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  exit_status_ = status;
  return absl::DeadlineExceededError(absl::StrCat("process did not exit within ",
                                                  absl::FormatDuration(deadline), " of signal ",
                                                  signal, "; killed"));
}

absl::StatusOr<Ports> WaitForPortFile(const std::string& path, absl::Duration deadline) {
  Ports ports;
  absl::Status last = absl::NotFoundError(absl::StrCat("no port file at ", path));
  const bool ok = WaitUntil(
      [&] {
        std::ifstream in(path);
        if (!in) return false;
        nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
        if (doc.is_discarded()) {
          last = absl::DataLossError(absl::StrCat("unparsable port file ", path));
          return false;
        }
        ports.grpc_port = doc.value("grpc_port", 0);
        ports.http_port = doc.value("http_port", 0);
        ports.pid = doc.value("pid", 0);
        return ports.grpc_port > 0 && ports.http_port > 0;
      },
      deadline);
  if (!ok) return last;
  return ports;
}

bool Stopped(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
}

bool WaitUntil(const std::function<bool()>& ready, absl::Duration deadline) {
  const util::Instant end = util::Instant::Now() + deadline;
  while (true) {
    if (ready()) return true;
    if (util::Instant::Now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TempDir::TempDir() {
  std::string templ = (std::filesystem::temp_directory_path() / "tandem_test_XXXXXX").string();
  char* made = mkdtemp(templ.data());
  path_ = made != nullptr ? made : "";
}

TempDir::~TempDir() {
  std::error_code ignored;
  if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
}

std::string BinDir() {
  const char* dir = std::getenv("TANDEM_BIN_DIR");
  return dir != nullptr ? dir : "build/bin";
}

std::pair<std::string, int> RunCommand(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {"", -1};
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) out.append(buffer, n);
  return {out, pclose(pipe)};
}

std::string SourceDir() {
  const char* dir = std::getenv("TANDEM_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

int TimeScale() {
  const char* scale = std::getenv("TANDEM_TEST_TIME_SCALE");
  return scale != nullptr ? std::max(1, std::atoi(scale)) : 1;
}

ServiceSet::ServiceSet(std::string model_dir)
    : model_dir_(model_dir.empty() ? SourceDir() + "/models/tiny-moe" : std::move(model_dir)) {}

absl::StatusOr<ServiceSet::Cluster> ServiceSet::StartCluster(
    const std::vector<std::string>& prefill_flags, const std::vector<std::string>& decode_flags,
    const std::vector<std::string>& gateway_flags) {
  Cluster cluster;
  ASSIGN_OR_RETURN(cluster.prefill, Start("tandem-prefill", prefill_flags));
  ASSIGN_OR_RETURN(cluster.decode, Start("tandem-decode", decode_flags));
  std::vector<std::string> flags = {absl::StrCat("--prefill=127.0.0.1:", cluster.prefill.grpc_port),
                                    absl::StrCat("--decode=127.0.0.1:", cluster.decode.grpc_port)};
  flags.insert(flags.end(), gateway_flags.begin(), gateway_flags.end());
  ASSIGN_OR_RETURN(cluster.gateway, Start("tandem-gateway", flags));
  return cluster;
}

absl::StatusOr<Ports> ServiceSet::Start(const std::string& binary,
                                        const std::vector<std::string>& extra,
                                        const std::vector<std::string>& launcher) {
  const std::string port_file = dir_.path() + "/" + binary + ".ports";
  std::filesystem::remove(port_file);  // a second instance of the same binary
  std::vector<std::string> argv = launcher;
  argv.insert(argv.end(), {BinDir() + "/" + binary, "--model=" + model_dir_,
                           "--port_file=" + port_file, "--drain_timeout_s=2"});
  argv.insert(argv.end(), extra.begin(), extra.end());
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv, dir_.path() + "/" + binary + ".log");
  if (!process.ok()) return process.status();
  processes_.push_back(*std::move(process));
  // A service that fails at start exits: say so at once rather than at the deadline.
  WaitUntil([&] { return std::filesystem::exists(port_file) || !processes_.back().Running(); },
            absl::Seconds(30));
  if (!processes_.back().Running() && !std::filesystem::exists(port_file)) {
    return absl::FailedPreconditionError(
        absl::StrCat(binary, " exited before serving:\n", Log(binary)));
  }
  absl::StatusOr<Ports> ports = WaitForPortFile(port_file, absl::Seconds(5));
  if (!ports.ok()) {
    return absl::Status(ports.status().code(),
                        absl::StrCat(binary, ": ", ports.status().message(), "\n", Log(binary)));
  }
  return ports;
}

std::string ServiceSet::Log(const std::string& binary) const {
  std::ifstream in(dir_.path() + "/" + binary + ".log");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace tandem::testing
