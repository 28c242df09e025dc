#include "common/http/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tandem::http
