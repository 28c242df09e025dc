#include "common/http/request_parser.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem::http {
namespace {

// RFC 9110 5.6.2: token characters.
bool IsTokenChar(unsigned char c) {
  if (absl::ascii_isalnum(c)) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// Field values: visible characters, spaces, tabs and obs-text; no other control characters.
bool IsFieldValue(absl::string_view s) {
  for (unsigned char c : s) {
    if (c < 0x20 && c != '\t') return false;
    if (c == 0x7f) return false;
  }
  return true;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A chunk-size is at most 16 hex digits here (a larger one exceeds any body limit anyway).
constexpr size_t kMaxChunkSizeDigits = 16;

}  // namespace

bool PercentDecode(absl::string_view in, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    const int hi = HexDigit(in[i + 1]);
    const int lo = HexDigit(in[i + 2]);
    if (hi < 0 || lo < 0) return false;
    const char c = static_cast<char>(hi * 16 + lo);
    if (c == '\0') return false;
    out->push_back(c);
    i += 2;
  }
  return true;
}

void RequestParser::Reset() {
  state_ = State::kNeedMore;
  phase_ = Phase::kRequestLine;
  request_ = Request();
  line_.clear();
  header_bytes_ = 0;
  num_headers_ = 0;
  content_length_ = 0;
  chunked_ = false;
  chunk_left_ = 0;
  expects_continue_ = false;
  keep_alive_ = true;
  error_status_ = 0;
  error_message_.clear();
}

RequestParser::State RequestParser::Fail(int status, std::string message) {
  state_ = State::kError;
  error_status_ = status;
  error_message_ = std::move(message);
  keep_alive_ = false;
  return state_;
}

RequestParser::State RequestParser::Feed(absl::string_view data, size_t* consumed) {
  *consumed = 0;
  if (state_ != State::kNeedMore) return state_;
  while (*consumed < data.size() && state_ == State::kNeedMore) {
    absl::string_view rest = data.substr(*consumed);
    switch (phase_) {
      case Phase::kBody: {
        const size_t take = static_cast<size_t>(
            std::min<uint64_t>(rest.size(), content_length_ - request_.body.size()));
        request_.body.append(rest.data(), take);
        *consumed += take;
        if (request_.body.size() == content_length_) {
          phase_ = Phase::kDone;
          state_ = State::kDone;
        }
        break;
      }
      case Phase::kChunkData: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(rest.size(), chunk_left_));
        request_.body.append(rest.data(), take);
        chunk_left_ -= take;
        *consumed += take;
        if (chunk_left_ == 0) phase_ = Phase::kChunkDataEnd;
        break;
      }
      default: {
        // Line-based phases: collect up to the line end.
        const size_t nl = rest.find('\n');
        const size_t limit = phase_ == Phase::kRequestLine ? limits_.max_request_line_bytes
                                                           : limits_.max_header_bytes;
        const size_t piece = nl == absl::string_view::npos ? rest.size() : nl + 1;
        if (line_.size() + piece > limit + 2) {
          if (phase_ == Phase::kRequestLine) {
            return Fail(414, absl::StrCat("the request line is longer than ", limit, " bytes"));
          }
          if (phase_ == Phase::kChunkSize || phase_ == Phase::kChunkDataEnd) {
            return Fail(400, "a malformed chunk-size line");
          }
          return Fail(431, absl::StrCat("the header section is larger than ", limit, " bytes"));
        }
        line_.append(rest.data(), piece);
        *consumed += piece;
        if (nl == absl::string_view::npos) break;  // need more
        absl::string_view line(line_);
        line.remove_suffix(1);  // '\n'
        if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
        if (line.find('\r') != absl::string_view::npos) {
          return Fail(400, "a bare CR inside a line");
        }
        const std::string copy(line);
        line_.clear();
        if (OnLine(copy) == State::kError) return state_;
        break;
      }
    }
  }
  return state_;
}

RequestParser::State RequestParser::OnLine(absl::string_view line) {
  switch (phase_) {
    case Phase::kRequestLine:
      // RFC 9112 2.2: empty lines before the request line are ignored (at most a few).
      if (line.empty()) {
        if (++num_headers_ > 4) return Fail(400, "empty lines instead of a request line");
        return state_;
      }
      num_headers_ = 0;
      return OnRequestLine(line);
    case Phase::kHeaders:
    case Phase::kTrailers:
      return OnHeaderLine(line);
    case Phase::kChunkSize:
      return OnChunkSizeLine(line);
    case Phase::kChunkDataEnd:
      if (!line.empty()) return Fail(400, "chunk data longer than its chunk-size");
      phase_ = Phase::kChunkSize;
      return state_;
    default:
      return Fail(500, "parser in an impossible phase");
  }
}

RequestParser::State RequestParser::OnRequestLine(absl::string_view line) {
  std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3) {
    return Fail(400, "the request line is not METHOD SP TARGET SP HTTP-VERSION");
  }
  if (!IsToken(parts[0])) return Fail(400, "the method is not a token");
  if (parts[2] == "HTTP/1.1") {
    request_.minor_version = 1;
  } else if (parts[2] == "HTTP/1.0") {
    request_.minor_version = 0;
    keep_alive_ = false;
  } else if (absl::StartsWith(parts[2], "HTTP/")) {
    return Fail(505, absl::StrCat("HTTP version ", absl::CEscape(parts[2]), " is not supported"));
  } else {
    return Fail(400, "the request line does not end in an HTTP version");
  }
  request_.method = std::string(parts[0]);
  absl::string_view target = parts[1];
  for (unsigned char c : target) {
    if (c <= 0x20 || c >= 0x7f) return Fail(400, "the request target has a byte outside ASCII");
  }
  if (target == "*") {
    request_.path.assign(1, '*');  // (not = "*": GCC 12 warns falsely of overlap)
  } else if (absl::StartsWith(target, "/")) {
    const size_t q = target.find('?');
    const absl::string_view raw_path = target.substr(0, q);
    if (q != absl::string_view::npos) request_.query = std::string(target.substr(q + 1));
    if (!PercentDecode(raw_path, &request_.path)) {
      return Fail(400, "the request path has a malformed percent-escape");
    }
  } else {
    return Fail(400, "the request target must be a path starting with '/'");
  }
  phase_ = Phase::kHeaders;
  return state_;
}

RequestParser::State RequestParser::OnHeaderLine(absl::string_view line) {
  if (line.empty()) {
    if (phase_ == Phase::kTrailers) {
      phase_ = Phase::kDone;
      state_ = State::kDone;
      return state_;
    }
    return OnHeadersDone();
  }
  header_bytes_ += line.size() + 2;
  if (header_bytes_ > limits_.max_header_bytes) {
    return Fail(431, absl::StrCat("the header section is larger than ", limits_.max_header_bytes,
                                  " bytes"));
  }
  if (++num_headers_ > limits_.max_headers) {
    return Fail(431, absl::StrCat("more than ", limits_.max_headers, " header fields"));
  }
  if (line[0] == ' ' || line[0] == '\t') {
    return Fail(400, "obsolete line folding in a header field");
  }
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return Fail(400, "a header field without a colon");
  const absl::string_view name = line.substr(0, colon);
  if (!IsToken(name)) return Fail(400, "a header field name is not a token");
  const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
  if (!IsFieldValue(value)) return Fail(400, "a header field value has a control character");
  if (phase_ == Phase::kTrailers) return state_;  // trailers are read and dropped
  const std::string key = absl::AsciiStrToLower(name);
  auto [it, inserted] = request_.headers.emplace(key, std::string(value));
  if (!inserted) {
    if (key == "content-length") {
      if (it->second != value) return Fail(400, "conflicting Content-Length fields");
    } else {
      absl::StrAppend(&it->second, ", ", value);
    }
  }
  return state_;
}

RequestParser::State RequestParser::OnHeadersDone() {
  const auto& h = request_.headers;
  if (auto it = h.find("connection"); it != h.end()) {
    for (absl::string_view option : absl::StrSplit(it->second, ',')) {
      const std::string o = absl::AsciiStrToLower(absl::StripAsciiWhitespace(option));
      if (o == "close") keep_alive_ = false;
      if (o == "keep-alive" && request_.minor_version == 0) keep_alive_ = true;
    }
  }
  if (auto it = h.find("expect"); it != h.end()) {
    if (!absl::EqualsIgnoreCase(it->second, "100-continue")) {
      return Fail(417, absl::StrCat("Expect: ", absl::CEscape(it->second), " is not supported"));
    }
    expects_continue_ = request_.minor_version == 1;
  }
  const auto te = h.find("transfer-encoding");
  const auto cl = h.find("content-length");
  if (te != h.end()) {
    if (request_.minor_version == 0) return Fail(400, "Transfer-Encoding in an HTTP/1.0 request");
    if (cl != h.end()) return Fail(400, "both Content-Length and Transfer-Encoding");
    if (!absl::EqualsIgnoreCase(te->second, "chunked")) {
      return Fail(501, absl::StrCat("Transfer-Encoding: ", absl::CEscape(te->second),
                                    " is not supported (only chunked)"));
    }
    chunked_ = true;
    phase_ = Phase::kChunkSize;
    header_bytes_ = 0;
    return state_;
  }
  if (cl != h.end()) {
    const absl::string_view text = cl->second;
    if (text.empty() || text.size() > 19 ||
        !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        !absl::SimpleAtoi(text, &content_length_)) {
      return Fail(400, "Content-Length is not a decimal number");
    }
    if (content_length_ > limits_.max_body_bytes) {
      return Fail(413, absl::StrCat("the request body (", content_length_,
                                    " bytes) is larger than ", limits_.max_body_bytes, " bytes"));
    }
  }
  if (content_length_ == 0) {
    phase_ = Phase::kDone;
    state_ = State::kDone;
    return state_;
  }
  request_.body.reserve(static_cast<size_t>(content_length_));
  phase_ = Phase::kBody;
  return state_;
}

RequestParser::State RequestParser::OnChunkSizeLine(absl::string_view line) {
  absl::string_view size = line.substr(0, line.find(';'));  // chunk extensions are ignored
  size = absl::StripTrailingAsciiWhitespace(size);
  if (size.empty() || size.size() > kMaxChunkSizeDigits) {
    return Fail(400, "a malformed chunk-size line");
  }
  uint64_t n = 0;
  for (char c : size) {
    const int d = HexDigit(c);
    if (d < 0) return Fail(400, "a malformed chunk-size line");
    n = n * 16 + static_cast<uint64_t>(d);
  }
  if (n > limits_.max_body_bytes || request_.body.size() + n > limits_.max_body_bytes) {
    return Fail(413,
                absl::StrCat("the request body is larger than ", limits_.max_body_bytes, " bytes"));
  }
  if (n == 0) {
    phase_ = Phase::kTrailers;
    return state_;
  }
  chunk_left_ = n;
  phase_ = Phase::kChunkData;
  return state_;
}

}  // namespace tandem::http
