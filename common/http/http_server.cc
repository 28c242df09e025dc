#include "common/http/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/util/clock.h"
#include "common/util/guard.h"
#include "common/util/logging.h"
#include "nlohmann/json.hpp"

namespace tandem::http {

const char* StatusText(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 417:
      return "Expectation Failed";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return status < 400 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  }
}

std::string ErrorBody(int status, absl::string_view message, absl::string_view param,
                      const char* code_override) {
  const char* type = status >= 500 ? "internal_error" : "invalid_request_error";
  const char* code = nullptr;
  switch (status) {
    case 413:
      code = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      code = "overloaded";
      break;
    case 503:
      type = "service_unavailable";
      break;
    case 504:
      type = "timeout";
      break;
    default:
      break;
  }
  if (code_override != nullptr) code = code_override;
  using nlohmann::json;
  const json body = {{"error",
                      {{"message", std::string(message)},
                       {"type", type},
                       {"param", param.empty() ? json(nullptr) : json(std::string(param))},
                       {"code", code == nullptr ? json(nullptr) : json(code)}}}};
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace internal {

// One client connection. The loop thread owns the socket's reading side and the parser;
// what writers on other threads share with it (the output, the response's progress, whether
// the socket is still open) is guarded by `mu`.
class Connection {
 public:
  Connection(int fd, std::weak_ptr<HttpServer::Core> core, const ParserLimits& limits)
      : fd(fd), core(std::move(core)), parser(limits) {}

  const int fd;
  const std::weak_ptr<HttpServer::Core> core;

  // Loop thread only.
  enum class Phase { kReading, kHandling, kLingering };
  RequestParser parser;
  std::string in;  // bytes read and not yet parsed (a pipelined request)
  Phase phase = Phase::kReading;
  util::Instant phase_since = util::Instant::Now();
  bool any_request = false;  // a request was answered on this connection already
  uint32_t events = 0;       // the epoll interest set now
  bool peer_fin = false;     // the client shut down its sending side
  bool continue_sent = false;

  absl::Mutex mu;
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;  // the request being answered
  std::string out ABSL_GUARDED_BY(mu);          // bytes waiting to be sent
  size_t out_offset ABSL_GUARDED_BY(mu) = 0;
  bool closed ABSL_GUARDED_BY(mu) = false;    // the socket is closed (or closing)
  bool broken ABSL_GUARDED_BY(mu) = false;    // a send failed, or the client reads too slowly
  bool want_out ABSL_GUARDED_BY(mu) = false;  // the socket was full: wait for EPOLLOUT
  bool started ABSL_GUARDED_BY(mu) = false;   // the status line is out (or queued)
  bool finished ABSL_GUARDED_BY(mu) = false;  // the whole response is queued
  bool head_only ABSL_GUARDED_BY(mu) = false;
  bool keep_alive ABSL_GUARDED_BY(mu) = false;
  bool minor_version_0 ABSL_GUARDED_BY(mu) = false;  // no chunked coding: body until close
  util::Instant write_progress ABSL_GUARDED_BY(mu);
  size_t max_buffered = 0;  // set once at creation
  std::function<void()> on_gone ABSL_GUARDED_BY(mu);
  std::atomic<bool> dirty{false};  // queued for the loop's attention

  size_t pending_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return out.size() - out_offset;
  }

  // Sends what is queued without blocking; on a full socket asks the loop for EPOLLOUT.
  // Returns true when the loop must look at this connection (EPOLLOUT, or it broke).
  bool FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (closed || broken) return false;
    while (out_offset < out.size()) {
      const ssize_t n =
          send(fd, out.data() + out_offset, out.size() - out_offset, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        out_offset += static_cast<size_t>(n);
        write_progress = util::Instant::Now();
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!want_out) {
          want_out = true;
          return true;
        }
        return false;
      }
      broken = true;
      return true;
    }
    out.clear();
    out_offset = 0;
    return false;
  }
};

}  // namespace internal

using internal::Connection;

class HttpServer::Core : public std::enable_shared_from_this<HttpServer::Core> {
 public:
  Core(const ServerOptions& options, std::vector<Route> routes)
      : options_(options), routes_(std::move(routes)) {}
  ~Core();

  absl::Status Bind();
  void StartThreads();
  void Stop();
  int port() const { return port_; }
  int num_connections() const { return num_connections_.load(); }
  const ServerOptions& options() const { return options_; }

  // From any thread: the loop should look at `connection` (output to flush, a response
  // finished, a failure).
  void MarkDirty(const std::shared_ptr<Connection>& connection);

 private:
  void Loop();
  void Work();
  void Post(std::function<void()> task);
  void Wake();
  void Accept();
  void SetEvents(Connection& c, uint32_t events);
  void OnEvents(const std::shared_ptr<Connection>& c, uint32_t events);
  void OnDirty(const std::shared_ptr<Connection>& c);
  void ReadRequest(const std::shared_ptr<Connection>& c);
  // Parses what `c->in` holds; starts the handler once a request is complete.
  void Parse(const std::shared_ptr<Connection>& c);
  void StartHandling(const std::shared_ptr<Connection>& c);
  // The response is out: the next request, or a lingering close.
  void ResponseDone(const std::shared_ptr<Connection>& c);
  // Queues a whole error response and closes after it.
  void Refuse(const std::shared_ptr<Connection>& c, int status, const std::string& message);
  void Linger(const std::shared_ptr<Connection>& c);
  void Close(const std::shared_ptr<Connection>& c);
  void Sweep();
  void Dispatch(std::shared_ptr<Connection> c, uint64_t generation, Request request);

  const ServerOptions options_;
  const std::vector<Route> routes_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  std::thread loop_;
  std::vector<std::thread> workers_;
  std::atomic<int> num_connections_{0};

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Connection>> dirty_ ABSL_GUARDED_BY(mu_);

  // Loop thread only.
  absl::flat_hash_map<int, std::shared_ptr<Connection>> connections_;
  bool loop_stopping_ = false;
};

namespace {

constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
constexpr absl::Duration kLingerTime = absl::Seconds(2);
constexpr absl::Duration kSweepInterval = absl::Milliseconds(200);

std::string Head(int status, absl::string_view content_type, absl::string_view framing,
                 bool keep_alive) {
  return absl::StrCat("HTTP/1.1 ", status, " ", StatusText(status),
                      "\r\nContent-Type: ", content_type, "\r\n", framing,
                      "Connection: ", keep_alive ? "keep-alive" : "close", "\r\n\r\n");
}

std::string WholeResponse(const Response& response, bool keep_alive, bool head_only) {
  std::string out =
      Head(response.status, response.content_type,
           absl::StrCat("Content-Length: ", response.body.size(), "\r\n"), keep_alive);
  if (!head_only) out += response.body;
  return out;
}

}  // namespace

HttpServer::Core::~Core() {
  if (listen_fd_ >= 0) close(listen_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

absl::Status HttpServer::Core::Bind() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(options_.port);
  if (const int rc = getaddrinfo(options_.host.empty() ? nullptr : options_.host.c_str(),
                                 port.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP host \"", options_.host, "\": ", gai_strerror(rc)));
  }
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
      error = std::strerror(errno);
      close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", options_.host, ":", options_.port, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6&>(bound).sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in&>(bound).sin_port);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return absl::InternalError("epoll or eventfd failed");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  return absl::OkStatus();
}

void HttpServer::Core::StartThreads() {
  for (int i = 0; i < options_.num_threads; ++i) workers_.emplace_back([this] { Work(); });
  loop_ = std::thread([this] { Loop(); });
}

void HttpServer::Core::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  Wake();
  if (loop_.joinable()) loop_.join();  // closes every connection
  for (std::thread& t : workers_) t.join();
}

void HttpServer::Core::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void HttpServer::Core::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void HttpServer::Core::Work() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;  // queued requests' connections are being closed
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    util::Guarded("http worker", task);
  }
}

void HttpServer::Core::MarkDirty(const std::shared_ptr<Connection>& connection) {
  if (connection->dirty.exchange(true)) return;
  {
    absl::MutexLock lock(&mu_);
    dirty_.push_back(connection);
  }
  Wake();
}

void HttpServer::Core::SetEvents(Connection& c, uint32_t events) {
  if (c.events == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = c.fd;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  c.events = events;
}

void HttpServer::Core::Loop() {
  epoll_event events[256];
  util::Instant next_sweep = util::Instant::Now() + kSweepInterval;
  while (true) {
    const int wait_ms = static_cast<int>(absl::ToInt64Milliseconds(util::Until(next_sweep)));
    const int n = epoll_wait(epoll_fd_, events, 256, wait_ms);
    bool stop;
    std::vector<std::shared_ptr<Connection>> dirty;
    {
      absl::MutexLock lock(&mu_);
      stop = stopping_;
      dirty.swap(dirty_);
    }
    if (stop) break;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        uint64_t drained;
        while (read(wake_fd_, &drained, sizeof(drained)) > 0) {
        }
      } else if (fd == listen_fd_) {
        Accept();
      } else if (auto it = connections_.find(fd); it != connections_.end()) {
        std::shared_ptr<Connection> c = it->second;
        util::Guarded("http connection", [&] { OnEvents(c, events[i].events); });
      }
    }
    for (const std::shared_ptr<Connection>& c : dirty) {
      c->dirty.store(false);
      auto it = connections_.find(c->fd);
      if (it == connections_.end() || it->second != c) continue;  // closed meanwhile
      util::Guarded("http connection", [&] { OnDirty(c); });
    }
    if (util::Instant::Now() >= next_sweep) {
      Sweep();
      next_sweep = util::Instant::Now() + kSweepInterval;
    }
  }
  // Stopping: close every connection (writers held elsewhere now see the client gone).
  loop_stopping_ = true;
  std::vector<std::shared_ptr<Connection>> all;
  for (auto& [fd, c] : connections_) all.push_back(c);
  for (const auto& c : all) Close(c);
}

void HttpServer::Core::Accept() {
  while (true) {
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &length,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        TANDEM_LOG(WARNING) << "http: out of file descriptors; refusing connections";
      }
      return;
    }
    if (num_connections_.load() >= options_.max_connections) {
      const std::string refusal =
          WholeResponse({503, "application/json",
                         ErrorBody(503, absl::StrCat("more than ", options_.max_connections,
                                                     " connections are open; retry later"))},
                        false, false);
      (void)!send(fd, refusal.data(), refusal.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      close(fd);
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ParserLimits limits;
    limits.max_body_bytes = options_.max_body_bytes;
    limits.max_header_bytes = options_.max_header_bytes;
    auto c = std::make_shared<Connection>(fd, weak_from_this(), limits);
    c->max_buffered = options_.max_buffered_bytes;
    c->events = EPOLLIN | EPOLLRDHUP;
    epoll_event ev{};
    ev.events = c->events;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      continue;
    }
    connections_[fd] = c;
    num_connections_.fetch_add(1);
  }
}

void HttpServer::Core::OnEvents(const std::shared_ptr<Connection>& c, uint32_t events) {
  if (events & (EPOLLERR | EPOLLHUP)) return Close(c);
  if (events & EPOLLOUT) OnDirty(c);
  if (connections_.find(c->fd) == connections_.end()) return;
  switch (c->phase) {
    case Connection::Phase::kReading:
      if (events & (EPOLLIN | EPOLLRDHUP)) ReadRequest(c);
      break;
    case Connection::Phase::kHandling:
      if (events & EPOLLRDHUP) {
        // The client shut down its side: it may only have half-closed (and still reads), or
        // be gone. HTTP/1.1 lets a server send an interim 100 response at any time before
        // the final one, and clients ignore it; a closed socket answers it with a reset,
        // which ends the connection (EPOLLERR) and tells the handler.
        c->peer_fin = true;
        SetEvents(*c, c->events & ~(EPOLLIN | EPOLLRDHUP));
        bool version_0, flush = false;
        {
          absl::MutexLock lock(&c->mu);
          version_0 = c->minor_version_0;
          if (!version_0 && !c->started && c->pending_locked() == 0 && !c->continue_sent) {
            c->continue_sent = true;
            c->out += kContinue;
            flush = c->FlushLocked();
          }
        }
        if (version_0) return Close(c);  // no interim responses in HTTP/1.0: take it as gone
        if (flush) OnDirty(c);
      }
      break;
    case Connection::Phase::kLingering: {
      char buffer[4096];
      while (true) {
        const ssize_t n = recv(c->fd, buffer, sizeof(buffer), MSG_DONTWAIT);
        if (n > 0) continue;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        return Close(c);  // EOF or error
      }
    }
  }
}

void HttpServer::Core::ReadRequest(const std::shared_ptr<Connection>& c) {
  char buffer[16384];
  size_t total = 0;
  bool eof = false;
  while (total < (size_t{64} << 10)) {
    const ssize_t n = recv(c->fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n > 0) {
      c->in.append(buffer, static_cast<size_t>(n));
      total += static_cast<size_t>(n);
      // Enough for a complete request: parse before reading on (bounds what one client
      // can make us buffer).
      if (c->in.size() >= (size_t{64} << 10)) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n == 0) {
      eof = true;
      break;
    }
    return Close(c);  // a reset
  }
  if (eof) c->peer_fin = true;
  if (!c->in.empty() || c->parser.headers_done()) Parse(c);
  if (connections_.find(c->fd) == connections_.end()) return;
  if (c->phase == Connection::Phase::kReading && c->peer_fin) {
    // The client will send nothing more and the request is not complete: nothing to answer.
    Close(c);
  }
}

void HttpServer::Core::Parse(const std::shared_ptr<Connection>& c) {
  if (c->phase != Connection::Phase::kReading) return;
  if (c->in.empty()) return;
  size_t consumed = 0;
  const RequestParser::State state = c->parser.Feed(c->in, &consumed);
  c->in.erase(0, consumed);
  if (state == RequestParser::State::kError) {
    return Refuse(c, c->parser.error_status(), c->parser.error_message());
  }
  if (state == RequestParser::State::kNeedMore) {
    if (c->parser.headers_done() && c->parser.expects_continue() && !c->continue_sent) {
      c->continue_sent = true;
      bool flush;
      {
        absl::MutexLock lock(&c->mu);
        c->out += kContinue;
        flush = c->FlushLocked();
      }
      if (flush) OnDirty(c);
    }
    return;
  }
  StartHandling(c);
}

void HttpServer::Core::StartHandling(const std::shared_ptr<Connection>& c) {
  Request request = c->parser.TakeRequest();
  const bool keep_alive = c->parser.keep_alive() && !c->peer_fin;
  uint64_t generation;
  {
    absl::MutexLock lock(&c->mu);
    generation = c->generation;
    c->started = false;
    c->finished = false;
    c->head_only = request.method == "HEAD";
    c->keep_alive = keep_alive;
    c->minor_version_0 = request.minor_version == 0;
    c->write_progress = util::Instant::Now();
  }
  c->phase = Connection::Phase::kHandling;
  c->phase_since = util::Instant::Now();
  // Stop reading while the request is answered (a pipelined next request waits in the
  // socket), but keep hearing of the client shutting down.
  SetEvents(*c, (c->events & EPOLLOUT) | (c->peer_fin ? 0u : static_cast<uint32_t>(EPOLLRDHUP)));
  if (c->peer_fin) {
    // The request came with the client's FIN: see whether it is still there.
    OnEvents(c, EPOLLRDHUP);
    if (connections_.find(c->fd) == connections_.end()) return;
  }
  Post([this, c, generation, request = std::move(request)]() mutable {
    Dispatch(std::move(c), generation, std::move(request));
  });
}

void HttpServer::Core::Dispatch(std::shared_ptr<Connection> c, uint64_t generation,
                                Request request) {
  auto route = std::find_if(routes_.begin(), routes_.end(),
                            [&](const Route& r) { return r.path == request.path; });
  std::shared_ptr<ResponseWriter> writer(new ResponseWriter(c, generation));
  if (route == routes_.end()) {
    writer->Send(
        {404, "application/json", ErrorBody(404, absl::StrCat("no such path: ", request.path))});
    return;
  }
  if (route->stream_handler) {
    const bool ok = util::Guarded(absl::StrCat("HTTP ", request.method, " ", route->path),
                                  [&] { route->stream_handler(request, writer); });
    if (!ok) {
      if (!writer->Send({500, "application/json",
                         ErrorBody(500, "internal error while handling the request")})) {
        writer->Finish();
      }
    }
    return;
  }
  Response response;
  const bool ok = util::Guarded(absl::StrCat("HTTP ", request.method, " ", route->path),
                                [&] { response = route->handler(request); });
  if (!ok) {
    response = {500, "application/json",
                ErrorBody(500, "internal error while handling the request")};
  }
  writer->Send(response);
}

void HttpServer::Core::OnDirty(const std::shared_ptr<Connection>& c) {
  bool broken, finished, want_out, idle;
  {
    absl::MutexLock lock(&c->mu);
    if (c->closed) return;
    if (c->want_out) {
      c->want_out = false;
      c->FlushLocked();
    }
    broken = c->broken;
    want_out = c->want_out;
    finished = c->finished;
    idle = c->pending_locked() == 0;
  }
  if (broken) return Close(c);
  SetEvents(*c, want_out ? (c->events | EPOLLOUT) : (c->events & ~EPOLLOUT));
  if (finished && idle && c->phase == Connection::Phase::kHandling) ResponseDone(c);
}

void HttpServer::Core::ResponseDone(const std::shared_ptr<Connection>& c) {
  bool keep_alive;
  {
    absl::MutexLock lock(&c->mu);
    keep_alive = c->keep_alive;
    ++c->generation;  // writers of the finished response are done for
    c->started = false;
    c->finished = false;
    c->on_gone = nullptr;
  }
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
  }
  if (!keep_alive || c->peer_fin || stopping) return Linger(c);
  c->any_request = true;
  c->continue_sent = false;
  c->parser.Reset();
  c->phase = Connection::Phase::kReading;
  c->phase_since = util::Instant::Now();
  SetEvents(*c, EPOLLIN | EPOLLRDHUP);
  if (!c->in.empty()) Parse(c);  // a pipelined request
}

void HttpServer::Core::Refuse(const std::shared_ptr<Connection>& c, int status,
                              const std::string& message) {
  bool flush;
  {
    absl::MutexLock lock(&c->mu);
    c->keep_alive = false;
    c->started = true;
    c->finished = true;
    c->out += WholeResponse({status, "application/json", ErrorBody(status, message)}, false, false);
    flush = c->FlushLocked();
  }
  c->phase = Connection::Phase::kHandling;
  c->phase_since = util::Instant::Now();
  SetEvents(*c, 0);
  OnDirty(c);
  (void)flush;
}

void HttpServer::Core::Linger(const std::shared_ptr<Connection>& c) {
  // Half-close and read until the client closes too (or a short while): closing a socket
  // with unread input resets it, and the reset can destroy the response before the client
  // has read it.
  shutdown(c->fd, SHUT_WR);
  if (c->peer_fin) return Close(c);
  c->phase = Connection::Phase::kLingering;
  c->phase_since = util::Instant::Now();
  SetEvents(*c, EPOLLIN | EPOLLRDHUP);
}

void HttpServer::Core::Close(const std::shared_ptr<Connection>& c) {
  auto it = connections_.find(c->fd);
  if (it == connections_.end() || it->second != c) return;
  std::function<void()> on_gone;
  {
    absl::MutexLock lock(&c->mu);
    c->closed = true;
    if (!c->finished || c->pending_locked() > 0) on_gone = std::move(c->on_gone);
    c->on_gone = nullptr;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
    close(c->fd);
  }
  connections_.erase(it);
  num_connections_.fetch_sub(1);
  if (on_gone) util::Guarded("http client-gone callback", on_gone);
}

void HttpServer::Core::Sweep() {
  const util::Instant now = util::Instant::Now();
  std::vector<std::shared_ptr<Connection>> expired, timed_out;
  for (auto& [fd, c] : connections_) {
    switch (c->phase) {
      case Connection::Phase::kReading: {
        // A request under way must arrive within request_timeout (else 408); a connection
        // with nothing under way is closed quietly: a new one after request_timeout, a
        // kept-alive one after keep_alive_timeout.
        const bool partial = !c->in.empty() || c->parser.started();
        const absl::Duration limit =
            partial || !c->any_request ? options_.request_timeout : options_.keep_alive_timeout;
        if (now - c->phase_since > limit) (partial ? timed_out : expired).push_back(c);
        break;
      }
      case Connection::Phase::kHandling: {
        absl::MutexLock lock(&c->mu);
        if (c->pending_locked() > 0 && now - c->write_progress > options_.write_timeout) {
          expired.push_back(c);
        }
        break;
      }
      case Connection::Phase::kLingering:
        if (now - c->phase_since > kLingerTime) expired.push_back(c);
        break;
    }
  }
  for (const auto& c : expired) Close(c);
  for (const auto& c : timed_out) {
    Refuse(c, 408,
           absl::StrCat("the request did not arrive within ",
                        absl::FormatDuration(options_.request_timeout)));
  }
}

// ResponseWriter

ResponseWriter::ResponseWriter(std::shared_ptr<internal::Connection> connection,
                               uint64_t generation)
    : connection_(std::move(connection)), generation_(generation) {}

ResponseWriter::~ResponseWriter() {
  util::Guarded("http response writer", [&] {
    bool started;
    {
      absl::MutexLock lock(&connection_->mu);
      if (connection_->generation != generation_ || connection_->finished || connection_->closed) {
        return;
      }
      started = connection_->started;
    }
    if (started) {
      Finish();
    } else {
      Send({500, "application/json", ErrorBody(500, "the handler sent no response")});
    }
  });
}

namespace {

// Queues `bytes` on `c` for this writer's request; false when that is no longer possible.
bool Queue(internal::Connection& c, uint64_t generation, absl::string_view bytes, bool* dirty)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(c.mu) {
  if (c.generation != generation || c.closed || c.broken) return false;
  c.out.append(bytes.data(), bytes.size());
  if (c.pending_locked() > c.max_buffered) {
    c.broken = true;  // the client reads far too slowly: drop it
    *dirty = true;
    return false;
  }
  if (!c.want_out && c.FlushLocked()) *dirty = true;
  return !c.broken;
}

}  // namespace

bool ResponseWriter::Send(const Response& response) {
  bool dirty = true, ok;
  {
    internal::Connection& c = *connection_;
    absl::MutexLock lock(&c.mu);
    if (c.generation != generation_ || c.started || c.finished) return false;
    c.started = true;
    c.finished = true;
    ok = Queue(c, generation_, WholeResponse(response, c.keep_alive, c.head_only), &dirty);
  }
  if (auto core = connection_->core.lock()) core->MarkDirty(connection_);
  return ok;
}

bool ResponseWriter::Start(int status, absl::string_view content_type) {
  bool dirty = false, ok;
  {
    internal::Connection& c = *connection_;
    absl::MutexLock lock(&c.mu);
    if (c.generation != generation_ || c.started || c.finished) return false;
    c.started = true;
    // HTTP/1.0 has no chunked coding: the body then ends with the connection.
    if (c.minor_version_0 || c.head_only) c.keep_alive = false;
    const bool chunked = !c.minor_version_0 && !c.head_only;
    ok = Queue(c, generation_,
               Head(status, content_type,
                    chunked ? "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                            : "Cache-Control: no-cache\r\n",
                    c.keep_alive),
               &dirty);
  }
  if (dirty) {
    if (auto core = connection_->core.lock()) core->MarkDirty(connection_);
  }
  return ok;
}

bool ResponseWriter::Write(absl::string_view data) {
  bool dirty = false, ok;
  {
    internal::Connection& c = *connection_;
    absl::MutexLock lock(&c.mu);
    if (c.generation != generation_ || !c.started || c.finished) return false;
    if (c.closed || c.broken) return false;
    if (data.empty() || c.head_only) return true;  // an empty chunk would end the body
    ok = c.minor_version_0
             ? Queue(c, generation_, data, &dirty)
             : Queue(c, generation_, absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"),
                     &dirty);
  }
  if (dirty) {
    if (auto core = connection_->core.lock()) core->MarkDirty(connection_);
  }
  return ok;
}

void ResponseWriter::Finish() {
  bool dirty = true;
  {
    internal::Connection& c = *connection_;
    absl::MutexLock lock(&c.mu);
    if (c.generation != generation_ || !c.started || c.finished) return;
    c.finished = true;
    if (!c.head_only && !c.minor_version_0) Queue(c, generation_, "0\r\n\r\n", &dirty);
  }
  if (auto core = connection_->core.lock()) core->MarkDirty(connection_);
}

void ResponseWriter::OnClientGone(std::function<void()> fn) {
  {
    internal::Connection& c = *connection_;
    absl::MutexLock lock(&c.mu);
    if (c.generation != generation_) return;
    if (!c.closed && !c.broken) {
      c.on_gone = std::move(fn);
      return;
    }
  }
  util::Guarded("http client-gone callback", fn);
}

bool ResponseWriter::client_gone() const {
  internal::Connection& c = *connection_;
  absl::MutexLock lock(&c.mu);
  return c.closed || c.broken;
}

bool ResponseWriter::started() const {
  internal::Connection& c = *connection_;
  absl::MutexLock lock(&c.mu);
  return c.generation != generation_ || c.started;
}

// HttpServer

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const ServerOptions& options,
                                                              std::vector<Route> routes) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("http port ", options.port, " out of range"));
  }
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError("http server needs at least one thread");
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError("http server needs max_connections >= 1");
  }
  auto core = std::make_shared<Core>(options, std::move(routes));
  if (absl::Status s = core->Bind(); !s.ok()) return s;
  core->StartThreads();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(core)));
}

HttpServer::~HttpServer() { core_->Stop(); }

int HttpServer::port() const { return core_->port(); }

int HttpServer::num_connections() const { return core_->num_connections(); }

}  // namespace tandem::http
