#include "tools/cli/event_stream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/clock.h"
#include "tests/tools/cli/canned_server.h"

namespace tandem::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Events of an OpenAI-style stream with the features a parser must handle: CRLF and LF line
// ends, a comment, a field it ignores, multi-line data and a bare "data" field.
constexpr char kStream[] =
    ": keep-alive\r\n"
    "\r\n"
    "data: {\"a\":1}\r\n\r\n"
    "event: message\n"
    "data:{\"b\":2}\n\n"
    "data: line one\n"
    "data: line two\n"
    "\n"
    "data\n"
    "\n"
    "id: 7\n"
    "data: [DONE]\n\n"
    "data: unfinished";

const std::vector<std::string> kEvents = {"{\"a\":1}", "{\"b\":2}", "line one\nline two", "",
                                          "[DONE]"};

std::vector<std::string> ParseInPieces(const std::vector<std::string>& pieces) {
  SseParser parser;
  std::vector<std::string> events;
  for (const std::string& piece : pieces) parser.Feed(piece, &events);
  return events;
}

TEST(SseParserTest, WholeStream) { EXPECT_EQ(ParseInPieces({kStream}), kEvents); }

TEST(SseParserTest, SplitAtEveryBytePosition) {
  const std::string stream = kStream;
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    EXPECT_EQ(ParseInPieces({stream.substr(0, cut), stream.substr(cut)}), kEvents)
        << "cut at " << cut;
  }
  for (size_t a = 0; a <= stream.size(); a += 3) {
    for (size_t b = a; b <= stream.size(); b += 5) {
      EXPECT_EQ(ParseInPieces({stream.substr(0, a), stream.substr(a, b - a), stream.substr(b)}),
                kEvents)
          << "cuts at " << a << " and " << b;
    }
  }
}

TEST(SseParserTest, OneByteAtATime) {
  std::vector<std::string> pieces;
  for (char c : std::string(kStream)) pieces.push_back(std::string(1, c));
  EXPECT_EQ(ParseInPieces(pieces), kEvents);
}

TEST(SseParserTest, BareCarriageReturnsEndLinesToo) {
  const std::string stream = "data: x\r\rdata: y\r\n\r\ndata: z\n\r";
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    EXPECT_THAT(ParseInPieces({stream.substr(0, cut), stream.substr(cut)}),
                ElementsAre("x", "y", "z"))
        << "cut at " << cut;
  }
}

// A payload in chunks of sizes 1, 16 and 5 (one with an extension) and a trailer.
std::string Chunked(const std::string& payload) {
  return absl::StrCat("1\r\n", payload.substr(0, 1), "\r\n", "10;name=value\r\n",
                      payload.substr(1, 16), "\r\n", "5\n", payload.substr(17, 5), "\n",
                      "0\r\nX-Trailer: yes\r\n\r\n", "ignored after the end");
}

TEST(ChunkedDecoderTest, SplitAtEveryBytePosition) {
  const std::string payload = "data: {\"x\":1}\n\ndata: [DONE]\n\n";
  const std::string body = Chunked(payload.substr(0, 22));
  for (size_t cut = 0; cut <= body.size(); ++cut) {
    ChunkedDecoder decoder;
    std::string out;
    ASSERT_TRUE(decoder.Feed(body.substr(0, cut), &out).ok()) << cut;
    ASSERT_TRUE(decoder.Feed(body.substr(cut), &out).ok()) << cut;
    EXPECT_EQ(out, payload.substr(0, 22)) << "cut at " << cut;
    EXPECT_TRUE(decoder.done()) << "cut at " << cut;
  }
  ChunkedDecoder decoder;
  std::string out;
  for (char c : body) ASSERT_TRUE(decoder.Feed(std::string(1, c), &out).ok());
  EXPECT_EQ(out, payload.substr(0, 22));
  EXPECT_TRUE(decoder.done());
}

TEST(ChunkedDecoderTest, NotDoneBeforeTheLastChunk) {
  ChunkedDecoder decoder;
  std::string out;
  ASSERT_TRUE(decoder.Feed("3\r\nabc\r\n", &out).ok());
  EXPECT_EQ(out, "abc");
  EXPECT_FALSE(decoder.done());
  ASSERT_TRUE(decoder.Feed("0\r\n", &out).ok());
  EXPECT_FALSE(decoder.done());  // the trailer section's blank line is still to come
  ASSERT_TRUE(decoder.Feed("\r\n", &out).ok());
  EXPECT_TRUE(decoder.done());
}

TEST(ChunkedDecoderTest, MalformedFramingIsAnError) {
  std::string out;
  EXPECT_FALSE(ChunkedDecoder().Feed("zz\r\n", &out).ok());
  EXPECT_FALSE(ChunkedDecoder().Feed("\r\n", &out).ok());
  EXPECT_FALSE(ChunkedDecoder().Feed("3\r\nabcX\r\n", &out).ok());
  EXPECT_FALSE(ChunkedDecoder().Feed("1234567890abcdef0\r\n", &out).ok());
  EXPECT_FALSE(ChunkedDecoder().Feed(std::string(20000, '1'), &out).ok());
}

TEST(ParseResponseHeadTest, StatusAndHeaders) {
  auto head = ParseResponseHead(
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding:  chunked \r\n"
      "X-A: 1\r\nx-a: 2\r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->headers["content-type"], "text/event-stream");
  EXPECT_EQ(head->headers["transfer-encoding"], "chunked");
  EXPECT_EQ(head->headers["x-a"], "1, 2");
  auto bare = ParseResponseHead("HTTP/1.0 404\r\n");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->status, 404);
  EXPECT_FALSE(ParseResponseHead("").ok());
  EXPECT_FALSE(ParseResponseHead("SPDY/3 200 OK").ok());
  EXPECT_FALSE(ParseResponseHead("HTTP/1.1 2000 OK").ok());
  EXPECT_FALSE(ParseResponseHead("HTTP/1.1 200 OK\r\nno colon here\r\n").ok());
}

TEST(ParseHostPortTest, NamesAddressesAndErrors) {
  auto v4 = ParseHostPort("127.0.0.1:8080");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 8080);
  auto v6 = ParseHostPort("[::1]:9");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 9);
  EXPECT_TRUE(ParseHostPort("localhost:1").ok());
  for (const char* bad :
       {"", "localhost", ":80", "host:", "host:0", "host:65536", "host:x", "[::1]", "[::1]80"}) {
    EXPECT_FALSE(ParseHostPort(bad).ok()) << bad;
  }
}

using testing::CannedServer;

// Collects the events of one PostEventStream call to a CannedServer.
struct Call {
  absl::Status status;
  std::vector<std::string> events;
  absl::Duration took;
};
Call Post(const CannedServer& server, absl::Duration timeout = absl::Seconds(10),
          const std::string& stop_at = "") {
  Call call;
  const util::Instant start = util::Instant::Now();
  call.status = PostEventStream({"127.0.0.1", server.port()}, "/v1/completions", "{\"x\":1}",
                                start + timeout, [&](absl::string_view data) {
                                  call.events.emplace_back(data);
                                  return data != stop_at;
                                });
  call.took = util::Since(start);
  return call;
}

TEST(PostEventStreamTest, ChunkedEventsSplitAcrossChunksAndWrites) {
  // Events cut across chunk boundaries, and chunks cut across writes with pauses between.
  const std::string events = "data: {\"n\":1}\n\ndata: {\"n\":2}\r\n\r\n: ping\n\ndata: [DONE]\n\n";
  const std::string body = CannedServer::Chunk(events.substr(0, 9)) +
                           CannedServer::Chunk(events.substr(9, 20)) +
                           CannedServer::Chunk(events.substr(29)) + "0\r\n\r\n";
  const std::string all = CannedServer::ChunkedSseHead() + body;
  std::vector<CannedServer::Write> script;
  for (size_t at = 0; at < all.size(); at += 7) {
    script.push_back({absl::Milliseconds(at % 3 == 0 ? 2 : 0), all.substr(at, 7)});
  }
  CannedServer server(script);
  const Call call = Post(server);
  ASSERT_TRUE(call.status.ok()) << call.status;
  EXPECT_THAT(call.events, ElementsAre("{\"n\":1}", "{\"n\":2}", "[DONE]"));
  const std::string request = server.request();
  EXPECT_THAT(request, HasSubstr("POST /v1/completions HTTP/1.1\r\n"));
  EXPECT_THAT(request, HasSubstr("Content-Type: application/json\r\n"));
  EXPECT_THAT(request, HasSubstr("Content-Length: 7\r\n"));
  EXPECT_THAT(request, HasSubstr("\r\n\r\n{\"x\":1}"));
}

TEST(PostEventStreamTest, StopsWhenTheCallerSaysSoWithoutWaitingForTheEnd) {
  // After [DONE] the server keeps the connection open for 5 s: the caller's stop ends the call.
  CannedServer server({{absl::ZeroDuration(),
                        CannedServer::ChunkedSseHead() + CannedServer::Chunk("data: [DONE]\n\n")}},
                      absl::Seconds(5));
  const Call call = Post(server, absl::Seconds(10), "[DONE]");
  ASSERT_TRUE(call.status.ok()) << call.status;
  EXPECT_THAT(call.events, ElementsAre("[DONE]"));
  EXPECT_LT(call.took, absl::Seconds(2));
}

TEST(PostEventStreamTest, ContentLengthAndCloseDelimitedBodies) {
  const std::string events = "data: a\n\ndata: b\n\n";
  CannedServer sized(
      {{absl::ZeroDuration(), absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                           "Content-Length: ",
                                           events.size(), "\r\n\r\n", events)}},
      absl::Seconds(5));
  Call call = Post(sized);
  ASSERT_TRUE(call.status.ok()) << call.status;
  EXPECT_THAT(call.events, ElementsAre("a", "b"));
  EXPECT_LT(call.took, absl::Seconds(2));  // ends at Content-Length, not at the close

  CannedServer unsized({{absl::ZeroDuration(),
                         "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + events}});
  call = Post(unsized);
  ASSERT_TRUE(call.status.ok()) << call.status;
  EXPECT_THAT(call.events, ElementsAre("a", "b"));
}

TEST(PostEventStreamTest, HttpErrorCarriesStatusAndMessage) {
  const std::string body =
      R"({"error":{"message":"max_tokens is too large","type":"invalid_request_error",)"
      R"("param":"max_tokens","code":null}})";
  CannedServer server(
      {{absl::ZeroDuration(), absl::StrCat("HTTP/1.1 400 Bad Request\r\nContent-Type: "
                                           "application/json\r\nContent-Length: ",
                                           body.size(), "\r\n\r\n", body)}});
  const Call call = Post(server);
  EXPECT_EQ(call.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(call.status.message(), HasSubstr("HTTP 400: max_tokens is too large"));
  EXPECT_TRUE(call.events.empty());
}

TEST(PostEventStreamTest, NotAnEventStreamIsAnError) {
  CannedServer server({{absl::ZeroDuration(),
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        "Content-Length: 2\r\n\r\n{}"}});
  const Call call = Post(server);
  EXPECT_EQ(call.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(call.status.message(), HasSubstr("text/event-stream"));
}

TEST(PostEventStreamTest, AStalledServerMeetsTheDeadline) {
  // The head and one event, then nothing for 5 s: the call ends at its 300 ms deadline.
  CannedServer server(
      {{absl::ZeroDuration(), CannedServer::ChunkedSseHead() + CannedServer::Chunk("data: 1\n\n")}},
      absl::Seconds(5));
  const Call call = Post(server, absl::Milliseconds(300));
  EXPECT_EQ(call.status.code(), absl::StatusCode::kDeadlineExceeded) << call.status;
  EXPECT_THAT(call.events, ElementsAre("1"));
  EXPECT_GE(call.took, absl::Milliseconds(300));
  EXPECT_LT(call.took, absl::Seconds(2));
}

TEST(PostEventStreamTest, AConnectionClosedMidStreamIsUnavailable) {
  CannedServer server({{absl::ZeroDuration(), CannedServer::ChunkedSseHead() +
                                                  CannedServer::Chunk("data: 1\n\n") + "5\r\nda"}});
  const Call call = Post(server);
  EXPECT_EQ(call.status.code(), absl::StatusCode::kUnavailable) << call.status;
  EXPECT_THAT(call.events, ElementsAre("1"));
}

TEST(PostEventStreamTest, NoServerIsUnavailable) {
  int port = 0;
  {
    CannedServer server({});
    port = server.port();
  }
  const absl::Status status =
      PostEventStream({"127.0.0.1", port}, "/", "{}", util::Instant::Now() + absl::Seconds(5),
                      [](absl::string_view) { return true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

}  // namespace
}  // namespace tandem::cli
