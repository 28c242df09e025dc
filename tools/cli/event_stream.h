// A client for server-sent events over HTTP/1.1 (what an OpenAI-compatible server streams),
// built from pure pieces that accept bytes split anywhere: an SSE event parser, a chunked
// transfer-encoding decoder and a response-head parser; PostEventStream joins them over a
// POSIX socket, every wait bounded by one deadline. Used by `tandem bench serve --backend http`.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/util/clock.h"

namespace tandem::cli {

// Server-sent events (the WHATWG event-stream format): lines end in LF, CRLF or CR; "data:"
// lines accumulate (joined by LF) until a blank line dispatches the event; comments (":...")
// and the other fields (event, id, retry) are ignored. Feed it the stream in pieces of any size.
class SseParser {
 public:
  // Appends the data of every event completed by `bytes` to `events`, in order.
  void Feed(absl::string_view bytes, std::vector<std::string>* events);

 private:
  void Line(absl::string_view line, std::vector<std::string>* events);

  std::string pending_;  // an unfinished line
  std::string data_;     // the current event's data lines, each followed by LF
  bool has_data_ = false;
  bool after_cr_ = false;  // the last byte seen was a CR (an LF next belongs to it)
};

// HTTP/1.1 chunked transfer coding (RFC 9112 section 7.1): "SIZE-IN-HEX[;ext]\r\n" DATA "\r\n"
// ..., ended by a zero-size chunk and optional trailer lines. Lines may end in a bare LF.
class ChunkedDecoder {
 public:
  // Appends the payload in `bytes` to `out`. INVALID_ARGUMENT on malformed framing (then the
  // decoder must not be fed again). Bytes after the last chunk's trailers are ignored.
  absl::Status Feed(absl::string_view bytes, std::string* out);
  // The zero-size chunk and its trailers have been read.
  bool done() const { return state_ == State::kDone; }

 private:
  enum class State { kSize, kData, kDataEnd, kTrailer, kDone };
  State state_ = State::kSize;
  std::string line_;
  uint64_t remaining_ = 0;
};

struct ResponseHead {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased, values trimmed
};

// Parses a response's status line and headers: `head` is everything before the blank line
// (the final CRLF CRLF may be included or not).
absl::StatusOr<ResponseHead> ParseResponseHead(absl::string_view head);

struct HostPort {
  std::string host;  // a name, an IPv4 address or an IPv6 address (without brackets)
  int port = 0;
};
// "host:port" or "[v6addr]:port".
absl::StatusOr<HostPort> ParseHostPort(absl::string_view endpoint);

// POSTs `json_body` to `path` on `endpoint` (one connection, "Connection: close") and reads
// the response as an event stream: calls `on_event` with each event's data as it arrives;
// `on_event` returns false to stop reading (e.g. after "[DONE]"), which ends the call OK.
// Errors: DEADLINE_EXCEEDED when `deadline` passes first; UNAVAILABLE when the connection
// fails or closes before the stream ends; for a non-200 status, an error carrying the status
// and the body's "error"."message" (or the body itself); INVALID_ARGUMENT for a 200 that is
// not text/event-stream or has malformed framing. The stream ending (end of body) without
// `on_event` returning false is OK.
absl::Status PostEventStream(const HostPort& endpoint, const std::string& path,
                             const std::string& json_body, util::Instant deadline,
                             const std::function<bool(absl::string_view data)>& on_event);

}  // namespace tandem::cli
