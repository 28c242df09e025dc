// A real HTTP peer for client tests: listens on an ephemeral loopback port, accepts one
// connection, reads one request (head and Content-Length body) and answers with scripted
// writes, each after its delay, straight onto the socket; then keeps the connection open for
// `hold` (or until destroyed) and closes it.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/util/clock.h"

namespace tandem::testing {

class CannedServer {
 public:
  struct Write {
    absl::Duration delay;  // before these bytes
    std::string bytes;
  };

  explicit CannedServer(std::vector<Write> script, absl::Duration hold = absl::ZeroDuration())
      : script_(std::move(script)), hold_(hold) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    socklen_t length = sizeof(address);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
        listen(listen_fd_, 4) == 0 &&
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      port_ = ntohs(address.sin_port);
    }
    thread_ = std::thread([this] { Serve(); });
  }
  ~CannedServer() {
    stop_.Notify();
    thread_.join();
    close(listen_fd_);
  }
  CannedServer(const CannedServer&) = delete;
  CannedServer& operator=(const CannedServer&) = delete;

  int port() const { return port_; }
  // The request as received (head and body); empty until one has arrived.
  std::string request() const {
    absl::MutexLock lock(&mu_);
    return request_;
  }

  // A 200 event-stream response head with chunked transfer coding.
  static std::string ChunkedSseHead() {
    return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
  }
  // `bytes` as one chunk.
  static std::string Chunk(const std::string& bytes) {
    char size[32];
    snprintf(size, sizeof(size), "%zx", bytes.size());
    return absl::StrCat(size, "\r\n", bytes, "\r\n");
  }

 private:
  void Serve() {
    // Accept within 10 s (or until destroyed), polling so that destruction is never blocked.
    int fd = -1;
    const util::Instant give_up = util::Instant::Now() + absl::Seconds(10);
    while (fd < 0 && util::Instant::Now() < give_up && !stop_.HasBeenNotified()) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 50) > 0) fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    }
    if (fd < 0) return;
    std::string received;
    char buffer[4096];
    size_t wanted = std::string::npos;
    while (received.size() < wanted && util::Instant::Now() < give_up) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
      if (got <= 0) break;
      received.append(buffer, got);
      const size_t end = received.find("\r\n\r\n");
      if (end != std::string::npos && wanted == std::string::npos) {
        size_t body = 0;
        const size_t at = received.find("Content-Length: ");
        if (at != std::string::npos && at < end) {
          (void)absl::SimpleAtoi(received.substr(at + 16, received.find("\r\n", at) - at - 16),
                                 &body);
        }
        wanted = end + 4 + body;
      }
    }
    {
      absl::MutexLock lock(&mu_);
      request_ = received;
    }
    for (const Write& write : script_) {
      if (stop_.WaitForNotificationWithTimeout(write.delay)) break;
      (void)send(fd, write.bytes.data(), write.bytes.size(), MSG_NOSIGNAL);
    }
    stop_.WaitForNotificationWithTimeout(hold_);
    close(fd);
  }

  const std::vector<Write> script_;
  const absl::Duration hold_;
  int listen_fd_ = -1;
  int port_ = 0;
  absl::Notification stop_;
  mutable absl::Mutex mu_;
  std::string request_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tandem::testing
