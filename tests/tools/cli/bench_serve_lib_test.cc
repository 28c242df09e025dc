#include "tools/cli/bench_serve_lib.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/util/clock.h"
#include "tests/testing/subprocess.h"
#include "tests/tools/cli/canned_server.h"

namespace tandem::cli::bench {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pointwise;

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(PercentileTest, InterpolatesLikeNumpy) {
  // numpy.percentile([4, 1, 3, 2], [0, 50, 90, 99, 100]) = [1, 2.5, 3.7, 3.97, 4]
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_NEAR(Percentile(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(Percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
}

TEST(DescribeTest, MillisecondsAndOrder) {
  const Distribution d = Describe({0.001, 0.002, 0.003, 0.004, 0.100});
  EXPECT_NEAR(d.mean, 22, 1e-9);
  EXPECT_NEAR(d.median, 3, 1e-9);
  EXPECT_NEAR(d.std, std::sqrt((21 * 21 + 20 * 20 + 19 * 19 + 18 * 18 + 78 * 78) / 5.0), 1e-9);
  EXPECT_LE(d.median, d.p90);
  EXPECT_LE(d.p90, d.p99);
  EXPECT_NEAR(d.p99, 4 + 0.96 * 96, 1e-9);
  const Distribution empty = Describe({});
  EXPECT_EQ(empty.mean, 0);
  EXPECT_EQ(empty.p99, 0);
}

TEST(ArrivalTimesTest, SeededPoissonSchedule) {
  const std::vector<double> a = ArrivalTimes(20000, 4.0, 7);
  EXPECT_EQ(a, ArrivalTimes(20000, 4.0, 7));  // deterministic
  EXPECT_NE(a, ArrivalTimes(20000, 4.0, 8));
  ASSERT_EQ(a.size(), 20000u);
  EXPECT_EQ(a[0], 0);
  int below_mean = 0;
  for (size_t i = 1; i < a.size(); ++i) {
    ASSERT_GE(a[i], a[i - 1]);
    if (a[i] - a[i - 1] < 0.25) ++below_mean;
  }
  const double mean_gap = a.back() / (a.size() - 1);
  EXPECT_NEAR(mean_gap, 0.25, 0.25 * 0.03);
  // Exponential gaps: P(gap < mean) = 1 - 1/e.
  EXPECT_NEAR(below_mean / static_cast<double>(a.size() - 1), 1 - std::exp(-1.0), 0.02);
}

TEST(ArrivalTimesTest, InfiniteRateSendsAllAtOnce) {
  EXPECT_EQ(ArrivalTimes(3, kInf, 0), std::vector<double>(3, 0.0));
  EXPECT_TRUE(ArrivalTimes(0, 1, 0).empty());
}

TEST(RandomPromptsTest, SeededIdsAvoidSpecialTokens) {
  const auto p = RandomPrompts(50, 16, 100, 3);
  EXPECT_EQ(p, RandomPrompts(50, 16, 100, 3));
  EXPECT_NE(p, RandomPrompts(50, 16, 100, 4));
  ASSERT_EQ(p.size(), 50u);
  std::set<int32_t> seen;
  for (const auto& prompt : p) {
    ASSERT_EQ(prompt.size(), 16u);
    for (int32_t id : prompt) {
      ASSERT_GE(id, kFirstRandomTokenId);
      ASSERT_LT(id, 100);
      seen.insert(id);
    }
  }
  EXPECT_EQ(seen.size(), 97u);  // 800 draws cover the 97 ids
}

TEST(SharedPrefixPromptsTest, OnePrefixThenEachPromptsOwnIds) {
  const auto prompts = SharedPrefixPrompts(4, 32, 8, 1000, 7);
  ASSERT_EQ(prompts.size(), 4u);
  for (const auto& p : prompts) {
    ASSERT_EQ(p.size(), 40u);
    EXPECT_TRUE(std::equal(p.begin(), p.begin() + 32, prompts[0].begin()));
    for (int32_t id : p) EXPECT_TRUE(id >= kFirstRandomTokenId && id < 1000);
  }
  EXPECT_FALSE(std::equal(prompts[0].begin() + 32, prompts[0].end(), prompts[1].begin() + 32));
  EXPECT_EQ(SharedPrefixPrompts(4, 32, 8, 1000, 7), prompts);  // seeded
  EXPECT_NE(SharedPrefixPrompts(4, 32, 8, 1000, 8)[0], prompts[0]);
}

TEST(NextTurnTest, ResendsTheHistory) {
  EXPECT_EQ(NextTurn({1, 2}, {3, 4, 5}, {6}), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(NextTurn({1}, {}, {2}), (std::vector<int32_t>{1, 2}));
}

TEST(ParseTest, RequestRate) {
  EXPECT_EQ(*ParseRequestRate("inf"), kInf);
  EXPECT_EQ(*ParseRequestRate("INF"), kInf);
  EXPECT_EQ(*ParseRequestRate("2.5"), 2.5);
  for (const char* bad : {"", "0", "-1", "x", "nan"}) EXPECT_FALSE(ParseRequestRate(bad).ok());
}

TEST(ParseTest, Slos) {
  auto slos = ParseSlos("ttft:500,tpot:50,e2el:2000");
  ASSERT_TRUE(slos.ok()) << slos.status();
  EXPECT_EQ(slos->ttft_ms, 500);
  EXPECT_EQ(slos->tpot_ms, 50);
  EXPECT_EQ(slos->e2el_ms, 2000);
  auto some = ParseSlos("e2el:1.5");
  ASSERT_TRUE(some.ok());
  EXPECT_FALSE(some->ttft_ms.has_value());
  EXPECT_EQ(some->e2el_ms, 1.5);
  EXPECT_TRUE(ParseSlos("")->empty());
  for (const char* bad : {"ttft", "ttft:", "ttft:-1", "itl:5", "ttft:1,ttft:2", "ttft:1:2"}) {
    EXPECT_FALSE(ParseSlos(bad).ok()) << bad;
  }
}

TEST(StreamTimerTest, ChunksOfSeveralTokensShareTheirGap) {
  StreamTimer timer;
  EXPECT_FALSE(timer.started());
  timer.OnChunk(0.1, 1);
  timer.OnChunk(0.3, 2);  // two tokens 0.2 s after the first: 0.1 s each
  timer.OnChunk(0.35, 1);
  RequestResult r;
  timer.Fill(&r);
  EXPECT_TRUE(timer.started());
  EXPECT_EQ(timer.tokens(), 4);
  EXPECT_DOUBLE_EQ(r.ttft, 0.1);
  EXPECT_THAT(r.itls, Pointwise(DoubleNear(1e-12), {0.1, 0.1, 0.05}));

  StreamTimer first_several;
  first_several.OnChunk(0.2, 3);  // tokens that come with the first one have no gap
  first_several.OnChunk(0.5, 1);
  first_several.Fill(&r);
  EXPECT_DOUBLE_EQ(r.ttft, 0.2);
  EXPECT_THAT(r.itls, Pointwise(DoubleNear(1e-12), {0.0, 0.0, 0.3}));
}

RequestResult Done(double ttft, double e2el, int64_t tokens, int64_t prompt = 10) {
  RequestResult r;
  r.success = true;
  r.ttft = ttft;
  r.e2el = e2el;
  r.output_tokens = tokens;
  r.prompt_tokens = prompt;
  r.itls.assign(std::max<int64_t>(tokens - 1, 0), tokens > 1 ? (e2el - ttft) / (tokens - 1) : 0);
  return r;
}

TEST(SummaryTest, CountsThroughputAndGoodput) {
  RequestResult failed;
  failed.error = "UNAVAILABLE: gone";
  failed.prompt_tokens = 10;
  // TPOTs: 10 ms, 50 ms, 0 (one token)
  const std::vector<RequestResult> results = {Done(0.1, 0.19, 10), Done(0.6, 1.05, 10),
                                              Done(0.2, 0.2, 1), failed};
  auto slos = ParseSlos("ttft:500,tpot:20");
  ASSERT_TRUE(slos.ok());
  EXPECT_TRUE(MeetsSlos(results[0], *slos));
  EXPECT_FALSE(MeetsSlos(results[1], *slos));  // ttft 600 ms
  EXPECT_TRUE(MeetsSlos(results[2], *slos));   // one token: TPOT 0
  EXPECT_FALSE(MeetsSlos(results[3], *slos));  // failed
  EXPECT_FALSE(MeetsSlos(results[0], *ParseSlos("tpot:9")));
  EXPECT_FALSE(MeetsSlos(results[0], *ParseSlos("e2el:180")));

  const Summary s = Summarize(results, 2.0, *slos);
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.total_input_tokens, 30);
  EXPECT_EQ(s.total_output_tokens, 21);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(s.output_throughput, 10.5);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 25.5);
  EXPECT_EQ(s.good, 2);
  ASSERT_TRUE(s.request_goodput.has_value());
  EXPECT_DOUBLE_EQ(*s.request_goodput, 1.0);
  EXPECT_NEAR(s.tpot.mean, 30, 1e-9);  // over the two requests of > 1 token
  EXPECT_NEAR(s.ttft.median, 200, 1e-9);
  EXPECT_NEAR(s.itl.mean, (9 * 10 + 9 * 50) / 18.0, 1e-9);
  EXPECT_FALSE(Summarize(results, 2.0, Slos{}).request_goodput.has_value());
}

TEST(ResultJsonTest, VllmKeysAndPerRequestArrays) {
  RunInfo info;
  info.backend = "grpc";
  info.label = "colocated";
  info.request_rate = kInf;
  info.num_prompts = 2;
  RequestResult failed;
  failed.error = "DEADLINE_EXCEEDED: slow";
  const std::vector<RequestResult> results = {Done(0.1, 0.4, 4), failed};
  const Slos slos = *ParseSlos("ttft:500");
  const Summary summary = Summarize(results, 1.0, slos);
  const nlohmann::json j = ResultJson(info, summary, slos, results);
  for (const char* key : {"date",
                          "backend",
                          "endpoint",
                          "label",
                          "request_rate",
                          "max_concurrency",
                          "num_prompts",
                          "duration",
                          "completed",
                          "failed",
                          "total_input_tokens",
                          "total_output_tokens",
                          "request_throughput",
                          "output_throughput",
                          "total_token_throughput",
                          "request_goodput",
                          "goodput_slos",
                          "input_lens",
                          "output_lens",
                          "ttfts",
                          "itls",
                          "errors"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  for (const char* metric : {"ttft", "tpot", "itl", "e2el"}) {
    for (const char* stat : {"mean", "median", "p90", "p99"}) {
      EXPECT_TRUE(j.contains(absl::StrCat(stat, "_", metric, "_ms"))) << stat << metric;
    }
  }
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["max_concurrency"].is_null());
  EXPECT_EQ(j["label"], "colocated");
  EXPECT_EQ(j["goodput_slos"]["ttft"], 500);
  EXPECT_EQ(j["request_goodput"], 1.0);
  EXPECT_EQ(j["completed"], 1);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["output_lens"], nlohmann::json({4, 0}));
  EXPECT_EQ(j["errors"][0], "");
  EXPECT_EQ(j["errors"][1], "DEADLINE_EXCEEDED: slow");
  ASSERT_EQ(j["itls"].size(), 2u);
  EXPECT_EQ(j["itls"][0].size(), 3u);
  EXPECT_DOUBLE_EQ(j["mean_ttft_ms"].get<double>(), 100);

  info.request_rate = 4;
  info.max_concurrency = 8;
  const nlohmann::json finite = ResultJson(info, Summarize(results, 1.0, Slos{}), Slos{}, results);
  EXPECT_EQ(finite["request_rate"], 4.0);
  EXPECT_EQ(finite["max_concurrency"], 8);
  EXPECT_TRUE(finite["request_goodput"].is_null());
  EXPECT_TRUE(finite["goodput_slos"].empty());
  EXPECT_THAT(SummaryTable(info, summary), HasSubstr("Mean TTFT (ms):"));
}

TEST(CompletionTest, RequestBodyFollowsTheOpenAiContract) {
  RequestOptions options;
  options.output_len = 8;
  Prompt ids;
  ids.token_ids = {5, 6, 7};
  auto body = nlohmann::json::parse(CompletionRequestBody(ids, options));
  EXPECT_EQ(body["prompt"], nlohmann::json({5, 6, 7}));
  EXPECT_EQ(body["max_tokens"], 8);
  EXPECT_EQ(body["temperature"], 0);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_FALSE(body.contains("model"));
  EXPECT_FALSE(body.contains("logprobs"));
  options.logprobs = 5;
  EXPECT_EQ(nlohmann::json::parse(CompletionRequestBody(ids, options))["logprobs"], 5);
  options.logprobs = -1;
  Prompt text;
  text.text = "Hello";
  options.model = "tiny-moe";
  body = nlohmann::json::parse(CompletionRequestBody(text, options));
  EXPECT_EQ(body["prompt"], "Hello");
  EXPECT_EQ(body["model"], "tiny-moe");
}

TEST(CompletionTest, ParsesEvents) {
  auto chunk = ParseCompletionEvent(
      R"({"id":"c1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,)"
      R"("text":" the","logprobs":null,"finish_reason":null}],"usage":null})");
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_TRUE(chunk->has_choice);
  EXPECT_EQ(chunk->text, " the");
  EXPECT_TRUE(chunk->finish_reason.empty());
  EXPECT_FALSE(chunk->completion_tokens.has_value());
  auto usage = ParseCompletionEvent(
      R"({"id":"c1","choices":[],"usage":{"prompt_tokens":16,"completion_tokens":8,)"
      R"("total_tokens":24}})");
  ASSERT_TRUE(usage.ok());
  EXPECT_FALSE(usage->has_choice);
  EXPECT_EQ(usage->prompt_tokens, 16);
  EXPECT_EQ(usage->completion_tokens, 8);
  EXPECT_TRUE(ParseCompletionEvent("[DONE]")->done);
  EXPECT_FALSE(ParseCompletionEvent("not json").ok());
  auto error = ParseCompletionEvent(R"({"error":{"message":"engine died","code":500}})");
  ASSERT_FALSE(error.ok());
  EXPECT_THAT(error.status().message(), HasSubstr("engine died"));
}

std::string Event(const std::string& text, const char* finish = nullptr) {
  nlohmann::json j = {{"id", "c"},
                      {"object", "text_completion"},
                      {"created", 1},
                      {"model", "tiny-moe"},
                      {"choices",
                       {{{"index", 0},
                         {"text", text},
                         {"logprobs", nullptr},
                         {"finish_reason", finish ? nlohmann::json(finish) : nullptr}}}},
                      {"usage", nullptr}};
  return "data: " + j.dump() + "\n\n";
}

using testing::CannedServer;

TEST(RunHttpRequestTest, TimesAStreamedCompletion) {
  // Four tokens 30 ms apart, a finish-only choice, the usage event, [DONE]; each event its
  // own chunk, written when its token is "generated".
  const std::string usage =
      R"(data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,)"
      R"("total_tokens":7}})"
      "\n\n";
  CannedServer server(
      {{absl::Milliseconds(20), CannedServer::ChunkedSseHead() + CannedServer::Chunk(Event(" a"))},
       {absl::Milliseconds(30), CannedServer::Chunk(Event(" b"))},
       {absl::Milliseconds(30), CannedServer::Chunk(Event(" c"))},
       {absl::Milliseconds(30), CannedServer::Chunk(Event(" d"))},
       {absl::ZeroDuration(), CannedServer::Chunk(Event("", "length"))},
       {absl::ZeroDuration(), CannedServer::Chunk(usage)},
       {absl::ZeroDuration(), CannedServer::Chunk("data: [DONE]\n\n") + "0\r\n\r\n"}});
  Prompt prompt;
  prompt.token_ids = {5, 6, 7};
  RequestOptions options;
  options.output_len = 4;
  const RequestResult r = RunHttpRequest({"127.0.0.1", server.port()}, prompt, options);
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_EQ(r.prompt_tokens, 3);
  EXPECT_EQ(r.output_tokens, 4);
  EXPECT_GE(r.ttft, 0.020);
  ASSERT_EQ(r.itls.size(), 3u);  // the finish-only choice is no token
  for (double itl : r.itls) {
    EXPECT_GT(itl, 0.005);
    EXPECT_LT(itl, 1.0);
  }
  EXPECT_GE(r.e2el, r.ttft + 0.05);
  EXPECT_NEAR(r.Tpot(), (r.e2el - r.ttft) / 3, 1e-12);
  const std::string request = server.request();
  const auto body = nlohmann::json::parse(request.substr(request.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["prompt"], nlohmann::json({5, 6, 7}));
  EXPECT_EQ(body["max_tokens"], 4);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["ignore_eos"], true);
}

TEST(RunHttpRequestTest, FailuresAreCountedNeverHung) {
  Prompt prompt;
  prompt.text = "Hello";
  RequestOptions options;
  options.output_len = 4;
  options.timeout = absl::Milliseconds(300);
  {  // the stream ends without [DONE]
    CannedServer server(
        {{absl::ZeroDuration(),
          CannedServer::ChunkedSseHead() + CannedServer::Chunk(Event(" a")) + "0\r\n\r\n"}});
    const RequestResult r = RunHttpRequest({"127.0.0.1", server.port()}, prompt, options);
    EXPECT_FALSE(r.success);
    EXPECT_THAT(r.error, HasSubstr("[DONE]"));
  }
  {  // an error event in the stream
    CannedServer server(
        {{absl::ZeroDuration(), CannedServer::ChunkedSseHead() +
                                    CannedServer::Chunk(R"(data: {"error":{"message":"boom"}})"
                                                        "\n\n")}});
    const RequestResult r = RunHttpRequest({"127.0.0.1", server.port()}, prompt, options);
    EXPECT_FALSE(r.success);
    EXPECT_THAT(r.error, HasSubstr("boom"));
  }
  {  // a server that stops sending
    CannedServer server(
        {{absl::ZeroDuration(), CannedServer::ChunkedSseHead() + CannedServer::Chunk(Event(" a"))}},
        absl::Seconds(5));
    const util::Instant start = util::Instant::Now();
    const RequestResult r = RunHttpRequest({"127.0.0.1", server.port()}, prompt, options);
    EXPECT_FALSE(r.success);
    EXPECT_THAT(r.error, HasSubstr("DEADLINE_EXCEEDED"));
    EXPECT_LT(util::Since(start), absl::Seconds(2));
  }
}

TEST(DispatchTest, ArrivalTimesAndTheConcurrencyCap) {
  constexpr int kRequests = 12;
  absl::Mutex mu;
  int in_flight = 0, most = 0, launched = 0;
  std::vector<double> started(kRequests, -1);
  const util::Instant start = util::Instant::Now();
  std::atomic<int> progress_calls{0};
  int last_done = -1;
  // The last request arrives at 0.3 s; the others at once. At most 3 in flight: each request
  // holds on until three run together (or no more can come), so the cap, not timing, decides.
  std::vector<double> arrivals(kRequests, 0.0);
  arrivals.back() = 0.3;
  Dispatch(
      arrivals, 3,
      [&](int i) {
        absl::MutexLock lock(&mu);
        started[i] = absl::ToDoubleSeconds(util::Since(start));
        ++launched;
        most = std::max(most, ++in_flight);
        EXPECT_LE(in_flight, 3);
        auto full = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
          return in_flight >= 3 || launched == kRequests;
        };
        EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&full), absl::Seconds(30)));
        --in_flight;
      },
      [&](int done, int total) {
        EXPECT_EQ(total, kRequests);
        EXPECT_GE(done, last_done);
        last_done = done;
        ++progress_calls;
      });
  EXPECT_EQ(most, 3);
  EXPECT_EQ(last_done, kRequests);
  EXPECT_GE(progress_calls.load(), 1);
  for (int i = 0; i < kRequests; ++i) EXPECT_GE(started[i], 0) << i;
  EXPECT_GE(started.back(), 0.3);  // not before its arrival time
}

TEST(DispatchTest, NoCapSendsEveryArrivalAtOnce) {
  absl::Mutex mu;
  int in_flight = 0, most = 0;
  Dispatch(
      std::vector<double>(16, 0.0), 0,
      [&](int) {
        absl::MutexLock lock(&mu);
        most = std::max(most, ++in_flight);
        // All sixteen run at once, or this waits in vain.
        auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return most == 16; };
        EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(30)));
        --in_flight;
      },
      [](int, int) {});
  EXPECT_EQ(most, 16);
}

TEST(ReadPromptFileTest, NonBlankLines) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/prompts.txt";
  std::ofstream(path) << "first\r\n\n   \nsecond line\n";
  auto prompts = ReadPromptFile(path);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  EXPECT_THAT(*prompts, ElementsAre("first", "second line"));
  std::ofstream(path) << "\n\n";
  EXPECT_FALSE(ReadPromptFile(path).ok());
  EXPECT_FALSE(ReadPromptFile(dir.path() + "/missing").ok());
}

}  // namespace
}  // namespace tandem::cli::bench
