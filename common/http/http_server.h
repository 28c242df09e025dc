// The embedded HTTP/1.1 server of every Tandem service: /metrics, /healthz, /readyz, and the
// gateway's OpenAI-compatible front. One event-loop thread (epoll) owns every connection;
// handlers run on a small pool of worker threads; a streaming response holds no thread at
// all: its writer is a thread-safe handle that any thread may write to later (an engine
// callback, a gRPC reactor), so thousands of concurrent streams cost memory, not threads.
//
// What callers may assume:
// - Handlers run on the worker threads, concurrently. A handler must not block for long (a
//   streaming one keeps its writer and returns); an exception that escapes it is caught,
//   logged, counted (util/guard.h) and answered with a 500.
// - Requests are parsed by RequestParser (request_parser.h) within ServerOptions' limits; a
//   malformed one is answered with a 4xx and an OpenAI-style JSON error body, and the server
//   keeps serving.
// - A client that leaves is noticed also while nothing is being written; a client that only
//   half-closes its connection (shutdown(SHUT_WR) after its request) is not taken for gone.
// - Once the HttpServer is destroyed, no handler is running, every connection is closed, and
//   writers still held elsewhere report the client gone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/http/request_parser.h"

namespace tandem::http {

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

using Handler = std::function<Response(const Request&)>;

namespace internal {
class Connection;
}

// How a streaming handler answers: either Send one whole response, or Start a response whose
// body follows piece by piece (chunked transfer coding), for server-sent events, then Finish.
// Thread-safe; any thread may call it at any time, also after the handler returned. A writer
// destroyed unfinished finishes the response (a 500 if nothing was sent yet).
class ResponseWriter {
 public:
  // Made by the server for each request.
  ResponseWriter(std::shared_ptr<internal::Connection> connection, uint64_t generation);
  ~ResponseWriter();
  ResponseWriter(const ResponseWriter&) = delete;
  ResponseWriter& operator=(const ResponseWriter&) = delete;

  // A whole response; only before Start. False when the client is gone.
  bool Send(const Response& response);
  // The status line and headers; the body follows in Write calls. Only once.
  bool Start(int status, absl::string_view content_type);
  // One piece of the body, sent at once (queued if the socket is full). False once the
  // client is gone, or when it reads so slowly that more than ServerOptions::
  // max_buffered_bytes wait (the connection is then closed).
  bool Write(absl::string_view data);
  // Ends a started body. Nothing may be written after it.
  void Finish();
  // Runs `fn` once if the client goes away before the response is finished (at once, on this
  // thread, if it already has; else on the server's loop thread). `fn` must be quick and must
  // not call back into this writer.
  void OnClientGone(std::function<void()> fn);
  bool client_gone() const;
  bool started() const;

 private:
  const std::shared_ptr<internal::Connection> connection_;
  // Which request on a kept-alive connection this writer answers: a writer kept past its
  // response never touches the next one.
  const uint64_t generation_;
};

using StreamHandler = std::function<void(const Request&, std::shared_ptr<ResponseWriter>)>;

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
  int num_threads = 4;              // worker threads that run handlers
  int max_connections = 8192;       // more are answered 503 and closed
  size_t max_body_bytes = 1 << 20;  // larger request bodies get 413
  size_t max_header_bytes = 64 << 10;
  // A request's line, headers and body must arrive within this (else 408).
  absl::Duration request_timeout = absl::Seconds(10);
  // An idle kept-alive connection is closed after this.
  absl::Duration keep_alive_timeout = absl::Seconds(5);
  // A client that reads nothing of a pending response for this long is dropped.
  absl::Duration write_timeout = absl::Seconds(30);
  size_t max_buffered_bytes = 8 << 20;  // per connection, waiting to be sent
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
  int port() const;
  // Connections open now.
  int num_connections() const;

  class Core;

 private:
  explicit HttpServer(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  std::shared_ptr<Core> core_;
};

// OpenAI's JSON error shape, {"error": {"message", "type", "param", "code"}}, with the type
// and code that go with `status`; the server's own refusals use it, and so does the gateway's
// front. `param`: the request field concerned, or empty. Text that is not valid UTF-8 is
// repaired (U+FFFD), so the body is always valid JSON.
// `code` replaces the status's default code (e.g. "model_not_found").
std::string ErrorBody(int status, absl::string_view message, absl::string_view param = "",
                      const char* code = nullptr);
const char* StatusText(int status);

}  // namespace tandem::http
