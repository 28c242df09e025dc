#include "common/http/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/http/client.h"
#include "common/util/clock.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace tandem::http {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

Route Echo() {
  return {"/echo", [](const Request& r) {
            return Response{200, "text/plain",
                            r.method + ":" + r.query + ":" + r.body + ":" +
                                (r.headers.count("content-length") ? "len" : "nolen")};
          }};
}

using testing::ReadUntil;
using testing::ReadUntilClosed;

// A request's raw answer: connect, send `bytes`, read until the server closes.
std::string RawExchange(int port, const std::string& bytes) {
  const int fd = testing::ConnectAndSend(port, bytes);
  if (fd < 0) return "";
  std::string out = ReadUntilClosed(fd);
  close(fd);
  return out;
}

TEST(HttpServerTest, RoutesMethodQueryAndBody) {
  auto server = HttpServer::Start({}, {Echo()});
  ASSERT_TRUE(server.ok()) << server.status();
  auto echo = Fetch("127.0.0.1", (*server)->port(), "POST", "/echo?x=1", "hello");
  ASSERT_TRUE(echo.ok()) << echo.status();
  EXPECT_EQ(echo->status, 200);
  EXPECT_EQ(echo->body, "POST:x=1:hello:len");
  auto missing = Fetch("127.0.0.1", (*server)->port(), "GET", "/nope");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(nlohmann::json::parse(missing->body)["error"]["type"], "invalid_request_error");
}

TEST(HttpServerTest, OversizedBodyGets413AndServerKeepsServing) {
  ServerOptions options;
  options.max_body_bytes = 16;
  auto server = HttpServer::Start(options, {Echo()});
  ASSERT_TRUE(server.ok());
  auto big = Fetch("127.0.0.1", (*server)->port(), "POST", "/echo", std::string(100, 'x'));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->status, 413);
  EXPECT_THAT(big->body, HasSubstr("request_too_large"));
  auto small = Fetch("127.0.0.1", (*server)->port(), "POST", "/echo", "ok");
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->status, 200);
}

TEST(HttpServerTest, BadOptionsAndPortInUse) {
  ServerOptions bad;
  bad.port = 70000;
  EXPECT_EQ(HttpServer::Start(bad, {}).status().code(), absl::StatusCode::kInvalidArgument);
  auto first = HttpServer::Start({}, {Echo()});
  ASSERT_TRUE(first.ok());
  ServerOptions same;
  same.port = (*first)->port();
  EXPECT_FALSE(HttpServer::Start(same, {Echo()}).ok());
}

TEST(HttpServerTest, FetchFromClosedPortFails) {
  int port = 0;
  {
    auto server = HttpServer::Start({}, {Echo()});
    ASSERT_TRUE(server.ok());
    port = (*server)->port();
  }
  EXPECT_FALSE(Fetch("127.0.0.1", port, "GET", "/echo", "", 1000).ok());
}

TEST(HttpServerTest, InvalidUtf8InThePathGetsAValidJson404) {
  auto server = HttpServer::Start({}, {Echo()});
  ASSERT_TRUE(server.ok());
  auto got = Fetch("127.0.0.1", (*server)->port(), "GET", "/%FF%C3");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->status, 404);
  const nlohmann::json body = nlohmann::json::parse(got->body, nullptr, false);
  ASSERT_FALSE(body.is_discarded()) << got->body;
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("no such path"));
}

TEST(HttpServerTest, AHandlerThatThrowsGets500AndTheServerKeepsServing) {
  Route boom{"/boom", [](const Request&) -> Response { throw std::runtime_error("kaboom"); }};
  Route stream_boom{"/stream-boom", nullptr, [](const Request&, std::shared_ptr<ResponseWriter>) {
                      throw std::out_of_range("stream kaboom");
                    }};
  auto server = HttpServer::Start({}, {boom, stream_boom, Echo()});
  ASSERT_TRUE(server.ok());
  for (const char* path : {"/boom", "/stream-boom"}) {
    auto got = Fetch("127.0.0.1", (*server)->port(), "GET", path);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->status, 500) << path;
    EXPECT_THAT(got->body, HasSubstr("internal_error"));
  }
  auto echo = Fetch("127.0.0.1", (*server)->port(), "GET", "/echo");
  ASSERT_TRUE(echo.ok());
  EXPECT_EQ(echo->status, 200);
}

TEST(HttpServerTest, StreamedBodyArrivesWholeAndInOrder) {
  Route events{"/events", nullptr, [](const Request&, std::shared_ptr<ResponseWriter> out) {
                 EXPECT_TRUE(out->Start(200, "text/event-stream"));
                 EXPECT_TRUE(out->Write("data: a\n\n"));
                 EXPECT_TRUE(out->Write(""));  // nothing to send; must not end the body
                 EXPECT_TRUE(out->Write("data: b\n\n"));
                 EXPECT_FALSE(out->Send({200, "text/plain", "too late"}));
                 out->Finish();
                 EXPECT_FALSE(out->Write("data: after\n\n"));
               }};
  auto server = HttpServer::Start({}, {events});
  ASSERT_TRUE(server.ok());
  auto got = Fetch("127.0.0.1", (*server)->port(), "GET", "/events");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(got->headers["transfer-encoding"], "chunked");
  EXPECT_EQ(got->body, "data: a\n\ndata: b\n\n");
}

TEST(HttpServerTest, StreamHandlerMaySendOneWholeResponseOrNone) {
  Route whole{"/whole", nullptr, [](const Request& r, std::shared_ptr<ResponseWriter> out) {
                EXPECT_TRUE(out->Send({400, "application/json", "{\"bad\":\"" + r.body + "\"}"}));
                EXPECT_FALSE(out->Send({200, "text/plain", "twice"}));
              }};
  Route none{"/none", nullptr, [](const Request&, std::shared_ptr<ResponseWriter>) {}};
  auto server = HttpServer::Start({}, {whole, none});
  ASSERT_TRUE(server.ok());
  auto got = Fetch("127.0.0.1", (*server)->port(), "POST", "/whole", "x");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, 400);
  EXPECT_EQ(got->body, "{\"bad\":\"x\"}");
  got = Fetch("127.0.0.1", (*server)->port(), "GET", "/none");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, 500);
}

// Streams hold no thread: with one worker thread, many streams are open at once and are
// written to later from another thread.
TEST(HttpServerTest, ManyStreamsAtOnceOnOneWorkerThread) {
  constexpr int kStreams = 200;
  absl::Mutex mu;
  std::vector<std::shared_ptr<ResponseWriter>> writers;
  Route events{"/events", nullptr, [&](const Request&, std::shared_ptr<ResponseWriter> out) {
                 out->Start(200, "text/event-stream");
                 absl::MutexLock lock(&mu);
                 writers.push_back(std::move(out));
               }};
  ServerOptions options;
  options.num_threads = 1;
  auto server = HttpServer::Start(options, {events});
  ASSERT_TRUE(server.ok());
  std::vector<int> fds;
  for (int i = 0; i < kStreams; ++i) {
    fds.push_back(testing::ConnectAndSend((*server)->port(), "GET /events HTTP/1.1\r\n\r\n"));
    ASSERT_GE(fds.back(), 0);
  }
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return writers.size() == kStreams;
      },
      absl::Seconds(20)));
  EXPECT_EQ((*server)->num_connections(), kStreams);
  std::thread producer([&] {
    absl::MutexLock lock(&mu);
    for (int round = 0; round < 3; ++round) {
      for (auto& w : writers) EXPECT_TRUE(w->Write("data: x\n\n"));
    }
    for (auto& w : writers) w->Finish();
    writers.clear();
  });
  producer.join();
  for (int fd : fds) {
    const std::string got = ReadUntil(fd, "0\r\n\r\n");
    EXPECT_THAT(got, StartsWith("HTTP/1.1 200 OK\r\n"));
    EXPECT_THAT(got,
                HasSubstr("9\r\ndata: x\n\n\r\n9\r\ndata: x\n\n\r\n9\r\ndata: x\n\n\r\n0\r\n\r\n"));
    close(fd);
  }
}

TEST(HttpServerTest, ClientLeavingIsNoticedWhileNothingIsWritten) {
  absl::Notification entered, gone;
  std::shared_ptr<ResponseWriter> kept;
  Route wait{"/wait", nullptr, [&](const Request&, std::shared_ptr<ResponseWriter> out) {
               out->OnClientGone([&] { gone.Notify(); });
               kept = out;
               entered.Notify();
             }};
  auto server = HttpServer::Start({}, {wait, Echo()});
  ASSERT_TRUE(server.ok());
  const int fd = testing::ConnectAndSend((*server)->port(), "GET /wait HTTP/1.1\r\n\r\n");
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  close(fd);
  EXPECT_TRUE(gone.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(kept->client_gone());
  EXPECT_FALSE(kept->Start(200, "text/event-stream"));
}

// shutdown(SHUT_WR) after the request is a half-close: the client still reads the answer.
TEST(HttpServerTest, AHalfClosedClientIsNotTakenForGone) {
  std::atomic<bool> fired{false};
  std::shared_ptr<ResponseWriter> kept;
  absl::Notification entered;
  Route slow{"/slow", nullptr, [&](const Request&, std::shared_ptr<ResponseWriter> out) {
               out->OnClientGone([&] { fired = true; });
               kept = out;
               entered.Notify();
             }};
  auto server = HttpServer::Start({}, {slow});
  ASSERT_TRUE(server.ok());
  const int fd = testing::ConnectAndSend((*server)->port(), "GET /slow HTTP/1.1\r\n\r\n");
  ASSERT_GE(fd, 0);
  ASSERT_EQ(shutdown(fd, SHUT_WR), 0);
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // Give the server every chance to mistake the half-close for a departure.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(kept->client_gone());
  EXPECT_TRUE(kept->Send({200, "text/plain", "done"}));
  const std::string got = ReadUntilClosed(fd);
  close(fd);
  EXPECT_THAT(got, HasSubstr("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(got, HasSubstr("\r\n\r\ndone"));
  EXPECT_FALSE(fired);
}

TEST(HttpServerTest, WritesFailOnceTheClientHasGone) {
  std::shared_ptr<ResponseWriter> kept;
  absl::Notification started;
  Route stream{"/stream", nullptr, [&](const Request&, std::shared_ptr<ResponseWriter> out) {
                 out->Start(200, "text/event-stream");
                 kept = out;
                 started.Notify();
               }};
  auto server = HttpServer::Start({}, {stream});
  ASSERT_TRUE(server.ok());
  const int fd = testing::ConnectAndSend((*server)->port(), "GET /stream HTTP/1.1\r\n\r\n");
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  close(fd);
  EXPECT_TRUE(
      testing::WaitUntil([&] { return !kept->Write("data: tick\n\n"); }, absl::Seconds(10)));
}

TEST(HttpServerTest, KeepAliveAndPipelinedRequestsAreAnsweredInOrder) {
  auto server = HttpServer::Start({}, {Echo()});
  ASSERT_TRUE(server.ok());
  const int fd = testing::ConnectAndSend((*server)->port(),
                                         "POST /echo?a HTTP/1.1\r\nContent-Length: 1\r\n\r\n1"
                                         "POST /echo?b HTTP/1.1\r\nContent-Length: 1\r\n\r\n2"
                                         "GET /echo?c HTTP/1.1\r\nConnection: close\r\n\r\n");
  ASSERT_GE(fd, 0);
  const std::string got = ReadUntilClosed(fd);
  close(fd);
  const size_t a = got.find("POST:a:1:len"), b = got.find("POST:b:2:len"),
               c = got.find("GET:c::nolen");
  ASSERT_NE(a, std::string::npos) << got;
  ASSERT_NE(b, std::string::npos) << got;
  ASSERT_NE(c, std::string::npos) << got;
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  EXPECT_THAT(got, HasSubstr("Connection: keep-alive"));
  EXPECT_THAT(got, HasSubstr("Connection: close"));
}

TEST(HttpServerTest, ChunkedRequestBodyAndExpectContinue) {
  auto server = HttpServer::Start({}, {Echo()});
  ASSERT_TRUE(server.ok());
  std::string got =
      RawExchange((*server)->port(),
                  "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                  "2\r\nhi\r\n0\r\n\r\n");
  EXPECT_THAT(got, HasSubstr("POST::hi:nolen"));
  const int fd = testing::ConnectAndSend(
      (*server)->port(),
      "POST /echo HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n"
      "\r\n");
  ASSERT_GE(fd, 0);
  EXPECT_THAT(ReadUntil(fd, "\r\n\r\n"), StartsWith("HTTP/1.1 100 Continue\r\n\r\n"));
  ASSERT_EQ(send(fd, "ok", 2, 0), 2);
  got = ReadUntilClosed(fd);
  close(fd);
  EXPECT_THAT(got, HasSubstr("POST::ok:len"));
}

TEST(HttpServerTest, ASlowRequestGets408AndAnIdleConnectionIsClosed) {
  ServerOptions options;
  options.request_timeout = absl::Milliseconds(300);
  options.keep_alive_timeout = absl::Milliseconds(300);
  auto server = HttpServer::Start(options, {Echo()});
  ASSERT_TRUE(server.ok());
  const int partial = testing::ConnectAndSend((*server)->port(), "GET /echo HTTP/1.1\r\nHo");
  ASSERT_GE(partial, 0);
  std::string got = ReadUntilClosed(partial);
  close(partial);
  EXPECT_THAT(got, StartsWith("HTTP/1.1 408 "));
  const int idle = testing::ConnectAndSend((*server)->port(), "");
  ASSERT_GE(idle, 0);
  const util::Instant start = util::Instant::Now();
  EXPECT_EQ(ReadUntilClosed(idle), "");
  EXPECT_LT(util::Since(start), absl::Seconds(5));
  close(idle);
}

TEST(HttpServerTest, MalformedRequestsGet4xxWithAJsonBodyAndTheServerKeepsServing) {
  ServerOptions options;
  options.max_body_bytes = 64;
  auto server = HttpServer::Start(options, {Echo()});
  ASSERT_TRUE(server.ok());
  const std::vector<std::pair<std::string, int>> cases = {
      {"GARBAGE\r\n\r\n", 400},
      {"GET / HTTP/9.9\r\n\r\n", 505},
      {"GET /\xff HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nA: " + std::string(70000, 'a') + "\r\n\r\n", 431},
      {"GET /" + std::string(9000, 'a') + " HTTP/1.1\r\n\r\n", 414},
      {"POST /echo HTTP/1.1\r\nContent-Length: 100000\r\n\r\n", 413},
      {"POST /echo HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 3\r\n\r\n", 400},
      {"POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n", 400},
  };
  for (const auto& [bytes, status] : cases) {
    const std::string got = RawExchange((*server)->port(), bytes);
    EXPECT_THAT(got, StartsWith(absl::StrCat("HTTP/1.1 ", status, " "))) << bytes.substr(0, 60);
    const size_t body = got.find("\r\n\r\n");
    ASSERT_NE(body, std::string::npos);
    const nlohmann::json error = nlohmann::json::parse(got.substr(body + 4), nullptr, false);
    EXPECT_TRUE(error.contains("error")) << got;
  }
  auto echo = Fetch("127.0.0.1", (*server)->port(), "POST", "/echo", "still");
  ASSERT_TRUE(echo.ok());
  EXPECT_EQ(echo->body, "POST::still:len");
}

TEST(HttpServerTest, ConnectionsPastTheLimitGet503) {
  ServerOptions options;
  options.max_connections = 2;
  auto server = HttpServer::Start(options, {Echo()});
  ASSERT_TRUE(server.ok());
  const int a = testing::ConnectAndSend((*server)->port(), "");
  const int b = testing::ConnectAndSend((*server)->port(), "");
  ASSERT_TRUE(
      testing::WaitUntil([&] { return (*server)->num_connections() == 2; }, absl::Seconds(10)));
  const std::string got = RawExchange((*server)->port(), "GET /echo HTTP/1.1\r\n\r\n");
  EXPECT_THAT(got, StartsWith("HTTP/1.1 503 "));
  close(a);
  close(b);
  ASSERT_TRUE(
      testing::WaitUntil([&] { return (*server)->num_connections() == 0; }, absl::Seconds(10)));
  auto echo = Fetch("127.0.0.1", (*server)->port(), "GET", "/echo");
  ASSERT_TRUE(echo.ok());
  EXPECT_EQ(echo->status, 200);
}

TEST(HttpServerTest, Http10StreamsEndWithTheConnection) {
  Route events{"/events", nullptr, [](const Request&, std::shared_ptr<ResponseWriter> out) {
                 out->Start(200, "text/event-stream");
                 out->Write("data: a\n\n");
                 out->Finish();
               }};
  auto server = HttpServer::Start({}, {events});
  ASSERT_TRUE(server.ok());
  const std::string got = RawExchange((*server)->port(), "GET /events HTTP/1.0\r\n\r\n");
  EXPECT_THAT(got, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(got, HasSubstr("Connection: close\r\n\r\ndata: a\n\n"));
  EXPECT_THAT(got, ::testing::Not(HasSubstr("chunked")));
}

TEST(HttpServerTest, WritersHeldPastTheServerSeeTheClientGone) {
  std::shared_ptr<ResponseWriter> kept;
  absl::Notification entered;
  Route wait{"/wait", nullptr, [&](const Request&, std::shared_ptr<ResponseWriter> out) {
               kept = out;
               entered.Notify();
             }};
  auto server = HttpServer::Start({}, {wait});
  ASSERT_TRUE(server.ok());
  const int fd = testing::ConnectAndSend((*server)->port(), "GET /wait HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  server->reset();
  EXPECT_TRUE(kept->client_gone());
  EXPECT_FALSE(kept->Send({200, "text/plain", "late"}));
  kept.reset();
  close(fd);
}

}  // namespace
}  // namespace tandem::http
