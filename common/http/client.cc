#include "common/http/client.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/util/clock.h"

namespace tandem::http {
namespace {

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

int MillisLeft(util::Instant deadline) {
  return static_cast<int>(absl::ToInt64Milliseconds(util::Until(deadline)));
}

// Waits for `events` on `fd`; false past the deadline.
bool WaitFor(int fd, short events, util::Instant deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, MillisLeft(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the next call report the error
  }
}

}  // namespace

absl::StatusOr<ClientResponse> Fetch(const std::string& host, int port, const std::string& method,
                                     const std::string& path, const std::string& body,
                                     int timeout_ms) {
  const util::Instant deadline = util::Instant::Now() + absl::Milliseconds(timeout_ms);
  const std::string where = absl::StrCat(method, " ", path, " on ", host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat(where, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    const int s = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) continue;
    if (connect(s, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      error = std::strerror(errno);
      close(s);
      continue;
    }
    if (!WaitFor(s, POLLOUT, deadline)) {
      error = "connect timed out";
      close(s);
      continue;
    }
    int so_error = 0;
    socklen_t length = sizeof(so_error);
    getsockopt(s, SOL_SOCKET, SO_ERROR, &so_error, &length);
    if (so_error != 0) {
      error = std::strerror(so_error);
      close(s);
      continue;
    }
    fd = s;
  }
  freeaddrinfo(found);
  if (fd < 0)
    return absl::UnavailableError(absl::StrCat("connect to ", host, ":", port, ": ", error));
  Socket socket(fd);

  const std::string request =
      absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: ", host, ":", port,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n =
        send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!WaitFor(fd, POLLOUT, deadline)) return absl::DeadlineExceededError(where);
    } else {
      // The server may answer (413) before reading the whole body: read what it says.
      break;
    }
  }

  // Read until the response is complete or the server closes.
  std::string in;
  bool eof = false;
  auto read_more = [&]() -> absl::Status {
    if (eof) return absl::DataLossError(absl::StrCat(where, ": the response is truncated"));
    if (!WaitFor(fd, POLLIN, deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(where, ": no complete response in time"));
    }
    char buffer[16384];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n > 0) {
      in.append(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      eof = true;
    } else if (errno != EAGAIN && errno != EINTR) {
      if (errno == ECONNRESET && !in.empty()) {
        eof = true;
      } else {
        return absl::UnavailableError(absl::StrCat(where, ": ", std::strerror(errno)));
      }
    }
    return absl::OkStatus();
  };
  auto read_line = [&](size_t* pos, std::string* line) -> absl::Status {
    while (true) {
      const size_t nl = in.find('\n', *pos);
      if (nl != std::string::npos) {
        *line = in.substr(*pos, nl - *pos);
        if (!line->empty() && line->back() == '\r') line->pop_back();
        *pos = nl + 1;
        return absl::OkStatus();
      }
      if (absl::Status s = read_more(); !s.ok()) return s;
    }
  };
  auto need = [&](size_t end) -> absl::Status {
    while (in.size() < end) {
      if (absl::Status s = read_more(); !s.ok()) return s;
    }
    return absl::OkStatus();
  };

  ClientResponse response;
  size_t pos = 0;
  std::string line;
  while (true) {
    if (absl::Status s = read_line(&pos, &line); !s.ok()) return s;
    if (!absl::StartsWith(line, "HTTP/1.") || line.size() < 12 ||
        !absl::SimpleAtoi(line.substr(9, 3), &response.status)) {
      return absl::DataLossError(absl::StrCat(where, ": malformed status line"));
    }
    response.headers.clear();
    while (true) {
      if (absl::Status s = read_line(&pos, &line); !s.ok()) return s;
      if (line.empty()) break;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) {
        return absl::DataLossError(absl::StrCat(where, ": malformed header"));
      }
      response.headers[absl::AsciiStrToLower(line.substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
    if (response.status >= 200 || response.status < 100) break;  // skip interim responses
  }
  if (method == "HEAD" || response.status == 204 || response.status == 304) return response;
  if (auto te = response.headers.find("transfer-encoding");
      te != response.headers.end() && absl::EqualsIgnoreCase(te->second, "chunked")) {
    while (true) {
      if (absl::Status s = read_line(&pos, &line); !s.ok()) return s;
      uint64_t size = 0;
      const std::string digits = line.substr(0, line.find(';'));
      if (digits.empty() || !absl::SimpleHexAtoi(digits, &size) || size > (uint64_t{1} << 32)) {
        return absl::DataLossError(absl::StrCat(where, ": malformed chunk size"));
      }
      if (size == 0) break;
      if (absl::Status s = need(pos + size + 2); !s.ok()) return s;
      response.body.append(in, pos, size);
      pos += size + 2;
    }
    return response;
  }
  if (auto cl = response.headers.find("content-length"); cl != response.headers.end()) {
    uint64_t length = 0;
    if (!absl::SimpleAtoi(cl->second, &length) || length > (uint64_t{1} << 32)) {
      return absl::DataLossError(absl::StrCat(where, ": malformed Content-Length"));
    }
    if (absl::Status s = need(pos + length); !s.ok()) return s;
    response.body = in.substr(pos, length);
    return response;
  }
  while (!eof) {
    if (absl::Status s = read_more(); !s.ok()) return s;
  }
  response.body = in.substr(pos);
  return response;
}

}  // namespace tandem::http
