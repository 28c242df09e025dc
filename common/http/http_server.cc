#include "common/http/http_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace tandem::http {
namespace {

std::once_flag g_init_once;

const char* StatusText(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Status";
  }
}

// False when the client is gone.
bool WriteResponse(mg_connection* conn, const Response& response) {
  const std::string head =
      absl::StrCat("HTTP/1.1 ", response.status, " ", StatusText(response.status), "\r\n",
                   "Content-Type: ", response.content_type, "\r\n",
                   "Content-Length: ", response.body.size(), "\r\n", "Connection: close\r\n\r\n");
  if (mg_write(conn, head.data(), head.size()) != static_cast<int>(head.size())) return false;
  return response.body.empty() || mg_write(conn, response.body.data(), response.body.size()) ==
                                      static_cast<int>(response.body.size());
}

// The port of a socket address, and its address as text (IPv4-mapped IPv6 as IPv4).
bool Endpoint(const sockaddr_storage& addr, std::string* host, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(addr);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof(text));
    *port = ntohs(in.sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      inet_ntop(AF_INET, &in6.sin6_addr.s6_addr[12], text, sizeof(text));
    } else {
      inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
    }
    *port = ntohs(in6.sin6_port);
  } else {
    return false;
  }
  *host = text;
  return true;
}

// The server's own refusals (no such path, body too large), in the JSON error shape of
// OpenAI's API, which the gateway's front speaks and other clients read as well as text.
Response ServerError(int status, const std::string& message) {
  const nlohmann::json error = {{"error",
                                 {{"message", message},
                                  {"type", "invalid_request_error"},
                                  {"param", nullptr},
                                  {"code", nullptr}}}};
  return {status, "application/json", error.dump()};
}

}  // namespace

// Watches the sockets of requests whose handlers asked to hear of their client leaving, on a
// thread of its own (started by the first watch) that polls them every 50 ms. civetweb 1.15
// does not expose a connection's socket, so FindSocket finds it by its addresses: the
// descriptor whose local port is the server's and whose peer is the request's remote address
// and port (Linux: /proc/self/fd). Keep-alive is off and the body has been read, so a
// readable socket means the client closed it.
class ClientWatch {
 public:
  ~ClientWatch() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  // The request's socket, or -1 when it cannot be found.
  static int FindSocket(const mg_request_info& info) {
    DIR* dir = opendir("/proc/self/fd");
    if (dir == nullptr) return -1;
    int found = -1;
    while (dirent* entry = readdir(dir)) {
      char* end = nullptr;
      const long fd = std::strtol(entry->d_name, &end, 10);
      if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
      sockaddr_storage local{}, peer{};
      socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
      std::string local_host, peer_host;
      int local_port = 0, peer_port = 0;
      if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
          getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
          !Endpoint(local, &local_host, &local_port) || !Endpoint(peer, &peer_host, &peer_port)) {
        continue;
      }
      if (local_port == info.server_port && peer_port == info.remote_port &&
          peer_host == info.remote_addr) {
        found = static_cast<int>(fd);
        break;
      }
    }
    closedir(dir);
    return found;
  }

  // Watches `fd`; returns the watch's id for Remove.
  uint64_t Add(int fd, std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_id_++;
    watches_[id] = {fd, std::move(fn)};
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    return id;
  }

  // Once it returns, the watch's function is not running and will not run.
  void Remove(uint64_t id) {
    absl::MutexLock lock(&mu_);
    watches_.erase(id);
  }

 private:
  struct Watch {
    int fd = -1;
    std::function<void()> fn;
  };

  void Loop() {
    std::vector<pollfd> fds;
    std::vector<uint64_t> ids;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
        if (mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Milliseconds(50))) return;
        fds.clear();
        ids.clear();
        for (const auto& [id, watch] : watches_) {
          fds.push_back({watch.fd, POLLIN | POLLRDHUP, 0});
          ids.push_back(id);
        }
      }
      if (fds.empty() || poll(fds.data(), fds.size(), 0) <= 0) continue;
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto watch = watches_.find(ids[i]);
        if (watch == watches_.end()) continue;  // done meanwhile; the fd may be another's now
        char byte;
        const ssize_t got = recv(watch->second.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        const bool closed = (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0 || got == 0 ||
                            (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
        if (!closed && got > 0) {
          watches_.erase(watch);  // the client sent more: no longer a sign of anything
          continue;
        }
        if (closed) {
          watch->second.fn();
          watches_.erase(watch);
        }
      }
    }
  }

  absl::Mutex mu_;
  std::map<uint64_t, Watch> watches_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

bool ResponseWriter::Send(const Response& response) {
  if (started_ || finished_) return false;
  finished_ = true;
  if (!WriteResponse(conn_, response)) failed_ = true;
  return !client_gone();
}

bool ResponseWriter::Start(int status, absl::string_view content_type) {
  if (started_ || finished_) return false;
  started_ = true;
  const std::string head = absl::StrCat(
      "HTTP/1.1 ", status, " ", StatusText(status), "\r\n", "Content-Type: ", content_type,
      "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
  if (mg_write(conn_, head.data(), head.size()) != static_cast<int>(head.size())) failed_ = true;
  return !client_gone();
}

bool ResponseWriter::Write(absl::string_view data) {
  if (!started_ || finished_ || client_gone()) return false;
  if (data.empty()) return true;  // an empty chunk would end the body
  if (mg_send_chunk(conn_, data.data(), static_cast<unsigned int>(data.size())) <= 0) {
    failed_ = true;
  }
  return !client_gone();
}

void ResponseWriter::OnClientGone(std::function<void()> fn) {
  if (watch_id_ != 0) return;
  const int fd = ClientWatch::FindSocket(*mg_get_request_info(conn_));
  if (fd < 0) return;  // not found: only failed writes will tell
  watch_id_ = watch_->Add(fd, [gone = gone_, fn = std::move(fn)] {
    gone->store(true);
    fn();
  });
}

bool ResponseWriter::client_gone() const { return failed_ || gone_->load(); }

HttpServer::HttpServer(ServerOptions options, std::vector<Route> routes)
    : options_(std::move(options)),
      routes_(std::move(routes)),
      watch_(std::make_unique<ClientWatch>()) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const ServerOptions& options,
                                                              std::vector<Route> routes) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("http port ", options.port, " out of range"));
  }
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError("http server needs at least one thread");
  }
  std::call_once(g_init_once, [] { mg_init_library(0); });
  std::unique_ptr<HttpServer> server(new HttpServer(options, std::move(routes)));
  const std::string ports = absl::StrCat(options.host, ":", options.port);
  const std::string threads = absl::StrCat(options.num_threads);
  const std::string timeout = absl::StrCat(options.request_timeout_ms);
  const char* mg_options[] = {
      "listening_ports", ports.c_str(),       "num_threads", threads.c_str(), "request_timeout_ms",
      timeout.c_str(),   "enable_keep_alive", "no",          nullptr};
  mg_callbacks callbacks{};
  server->ctx_ = mg_start(&callbacks, server.get(), mg_options);
  if (server->ctx_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ", ports));
  }
  mg_set_request_handler(server->ctx_, "/", &HttpServer::Dispatch, server.get());
  mg_server_port bound[4] = {};
  const int n = mg_get_server_ports(server->ctx_, 4, bound);
  if (n < 1 || bound[0].port <= 0) {
    return absl::InternalError("HTTP server started but reports no bound port");
  }
  server->port_ = bound[0].port;
  return server;
}

HttpServer::~HttpServer() {
  if (ctx_ != nullptr) mg_stop(ctx_);  // waits for the handlers, which end their watches
}

int HttpServer::Dispatch(mg_connection* conn, void* self_ptr) {
  auto* self = static_cast<HttpServer*>(self_ptr);
  const mg_request_info* info = mg_get_request_info(conn);
  Request request;
  request.method = info->request_method ? info->request_method : "";
  request.path = info->local_uri ? info->local_uri : "/";
  request.query = info->query_string ? info->query_string : "";
  for (int i = 0; i < info->num_headers; ++i) {
    request.headers[absl::AsciiStrToLower(info->http_headers[i].name)] =
        info->http_headers[i].value;
  }
  if (info->content_length > static_cast<long long>(self->options_.max_body_bytes)) {
    WriteResponse(conn, ServerError(413, absl::StrCat("request body larger than ",
                                                      self->options_.max_body_bytes, " bytes")));
    return 413;
  }
  char buffer[16384];
  while (true) {
    const int got = mg_read(conn, buffer, sizeof(buffer));
    if (got <= 0) break;
    request.body.append(buffer, got);
    if (request.body.size() > self->options_.max_body_bytes) {
      WriteResponse(conn, ServerError(413, absl::StrCat("request body larger than ",
                                                        self->options_.max_body_bytes, " bytes")));
      return 413;
    }
  }
  auto route = std::find_if(self->routes_.begin(), self->routes_.end(),
                            [&](const Route& r) { return r.path == request.path; });
  Response response;
  if (route == self->routes_.end()) {
    response = ServerError(404, absl::StrCat("no such path: ", request.path));
  } else if (route->stream_handler) {
    ResponseWriter writer(conn, self->watch_.get());
    route->stream_handler(request, &writer);
    if (writer.watch_id_ != 0) self->watch_->Remove(writer.watch_id_);
    if (writer.started_) {
      if (!writer.client_gone()) mg_send_chunk(conn, "", 0);  // the last chunk
      return 200;
    }
    if (writer.finished_) return 200;
    response = {500, "text/plain; charset=utf-8", "the handler sent no response\n"};
  } else {
    response = route->handler(request);
  }
  WriteResponse(conn, response);
  return response.status;
}

absl::StatusOr<ClientResponse> Fetch(const std::string& host, int port, const std::string& method,
                                     const std::string& path, const std::string& body,
                                     int timeout_ms) {
  std::call_once(g_init_once, [] { mg_init_library(0); });
  char error[256] = {};
  mg_connection* conn = mg_connect_client(host.c_str(), port, /*use_ssl=*/0, error, sizeof(error));
  if (conn == nullptr) {
    return absl::UnavailableError(absl::StrCat("connect to ", host, ":", port, ": ", error));
  }
  const std::string request =
      absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: ", host, ":", port,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
  mg_write(conn, request.data(), request.size());
  const int rc = mg_get_response(conn, error, sizeof(error), timeout_ms);
  if (rc < 0) {
    mg_close_connection(conn);
    return absl::DeadlineExceededError(
        absl::StrCat(method, " ", path, " on ", host, ":", port, ": ", error));
  }
  ClientResponse response;
  response.status = mg_get_response_info(conn)->status_code;
  char buffer[16384];
  while (true) {
    const int got = mg_read(conn, buffer, sizeof(buffer));
    if (got <= 0) break;
    response.body.append(buffer, got);
  }
  mg_close_connection(conn);
  return response;
}

}  // namespace tandem::http
