// An incremental HTTP/1.1 request parser (RFC 9112) for the embedded server: bytes in, one
// request out, or the status to refuse it with. Every byte is the client's and may be
// hostile: nothing here allocates more than the limits allow, and anything malformed is an
// error with a 4xx/5xx status and a message that says what was wrong, never a crash.
//
// Accepted: origin-form targets ("/path?query", percent-decoded into `path`) and "*";
// header fields without obsolete line folding; bodies by Content-Length or chunked transfer
// coding (extensions and trailers are read and ignored); CRLF or bare LF line ends. Refused:
// absolute-form and authority-form targets, a body both by length and chunked, conflicting
// lengths, transfer codings other than chunked (501), and anything over the limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace tandem::http {

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // percent-decoded, without the query string
  std::string query;   // raw query string, without '?'
  std::string body;
  // Names lower-cased; a repeated field's values are joined with ", " (RFC 9110 5.3).
  std::map<std::string, std::string> headers;
  int minor_version = 1;  // HTTP/1.x
};

struct ParserLimits {
  size_t max_request_line_bytes = 8 << 10;
  size_t max_header_bytes = 64 << 10;  // all field lines together (and the trailers)
  int max_headers = 128;
  size_t max_body_bytes = 1 << 20;
};

class RequestParser {
 public:
  enum class State { kNeedMore, kDone, kError };

  explicit RequestParser(const ParserLimits& limits) : limits_(limits) {}

  // Consumes a prefix of `data`; *consumed says how much. kDone: request() is complete and
  // bytes after it (a pipelined next request) were not consumed. kError: error_status() and
  // error_message() say why; the connection should be answered and closed.
  State Feed(absl::string_view data, size_t* consumed);

  State state() const { return state_; }
  // Whether any byte of a request has been taken in (a partial request is pending).
  bool started() const { return phase_ != Phase::kRequestLine || !line_.empty(); }
  // Once the header section is complete (also while the body is still being read).
  bool headers_done() const { return phase_ > Phase::kHeaders; }
  // The client waits for "100 Continue" before sending its body.
  bool expects_continue() const { return expects_continue_; }
  // Whether the connection may carry another request after this one.
  bool keep_alive() const { return keep_alive_; }
  const Request& request() const { return request_; }
  Request TakeRequest() { return std::move(request_); }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

  // Ready for the next request on the same connection.
  void Reset();

 private:
  enum class Phase {
    kRequestLine,
    kHeaders,
    kBody,          // Content-Length bytes
    kChunkSize,     // a chunk-size line
    kChunkData,     // chunk bytes
    kChunkDataEnd,  // the CRLF after a chunk
    kTrailers,
    kDone,
  };

  State Fail(int status, std::string message);
  // A complete line (without its line end) for the current line-based phase.
  State OnLine(absl::string_view line);
  State OnRequestLine(absl::string_view line);
  State OnHeaderLine(absl::string_view line);
  State OnHeadersDone();
  State OnChunkSizeLine(absl::string_view line);

  const ParserLimits limits_;
  State state_ = State::kNeedMore;
  Phase phase_ = Phase::kRequestLine;
  Request request_;
  std::string line_;         // a partial line carried between Feed calls
  size_t header_bytes_ = 0;  // field lines read so far (headers, then trailers)
  int num_headers_ = 0;
  uint64_t content_length_ = 0;
  bool chunked_ = false;
  uint64_t chunk_left_ = 0;
  bool expects_continue_ = false;
  bool keep_alive_ = true;
  int error_status_ = 0;
  std::string error_message_;
};

// Percent-decodes `in` into `out`; false on a malformed escape or an encoded NUL.
bool PercentDecode(absl::string_view in, std::string* out);

}  // namespace tandem::http
