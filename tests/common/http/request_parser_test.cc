#include "common/http/request_parser.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace tandem::http {
namespace {

using ::testing::HasSubstr;

struct Parsed {
  RequestParser::State state;
  Request request;
  int status = 0;
  std::string message;
  size_t consumed = 0;
  bool keep_alive = false;
};

Parsed ParseAll(const std::string& bytes, ParserLimits limits = {}) {
  RequestParser parser(limits);
  Parsed out;
  out.state = parser.Feed(bytes, &out.consumed);
  out.status = parser.error_status();
  out.message = parser.error_message();
  out.keep_alive = parser.keep_alive();
  if (out.state == RequestParser::State::kDone) out.request = parser.TakeRequest();
  return out;
}

TEST(RequestParserTest, ParsesAGetWithQueryAndHeaders) {
  const Parsed p =
      ParseAll("GET /v1/models?x=1&y=%20 HTTP/1.1\r\nHost: a\r\nX-Two: 1\r\nx-two: 2\r\n\r\n");
  ASSERT_EQ(p.state, RequestParser::State::kDone) << p.message;
  EXPECT_EQ(p.request.method, "GET");
  EXPECT_EQ(p.request.path, "/v1/models");
  EXPECT_EQ(p.request.query, "x=1&y=%20");
  EXPECT_EQ(p.request.headers.at("host"), "a");
  EXPECT_EQ(p.request.headers.at("x-two"), "1, 2");
  EXPECT_TRUE(p.keep_alive);
}

TEST(RequestParserTest, PercentDecodesThePathAndKeepsInvalidUtf8AsBytes) {
  const Parsed p = ParseAll("GET /a%2Fb%FF HTTP/1.1\r\n\r\n");
  ASSERT_EQ(p.state, RequestParser::State::kDone);
  EXPECT_EQ(p.request.path, "/a/b\xff");
}

TEST(RequestParserTest, BodyByContentLengthAndChunkedCoding) {
  Parsed p = ParseAll("POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET");
  ASSERT_EQ(p.state, RequestParser::State::kDone);
  EXPECT_EQ(p.request.body, "hello");
  EXPECT_EQ(p.consumed, std::string("POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello").size());
  p = ParseAll(
      "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\n"
      "Trailer: t\r\n\r\n");
  ASSERT_EQ(p.state, RequestParser::State::kDone) << p.message;
  EXPECT_EQ(p.request.body, "abcde");
}

TEST(RequestParserTest, SameRequestWhicheverWayTheBytesAreSplit) {
  const std::string bytes =
      "POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n";
  for (size_t step = 1; step <= bytes.size(); ++step) {
    RequestParser parser({});
    RequestParser::State state = RequestParser::State::kNeedMore;
    std::string pending;
    for (size_t i = 0; i < bytes.size(); i += step) {
      pending += bytes.substr(i, step);
      size_t consumed = 0;
      state = parser.Feed(pending, &consumed);
      pending.erase(0, consumed);
      if (state != RequestParser::State::kNeedMore) break;
    }
    ASSERT_EQ(state, RequestParser::State::kDone)
        << "step " << step << ": " << parser.error_message();
    EXPECT_EQ(parser.request().body, "wikipedia") << "step " << step;
    EXPECT_EQ(parser.request().path, "/v1/completions");
  }
}

TEST(RequestParserTest, ConnectionSemanticsFollowTheVersion) {
  EXPECT_FALSE(ParseAll("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive);
  EXPECT_FALSE(ParseAll("GET / HTTP/1.0\r\n\r\n").keep_alive);
  EXPECT_TRUE(ParseAll("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
  EXPECT_EQ(ParseAll("GET / HTTP/1.0\r\n\r\n").request.minor_version, 0);
}

TEST(RequestParserTest, ExpectContinueIsRecognised) {
  RequestParser parser({});
  size_t consumed = 0;
  EXPECT_EQ(parser.Feed("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
                        &consumed),
            RequestParser::State::kNeedMore);
  EXPECT_TRUE(parser.headers_done());
  EXPECT_TRUE(parser.expects_continue());
}

struct Bad {
  const char* name;
  std::string bytes;
  int status;
  const char* says;
};

TEST(RequestParserTest, MalformedRequestsGetTheRightStatusAndSayWhy) {
  ParserLimits small;
  small.max_body_bytes = 10;
  small.max_header_bytes = 256;
  small.max_request_line_bytes = 64;
  small.max_headers = 4;
  const std::vector<Bad> cases = {
      {"no version", "GET /\r\n\r\n", 400, "request line"},
      {"two spaces", "GET  / HTTP/1.1\r\n\r\n", 400, "request line"},
      {"bad method", "G(T / HTTP/1.1\r\n\r\n", 400, "method"},
      {"http2", "GET / HTTP/2.0\r\n\r\n", 505, "not supported"},
      {"not http", "GET / FTP/1.1\r\n\r\n", 400, "HTTP version"},
      {"absolute form", "GET http://x/ HTTP/1.1\r\n\r\n", 400, "starting with '/'"},
      {"byte in target", "GET /\x01 HTTP/1.1\r\n\r\n", 400, "outside ASCII"},
      {"utf8 in target", "GET /\xc3\xa9 HTTP/1.1\r\n\r\n", 400, "outside ASCII"},
      {"bad escape", "GET /%zz HTTP/1.1\r\n\r\n", 400, "percent-escape"},
      {"short escape", "GET /%f HTTP/1.1\r\n\r\n", 400, "percent-escape"},
      {"nul escape", "GET /%00 HTTP/1.1\r\n\r\n", 400, "percent-escape"},
      {"bare cr", "GET / HTTP/1.1\r\nA: b\rc\r\n\r\n", 400, "bare CR"},
      {"no colon", "GET / HTTP/1.1\r\nnocolon\r\n\r\n", 400, "colon"},
      {"bad name", "GET / HTTP/1.1\r\nna me: x\r\n\r\n", 400, "not a token"},
      {"obs fold", "GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", 400, "folding"},
      {"nul in value", std::string("GET / HTTP/1.1\r\nA: b\0c\r\n\r\n", 26), 400, "control"},
      {"cl and te", "POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
       400, "both"},
      {"conflicting cl", "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400,
       "conflicting"},
      {"negative cl", "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "decimal"},
      {"cl list", "POST / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n", 400, "decimal"},
      {"huge cl", "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 400,
       "decimal"},
      {"cl over limit", "POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n", 413, "larger than"},
      {"gzip te", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "only chunked"},
      {"te in 1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "HTTP/1.0"},
      {"bad chunk size", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
       "chunk-size"},
      {"chunk over limit", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n", 413,
       "larger than"},
      {"chunk too long", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n", 400,
       "longer than"},
      {"odd expect", "GET / HTTP/1.1\r\nExpect: teapot\r\n\r\n", 417, "not supported"},
      {"long line", "GET /" + std::string(100, 'a') + " HTTP/1.1\r\n\r\n", 414, "request line"},
      {"big headers", "GET / HTTP/1.1\r\nA: " + std::string(300, 'a') + "\r\n\r\n", 431,
       "header section"},
      {"many headers", "GET / HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\n\r\n", 431,
       "header fields"},
      {"empty lines", "\r\n\r\n\r\n\r\n\r\n\r\n", 400, "empty lines"},
  };
  for (const Bad& bad : cases) {
    const Parsed p = ParseAll(bad.bytes, small);
    EXPECT_EQ(p.state, RequestParser::State::kError) << bad.name;
    EXPECT_EQ(p.status, bad.status) << bad.name << ": " << p.message;
    EXPECT_THAT(p.message, HasSubstr(bad.says)) << bad.name;
    EXPECT_FALSE(p.keep_alive) << bad.name;
  }
}

TEST(RequestParserTest, ResetReadsTheNextRequest) {
  RequestParser parser({});
  size_t consumed = 0;
  const std::string two = "GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
  ASSERT_EQ(parser.Feed(two, &consumed), RequestParser::State::kDone);
  EXPECT_EQ(parser.request().path, "/a");
  parser.Reset();
  size_t second = 0;
  ASSERT_EQ(parser.Feed(absl::string_view(two).substr(consumed), &second),
            RequestParser::State::kDone);
  EXPECT_EQ(parser.request().path, "/b");
  EXPECT_EQ(consumed + second, two.size());
}

}  // namespace
}  // namespace tandem::http
