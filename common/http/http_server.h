// A small embedded HTTP/1.1 server (civetweb underneath) for the services' observability
// endpoints and the gateway's OpenAI-compatible front.
//
// Callers may assume: handlers run on the server's worker threads, concurrently; the server
// has stopped, and no handler is running, once the HttpServer is destroyed. A streaming
// handler holds its worker thread for as long as it writes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct mg_context;
struct mg_connection;

namespace tandem::http {

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // without the query string
  std::string query;   // raw query string, without '?'
  std::string body;
  std::map<std::string, std::string> headers;  // names lower-cased
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

using Handler = std::function<Response(const Request&)>;

class ClientWatch;

// How a streaming handler answers: either Send one whole response, or Start a response whose
// body follows piece by piece (chunked transfer encoding), for server-sent events.
class ResponseWriter {
 public:
  // A whole response; only before Start. False when the client is gone.
  bool Send(const Response& response);
  // The status line and headers; the body follows in Write calls. Only once.
  bool Start(int status, absl::string_view content_type);
  // One piece of the body, sent at once. False once the client is gone (the rest is dropped).
  bool Write(absl::string_view data);
  bool started() const { return started_; }
  // Runs `fn` once, on the server's watch thread, if the client closes its connection before
  // the handler returns (also when nothing is being written, e.g. while a request waits for
  // its first token). `fn` must be quick and must not call back into this writer; it may run
  // until the server has seen the handler return, so what it captures must outlive that
  // (share it rather than point at the handler's locals).
  void OnClientGone(std::function<void()> fn);
  // True once a write failed or the watch saw the client close.
  bool client_gone() const;

 private:
  friend class HttpServer;
  ResponseWriter(mg_connection* conn, ClientWatch* watch) : conn_(conn), watch_(watch) {}
  mg_connection* const conn_;
  ClientWatch* const watch_;
  bool started_ = false;
  bool finished_ = false;
  bool failed_ = false;
  uint64_t watch_id_ = 0;
  std::shared_ptr<std::atomic<bool>> gone_ = std::make_shared<std::atomic<bool>>(false);
};

using StreamHandler = std::function<void(const Request&, ResponseWriter*)>;

struct Route {
  std::string path;  // exact path, e.g. "/metrics"
  Handler handler;
  // Instead of `handler`: answers through a ResponseWriter (server-sent events, or a request
  // that must notice its client leaving).
  StreamHandler stream_handler = nullptr;
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                     // 0: an ephemeral port, see HttpServer::port()
  int num_threads = 4;              // at most this many requests are handled at once; more wait
  size_t max_body_bytes = 1 << 20;  // larger request bodies get 413
  int request_timeout_ms = 10000;
};

class HttpServer {
 public:
  // Binds and starts serving `routes`; unknown paths get 404.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const ServerOptions& options,
                                                           std::vector<Route> routes);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound port (the ephemeral one when options.port was 0).
  int port() const { return port_; }

 private:
  HttpServer(ServerOptions options, std::vector<Route> routes);
  static int Dispatch(mg_connection* conn, void* self);

  const ServerOptions options_;
  const std::vector<Route> routes_;
  std::unique_ptr<ClientWatch> watch_;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
};

// Minimal client for tests and health checks: one GET or POST with a deadline.
struct ClientResponse {
  int status = 0;
  std::string body;
};
absl::StatusOr<ClientResponse> Fetch(const std::string& host, int port, const std::string& method,
                                     const std::string& path, const std::string& body = "",
                                     int timeout_ms = 5000);

}  // namespace tandem::http
