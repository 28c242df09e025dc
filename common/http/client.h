// A minimal blocking HTTP/1.1 client for health checks and tests: one request per
// connection, a deadline on the whole exchange.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace tandem::http {

struct ClientResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// Sends `method path` with `body` to host:port and reads the whole response (interim 1xx
// responses skipped; the body by Content-Length, chunked coding, or until close).
// UNAVAILABLE when it cannot connect, DEADLINE_EXCEEDED past `timeout_ms`, DATA_LOSS for a
// malformed response.
absl::StatusOr<ClientResponse> Fetch(const std::string& host, int port, const std::string& method,
                                     const std::string& path, const std::string& body = "",
                                     int timeout_ms = 5000);

}  // namespace tandem::http
