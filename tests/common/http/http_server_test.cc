#include "common/http/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "tests/testing/subprocess.h"

namespace tandem::http {
namespace {

Route Echo() {
  return {"/echo", [](const Request& r) {
            return Response{200, "text/plain",
                            r.method + ":" + r.query + ":" + r.body + ":" +
                                (r.headers.count("content-length") ? "len" : "nolen")};
          }};
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
}

TEST(HttpServerTest, OversizedBodyGets413AndServerKeepsServing) {
  ServerOptions options;
  options.max_body_bytes = 16;
  auto server = HttpServer::Start(options, {Echo()});
  ASSERT_TRUE(server.ok());
  auto big = Fetch("127.0.0.1", (*server)->port(), "POST", "/echo", std::string(100, 'x'));
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->status, 413);
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

// A client that sends a GET for `path` on a raw socket and leaves the socket to the caller.
int SendGet(int port, const std::string& path) {
  return testing::ConnectAndSend(
      port, "GET " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
}

TEST(HttpServerTest, StreamedBodyArrivesWholeAndInOrder) {
  Route events{"/events", nullptr, [](const Request&, ResponseWriter* out) {
                 EXPECT_TRUE(out->Start(200, "text/event-stream"));
                 EXPECT_TRUE(out->Write("data: a\n\n"));
                 EXPECT_TRUE(out->Write(""));  // nothing to send; must not end the body
                 EXPECT_TRUE(out->Write("data: b\n\n"));
                 EXPECT_FALSE(out->Send({200, "text/plain", "too late"}));
               }};
  auto server = HttpServer::Start({}, {events});
  ASSERT_TRUE(server.ok());
  auto got = Fetch("127.0.0.1", (*server)->port(), "GET", "/events");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(got->body, "data: a\n\ndata: b\n\n");
}

TEST(HttpServerTest, StreamHandlerMaySendOneWholeResponseOrNone) {
  Route whole{"/whole", nullptr, [](const Request& r, ResponseWriter* out) {
                EXPECT_TRUE(out->Send({400, "application/json", "{\"bad\":\"" + r.body + "\"}"}));
              }};
  Route none{"/none", nullptr, [](const Request&, ResponseWriter*) {}};
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

TEST(HttpServerTest, ClientLeavingIsNoticedWhileNothingIsWritten) {
  absl::Notification entered, gone;
  std::atomic<bool> noticed{false};
  Route wait{"/wait", nullptr, [&](const Request&, ResponseWriter* out) {
               out->OnClientGone([&] { gone.Notify(); });
               entered.Notify();
               noticed = gone.WaitForNotificationWithTimeout(absl::Seconds(10));
               EXPECT_TRUE(out->client_gone());
               EXPECT_FALSE(out->Start(200, "text/event-stream") && out->Write("data: x\n\n"));
             }};
  auto server = HttpServer::Start({}, {wait, Echo()});
  ASSERT_TRUE(server.ok());
  const int fd = SendGet((*server)->port(), "/wait");
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  close(fd);
  server->reset();  // waits for the handler
  EXPECT_TRUE(noticed);
}

TEST(HttpServerTest, ClientThatStaysIsNotReportedGone) {
  std::atomic<bool> fired{false};
  Route slow{"/slow", nullptr, [&](const Request&, ResponseWriter* out) {
               out->OnClientGone([&] { fired = true; });
               absl::SleepFor(absl::Milliseconds(300));
               out->Send({200, "text/plain", "done"});
             }};
  auto server = HttpServer::Start({}, {slow});
  ASSERT_TRUE(server.ok());
  auto got = Fetch("127.0.0.1", (*server)->port(), "GET", "/slow");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->body, "done");
  EXPECT_FALSE(fired);
}

TEST(HttpServerTest, WritesFailOnceTheClientHasGone) {
  absl::Notification started;
  std::atomic<bool> write_failed{false};
  Route stream{"/stream", nullptr, [&](const Request&, ResponseWriter* out) {
                 out->Start(200, "text/event-stream");
                 started.Notify();
                 const absl::Time deadline = absl::Now() + absl::Seconds(10);
                 while (absl::Now() < deadline) {
                   if (!out->Write("data: tick\n\n")) {
                     write_failed = true;
                     return;
                   }
                   absl::SleepFor(absl::Milliseconds(10));
                 }
               }};
  auto server = HttpServer::Start({}, {stream});
  ASSERT_TRUE(server.ok());
  const int fd = SendGet((*server)->port(), "/stream");
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  close(fd);
  server->reset();
  EXPECT_TRUE(write_failed);
}

}  // namespace
}  // namespace tandem::http
