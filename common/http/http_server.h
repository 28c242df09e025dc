// A small embedded HTTP/1.1 server (civetweb underneath) for the services' observability
// endpoints and, later, the gateway's OpenAI-compatible front.
//
// Callers may assume: handlers run on the server's worker threads, concurrently; the server
// has stopped, and no handler is running, once the HttpServer is destroyed.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

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

struct Route {
  std::string path;  // exact path, e.g. "/metrics"
  Handler handler;
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: an ephemeral port, see HttpServer::port()
  int num_threads = 4;
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
