#include "tools/cli/event_stream.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/util/clock.h"
#include "common/util/status.h"
#include "nlohmann/json.hpp"

namespace tandem::cli {

void SseParser::Feed(absl::string_view bytes, std::vector<std::string>* events) {
  while (!bytes.empty()) {
    if (after_cr_) {
      after_cr_ = false;
      if (bytes.front() == '\n') {  // the LF of a CRLF whose CR ended the last piece
        bytes.remove_prefix(1);
        continue;
      }
    }
    const size_t end = bytes.find_first_of("\r\n");
    if (end == absl::string_view::npos) {
      pending_.append(bytes.data(), bytes.size());
      return;
    }
    pending_.append(bytes.data(), end);
    const std::string line = std::move(pending_);
    pending_.clear();
    if (bytes[end] == '\r') {
      if (end + 1 < bytes.size()) {
        bytes.remove_prefix(bytes[end + 1] == '\n' ? end + 2 : end + 1);
      } else {
        bytes.remove_prefix(end + 1);
        after_cr_ = true;
      }
    } else {
      bytes.remove_prefix(end + 1);
    }
    Line(line, events);
  }
}

void SseParser::Line(absl::string_view line, std::vector<std::string>* events) {
  if (line.empty()) {
    if (!data_.empty()) {
      data_.pop_back();  // the LF after the last data line
      events->push_back(std::move(data_));
    }
    data_.clear();
    return;
  }
  if (line.front() == ':') return;  // a comment (keep-alive)
  const size_t colon = line.find(':');
  const absl::string_view field = line.substr(0, colon);
  absl::string_view value;
  if (colon != absl::string_view::npos) {
    value = line.substr(colon + 1);
    if (absl::StartsWith(value, " ")) value.remove_prefix(1);
  }
  if (field == "data") {
    data_.append(value.data(), value.size());
    data_.push_back('\n');
  }
}

namespace {

constexpr size_t kMaxLineBytes = 16 << 10;
constexpr size_t kMaxHeadBytes = 64 << 10;
constexpr size_t kMaxErrorBodyBytes = 64 << 10;

}  // namespace

absl::Status ChunkedDecoder::Feed(absl::string_view bytes, std::string* out) {
  while (!bytes.empty()) {
    switch (state_) {
      case State::kData: {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, bytes.size()));
        out->append(bytes.data(), n);
        bytes.remove_prefix(n);
        remaining_ -= n;
        if (remaining_ == 0) state_ = State::kDataEnd;
        break;
      }
      case State::kDone:
        return absl::OkStatus();
      case State::kSize:
      case State::kDataEnd:
      case State::kTrailer: {
        const size_t lf = bytes.find('\n');
        line_.append(bytes.data(), lf == absl::string_view::npos ? bytes.size() : lf);
        if (line_.size() > kMaxLineBytes) {
          return absl::InvalidArgumentError("chunked body: a framing line is too long");
        }
        if (lf == absl::string_view::npos) return absl::OkStatus();
        bytes.remove_prefix(lf + 1);
        if (!line_.empty() && line_.back() == '\r') line_.pop_back();
        const std::string line = std::move(line_);
        line_.clear();
        if (state_ == State::kDataEnd) {
          if (!line.empty()) {
            return absl::InvalidArgumentError("chunked body: chunk data not followed by CRLF");
          }
          state_ = State::kSize;
        } else if (state_ == State::kTrailer) {
          if (line.empty()) state_ = State::kDone;
        } else {
          const absl::string_view size_text =
              absl::StripAsciiWhitespace(absl::string_view(line).substr(0, line.find(';')));
          uint64_t size = 0;
          if (size_text.empty() || size_text.size() > 15) {
            return absl::InvalidArgumentError(
                absl::StrCat("chunked body: bad chunk size line '", line, "'"));
          }
          for (char c : size_text) {
            const int digit = absl::ascii_isdigit(c)    ? c - '0'
                              : absl::ascii_isxdigit(c) ? absl::ascii_tolower(c) - 'a' + 10
                                                        : -1;
            if (digit < 0) {
              return absl::InvalidArgumentError(
                  absl::StrCat("chunked body: bad chunk size line '", line, "'"));
            }
            size = size * 16 + digit;
          }
          remaining_ = size;
          state_ = size == 0 ? State::kTrailer : State::kData;
        }
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ResponseHead> ParseResponseHead(absl::string_view head) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  while (!lines.empty() && absl::StripAsciiWhitespace(lines.back()).empty()) lines.pop_back();
  if (lines.empty()) return absl::InvalidArgumentError("empty HTTP response head");
  // "HTTP/1.1 200 OK"
  const absl::string_view status_line = absl::StripAsciiWhitespace(lines[0]);
  std::vector<absl::string_view> parts = absl::StrSplit(status_line, absl::MaxSplits(' ', 2));
  ResponseHead result;
  if (parts.size() < 2 || !absl::StartsWith(parts[0], "HTTP/1.") || parts[1].size() != 3 ||
      !absl::SimpleAtoi(parts[1], &result.status) || result.status < 100) {
    return absl::InvalidArgumentError(absl::StrCat("bad HTTP status line '", status_line, "'"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = absl::StripTrailingAsciiWhitespace(lines[i]);
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || colon == 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad HTTP header line '", line, "'"));
    }
    const std::string name = absl::AsciiStrToLower(line.substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    auto [it, inserted] = result.headers.emplace(name, std::string(value));
    if (!inserted) absl::StrAppend(&it->second, ", ", value);
  }
  return result;
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view endpoint) {
  HostPort result;
  absl::string_view port;
  if (absl::StartsWith(endpoint, "[")) {
    const size_t close = endpoint.find(']');
    if (close == absl::string_view::npos || endpoint.substr(close + 1, 1) != ":") {
      return absl::InvalidArgumentError(absl::StrCat("bad endpoint '", endpoint, "'"));
    }
    result.host = std::string(endpoint.substr(1, close - 1));
    port = endpoint.substr(close + 2);
  } else {
    const size_t colon = endpoint.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("endpoint '", endpoint, "' has no port (HOST:PORT)"));
    }
    result.host = std::string(endpoint.substr(0, colon));
    port = endpoint.substr(colon + 1);
  }
  if (result.host.empty() || !absl::SimpleAtoi(port, &result.port) || result.port <= 0 ||
      result.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad endpoint '", endpoint, "' (HOST:PORT)"));
  }
  return result;
}

namespace {

// A socket, closed when this goes away.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&&) = delete;
  Socket(const Socket&) = delete;
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Waits for `events` on `fd` until `deadline`; the events that happened.
absl::StatusOr<short> WaitFor(int fd, short events, util::Instant deadline,
                              absl::string_view what) {
  while (true) {
    const absl::Duration left = util::Until(deadline);
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("deadline passed while ", what));
    }
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min<double>(std::ceil(absl::ToDoubleMilliseconds(left)),
                                                     std::numeric_limits<int>::max()));
    const int rc = poll(&p, 1, ms);
    if (rc > 0) return p.revents;
    if (rc < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
}

absl::StatusOr<Socket> Connect(const HostPort& endpoint, util::Instant deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(endpoint.port);
  if (const int rc = getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("resolve ", endpoint.host, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, &freeaddrinfo);
  std::vector<std::string> errors;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Socket socket(
        ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (socket.fd() < 0) {
      errors.push_back(absl::StrCat("socket: ", std::strerror(errno)));
      continue;
    }
    int error = 0;
    if (connect(socket.fd(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        error = errno;
      } else {
        ASSIGN_OR_RETURN(const short events, WaitFor(socket.fd(), POLLOUT, deadline,
                                                     absl::StrCat("connecting to ", endpoint.host,
                                                                  ":", endpoint.port)));
        (void)events;
        socklen_t length = sizeof(error);
        if (getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
      }
    }
    if (error != 0) {
      errors.push_back(std::strerror(error));
      continue;
    }
    const int one = 1;
    setsockopt(socket.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return socket;
  }
  return absl::UnavailableError(absl::StrCat("connect to ", endpoint.host, ":", endpoint.port, ": ",
                                             absl::StrJoin(errors, "; ")));
}

absl::Status SendAll(int fd, absl::string_view data, util::Instant deadline) {
  while (!data.empty()) {
    const ssize_t sent = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (sent > 0) {
      data.remove_prefix(static_cast<size_t>(sent));
    } else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, "sending the request").status());
    } else if (sent < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status HttpError(int status, const std::string& body) {
  std::string message = body;
  const auto json = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_object() && json.contains("error")) {
    const auto& error = json["error"];
    if (error.is_object() && error.contains("message") && error["message"].is_string()) {
      message = error["message"].get<std::string>();
    } else if (error.is_string()) {
      message = error.get<std::string>();
    }
  }
  message = absl::StrCat("HTTP ", status, ": ", absl::StripAsciiWhitespace(message));
  switch (status) {
    case 400:
    case 422:
      return absl::InvalidArgumentError(message);
    case 401:
      return absl::UnauthenticatedError(message);
    case 403:
      return absl::PermissionDeniedError(message);
    case 404:
      return absl::NotFoundError(message);
    case 408:
    case 504:
      return absl::DeadlineExceededError(message);
    case 429:
      return absl::ResourceExhaustedError(message);
    case 503:
      return absl::UnavailableError(message);
    default:
      return status >= 500 ? absl::InternalError(message) : absl::UnknownError(message);
  }
}

}  // namespace

absl::Status PostEventStream(const HostPort& endpoint, const std::string& path,
                             const std::string& json_body, util::Instant deadline,
                             const std::function<bool(absl::string_view data)>& on_event) {
  ASSIGN_OR_RETURN(Socket socket, Connect(endpoint, deadline));
  const std::string host = absl::StrContains(endpoint.host, ':')
                               ? absl::StrCat("[", endpoint.host, "]:", endpoint.port)
                               : absl::StrCat(endpoint.host, ":", endpoint.port);
  RETURN_IF_ERROR(
      SendAll(socket.fd(),
              absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: ", host,
                           "\r\nContent-Type: application/json\r\n"
                           "Accept: text/event-stream\r\nContent-Length: ",
                           json_body.size(), "\r\nConnection: close\r\n\r\n", json_body),
              deadline));

  enum class Framing { kChunked, kLength, kClose };
  std::string head_bytes;
  bool have_head = false;
  ResponseHead head;
  Framing framing = Framing::kClose;
  uint64_t length_left = 0;
  ChunkedDecoder chunked;
  SseParser sse;
  std::string error_body;
  std::vector<std::string> events;
  std::string decoded;
  char buffer[16384];

  // Handles body bytes; true once the body is complete or the caller has stopped.
  bool stopped = false;
  auto on_body = [&](absl::string_view bytes) -> absl::StatusOr<bool> {
    decoded.clear();
    switch (framing) {
      case Framing::kChunked:
        RETURN_IF_ERROR(chunked.Feed(bytes, &decoded));
        break;
      case Framing::kLength: {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(length_left, bytes.size()));
        decoded.assign(bytes.data(), n);
        length_left -= n;
        break;
      }
      case Framing::kClose:
        decoded.assign(bytes.data(), bytes.size());
        break;
    }
    if (head.status != 200) {
      error_body.append(decoded, 0,
                        kMaxErrorBodyBytes - std::min(kMaxErrorBodyBytes, error_body.size()));
    } else {
      events.clear();
      sse.Feed(decoded, &events);
      for (const std::string& event : events) {
        if (!on_event(event)) {
          stopped = true;
          return true;
        }
      }
    }
    return (framing == Framing::kChunked && chunked.done()) ||
           (framing == Framing::kLength && length_left == 0);
  };
  auto finish = [&]() -> absl::Status {
    if (head.status != 200) return HttpError(head.status, error_body);
    return absl::OkStatus();
  };

  while (true) {
    ASSIGN_OR_RETURN(const short revents,
                     WaitFor(socket.fd(), POLLIN, deadline, "waiting for the response"));
    (void)revents;
    const ssize_t got = recv(socket.fd(), buffer, sizeof(buffer), 0);
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    }
    if (got == 0) {  // the server closed the connection
      if (!have_head) {
        return absl::UnavailableError("connection closed before a complete response head");
      }
      if (framing == Framing::kClose || head.status != 200) return finish();
      return absl::UnavailableError("connection closed before the end of the event stream");
    }
    absl::string_view bytes(buffer, static_cast<size_t>(got));
    if (!have_head) {
      head_bytes.append(bytes.data(), bytes.size());
      const size_t end = head_bytes.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (head_bytes.size() > kMaxHeadBytes) {
          return absl::InvalidArgumentError("HTTP response head too large");
        }
        continue;
      }
      ASSIGN_OR_RETURN(head, ParseResponseHead(absl::string_view(head_bytes).substr(0, end)));
      have_head = true;
      const auto te = head.headers.find("transfer-encoding");
      const auto cl = head.headers.find("content-length");
      if (te != head.headers.end() &&
          absl::StrContains(absl::AsciiStrToLower(te->second), "chunked")) {
        framing = Framing::kChunked;
      } else if (cl != head.headers.end()) {
        if (!absl::SimpleAtoi(cl->second, &length_left)) {
          return absl::InvalidArgumentError(absl::StrCat("bad Content-Length '", cl->second, "'"));
        }
        framing = Framing::kLength;
      }
      if (head.status == 200) {
        const auto type = head.headers.find("content-type");
        if (type == head.headers.end() ||
            !absl::StartsWith(absl::AsciiStrToLower(type->second), "text/event-stream")) {
          return absl::InvalidArgumentError(
              absl::StrCat("expected a text/event-stream response, got Content-Type '",
                           type == head.headers.end() ? "" : type->second, "'"));
        }
      }
      const std::string rest = head_bytes.substr(end + 4);
      head_bytes.clear();
      if (framing == Framing::kLength && length_left == 0) return finish();
      ASSIGN_OR_RETURN(const bool complete, on_body(rest));
      if (stopped) return absl::OkStatus();
      if (complete) return finish();
      continue;
    }
    ASSIGN_OR_RETURN(const bool complete, on_body(bytes));
    if (stopped) return absl::OkStatus();
    if (complete) return finish();
  }
}

}  // namespace tandem::cli
