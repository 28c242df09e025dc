// The HTTP server's request parser (common/http/request_parser.h) on arbitrary bytes, fed in
// arbitrary pieces, pipelined requests included: it never crashes, never consumes more than it
// was given, answers every malformed request with an error status, and parses the same bytes
// the same way however they are split.
// Input: one byte for the piece size, then the bytes a client sends.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/http/request_parser.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tandem::http::ParserLimits;
using tandem::http::Request;
using tandem::http::RequestParser;

struct Outcome {
  RequestParser::State state;
  Request request;
  int status = 0;
  size_t consumed = 0;
};

// Parses requests from `bytes` (pieces of `piece` bytes; 0: all at once) until one is not
// complete; the outcome of each.
std::vector<Outcome> ParseAll(std::string_view bytes, size_t piece, const ParserLimits& limits) {
  std::vector<Outcome> outcomes;
  RequestParser parser(limits);
  std::string pending;
  size_t fed = 0, total_consumed = 0;
  while (outcomes.size() < 8) {
    if (fed < bytes.size()) {
      const size_t n = piece == 0 ? bytes.size() - fed : std::min(piece, bytes.size() - fed);
      pending.append(bytes.substr(fed, n));
      fed += n;
    }
    size_t consumed = 0;
    const RequestParser::State state = parser.Feed(pending, &consumed);
    FUZZ_CHECK(consumed <= pending.size());
    pending.erase(0, consumed);
    total_consumed += consumed;
    if (state == RequestParser::State::kNeedMore) {
      if (fed == bytes.size()) break;  // the client has sent everything
      continue;
    }
    Outcome out{state, {}, parser.error_status(), total_consumed};
    if (state == RequestParser::State::kError) {
      FUZZ_CHECK(out.status >= 400 && out.status < 600);
      FUZZ_CHECK(!parser.error_message().empty());
      FUZZ_CHECK(!parser.keep_alive());
      outcomes.push_back(std::move(out));
      break;
    }
    out.request = parser.TakeRequest();
    FUZZ_CHECK(out.request.body.size() <= limits.max_body_bytes);
    FUZZ_CHECK(!out.request.method.empty());
    outcomes.push_back(std::move(out));
    parser.Reset();
  }
  return outcomes;
}

// How much of a malformed request was consumed depends on where the pieces fell (the parser
// may hold a partial line before it sees it is too long), and means nothing: the server answers
// the error and closes the connection.
bool Same(const Outcome& a, const Outcome& b) {
  const bool same_consumed = a.state == RequestParser::State::kError || a.consumed == b.consumed;
  return a.state == b.state && a.status == b.status && same_consumed &&
         a.request.method == b.request.method && a.request.path == b.request.path &&
         a.request.query == b.request.query && a.request.body == b.request.body &&
         a.request.headers == b.request.headers &&
         a.request.minor_version == b.request.minor_version;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = data[0] % 17;  // 0: whole
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  ParserLimits limits;
  limits.max_body_bytes = 4096;
  limits.max_header_bytes = 2048;
  limits.max_request_line_bytes = 512;
  limits.max_headers = 16;
  const std::vector<Outcome> split = ParseAll(bytes, piece, limits);
  const std::vector<Outcome> whole = ParseAll(bytes, 0, limits);
  FUZZ_CHECK(split.size() == whole.size());
  for (size_t i = 0; i < split.size(); ++i) FUZZ_CHECK(Same(split[i], whole[i]));
  return 0;
}
