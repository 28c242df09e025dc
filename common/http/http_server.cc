#include "common/http/http_server.h"

#include <civetweb.h>

#include <algorithm>
#include <cctype>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

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
    default:
      return "Status";
  }
}

void WriteResponse(mg_connection* conn, const Response& response) {
  const std::string head =
      absl::StrCat("HTTP/1.1 ", response.status, " ", StatusText(response.status), "\r\n",
                   "Content-Type: ", response.content_type, "\r\n",
                   "Content-Length: ", response.body.size(), "\r\n", "Connection: close\r\n\r\n");
  mg_write(conn, head.data(), head.size());
  if (!response.body.empty()) mg_write(conn, response.body.data(), response.body.size());
}

}  // namespace

HttpServer::HttpServer(ServerOptions options, std::vector<Route> routes)
    : options_(std::move(options)), routes_(std::move(routes)) {}

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
  if (ctx_ != nullptr) mg_stop(ctx_);
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
    WriteResponse(conn, {413, "text/plain; charset=utf-8",
                         absl::StrCat("request body larger than ", self->options_.max_body_bytes,
                                      " bytes\n")});
    return 413;
  }
  char buffer[16384];
  while (true) {
    const int got = mg_read(conn, buffer, sizeof(buffer));
    if (got <= 0) break;
    request.body.append(buffer, got);
    if (request.body.size() > self->options_.max_body_bytes) {
      WriteResponse(conn, {413, "text/plain; charset=utf-8", "request body too large\n"});
      return 413;
    }
  }
  auto route = std::find_if(self->routes_.begin(), self->routes_.end(),
                            [&](const Route& r) { return r.path == request.path; });
  Response response;
  if (route == self->routes_.end()) {
    response = {404, "text/plain; charset=utf-8",
                absl::StrCat("no such path: ", request.path, "\n")};
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
