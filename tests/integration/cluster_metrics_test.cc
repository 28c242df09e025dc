// Starts the three service binaries on ephemeral loopback ports, waits for readiness, sends
// RPCs through the SDK, scrapes every /metrics with a real Prometheus server (Debian's
// `prometheus`, started here with a temporary config and data dir), checks the samples through
// its HTTP query API, and stops everything with SIGTERM, leaving no process behind. Then the
// shipped deploy/prometheus config and rules run against a cluster under load (a streamed,
// mixed-width decoder, so that every panel has data), and every recording rule and every query
// of the Grafana dashboard (deploy/grafana) must return series.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/http/client.h"
#include "common/http/http_server.h"
#include "common/util/clock.h"
#include "nlohmann/json.hpp"
#include "tandem/client.h"
#include "tests/testing/mixed_width_model.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using testing::Ports;
using testing::Subprocess;

constexpr char kPrometheus[] = "/usr/bin/prometheus";

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

bool Ready(int http_port) {
  auto r = http::Fetch("127.0.0.1", http_port, "GET", "/readyz", "", 1000);
  return r.ok() && r->status == 200;
}

// Runs an instant query; returns the result vector (empty when no series).
absl::StatusOr<nlohmann::json> Query(int port, const std::string& promql) {
  std::string encoded;
  for (unsigned char c : promql) {
    if (isalnum(c) || c == '_') {
      encoded += static_cast<char>(c);
    } else {
      encoded += absl::StrCat("%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  auto r = http::Fetch("127.0.0.1", port, "GET", "/api/v1/query?query=" + encoded, "", 5000);
  if (!r.ok()) return r.status();
  auto doc = nlohmann::json::parse(r->body, nullptr, false);
  if (doc.is_discarded() || doc.value("status", "") != "success") {
    return absl::InternalError("prometheus query failed: " + r->body);
  }
  return doc["data"]["result"];
}

// The value of the first series an instant query returns; -1 when none.
double Value(int port, const std::string& promql) {
  auto result = Query(port, promql);
  if (!result.ok() || result->empty()) return -1;
  return std::stod((*result)[0]["value"][1].get<std::string>());
}

class ClusterMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kPrometheus)) {
      GTEST_FAIL() << kPrometheus << " missing: scripts/setup.sh installs Debian's prometheus";
    }
    model_ = testing::SourceDir() + "/models/tiny-moe";
  }

  Ports StartService(const std::string& binary, const std::vector<std::string>& extra) {
    absl::StatusOr<Ports> ports = services_.Start(binary, extra);
    EXPECT_TRUE(ports.ok()) << ports.status();
    return ports.ok() ? *ports : Ports{};
  }

  // Starts Prometheus on a free port with the config at `config_path`; its data in dir_.
  absl::StatusOr<Subprocess> StartPrometheus(const std::string& config_path, int* port) {
    *port = FreePort();
    return Subprocess::Start({kPrometheus, "--config.file=" + config_path,
                              "--storage.tsdb.path=" + dir_.path() + "/prom-data",
                              absl::StrCat("--web.listen-address=127.0.0.1:", *port)},
                             dir_.path() + "/prometheus.log");
  }

  testing::TempDir dir_;
  std::string model_;
  testing::ServiceSet services_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_F(ClusterMetricsTest, ServicesStartServeMetricsToPrometheusAndDrain) {
  const Ports prefill = StartService("tandem-prefill", {});
  const Ports decode = StartService("tandem-decode", {});
  const Ports gateway =
      StartService("tandem-gateway", {absl::StrCat("--prefill=127.0.0.1:", prefill.grpc_port),
                                      absl::StrCat("--decode=127.0.0.1:", decode.grpc_port)});
  ASSERT_FALSE(HasFailure());
  for (const Ports& p : {prefill, decode, gateway}) {
    ASSERT_TRUE(testing::WaitUntil([&] { return Ready(p.http_port); }, absl::Seconds(20)))
        << "port " << p.http_port << " never became ready";
  }

  // Real RPCs through the SDK, so the metrics have something to count.
  auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", gateway.grpc_port));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Health().ok());
  auto models = (*client)->ListModels();
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->models_size(), 1);
  EXPECT_EQ(models->models(0).name(), "tiny-moe");
  EXPECT_EQ(models->models(0).context_length(), 512);
  v1::TokenizeRequest tokenize;
  tokenize.set_text("The jury said it did find that");
  auto tokens = (*client)->Tokenize(tokenize);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_GT(tokens->token_ids_size(), 2);
  EXPECT_EQ(tokens->token_ids(0), 1);  // BOS, as tokenizer_config.json says
  v1::GenerateRequest generate;
  generate.set_prompt("Hello");
  generate.mutable_sampling()->set_max_tokens(4);
  auto generated = (*client)->Generate(generate);
  ASSERT_TRUE(generated.ok()) << generated.status();
  EXPECT_EQ(generated->token_ids_size(), generated->usage().completion_tokens());
  EXPECT_GT(generated->token_ids_size(), 0);
  generate.mutable_sampling()->set_temperature(-1);
  EXPECT_EQ((*client)->Generate(generate).status().code(), absl::StatusCode::kInvalidArgument);
  v1::GenerateRequest bad_ids;
  bad_ids.mutable_prompt_token_ids()->add_ids(999999);
  auto bad = (*client)->Generate(bad_ids);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("outside the vocabulary"));

  // A real Prometheus scrapes all three.
  int prom_port = 0;
  const std::string config_path = dir_.path() + "/prometheus.yml";
  {
    std::ofstream config(config_path);
    config << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
           << "  - job_name: tandem\n    static_configs:\n      - targets: ['127.0.0.1:"
           << prefill.http_port << "', '127.0.0.1:" << decode.http_port
           << "', '127.0.0.1:" << gateway.http_port << "']\n";
  }
  auto prometheus = StartPrometheus(config_path, &prom_port);
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();

  std::optional<nlohmann::json> build_info;
  const bool scraped = testing::WaitUntil(
      [&] {
        auto result = Query(prom_port, "tandem_build_info");
        if (result.ok() && result->size() == 3) build_info = *result;
        return build_info.has_value();
      },
      absl::Seconds(60));
  ASSERT_TRUE(scraped) << "Prometheus never had all three tandem_build_info series";
  std::set<std::string> roles;
  for (const auto& series : *build_info) roles.insert(series["metric"]["role"]);
  EXPECT_EQ(roles, (std::set<std::string>{"decode", "gateway", "prefill"}));

  auto up = Query(prom_port, "sum(up{job=\"tandem\"})");
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_EQ(up->size(), 1u);
  EXPECT_EQ((*up)[0]["value"][1], "3");

  auto tokenized =
      Query(prom_port, "tandem_rpc_requests_total{role=\"gateway\",rpc=\"Tokenize\",code=\"OK\"}");
  ASSERT_TRUE(tokenized.ok());
  ASSERT_EQ(tokenized->size(), 1u);
  EXPECT_EQ((*tokenized)[0]["value"][1], "1");
  auto invalid = Query(
      prom_port, "sum(tandem_rpc_requests_total{rpc=\"Generate\",code=\"INVALID_ARGUMENT\"})");
  ASSERT_TRUE(invalid.ok());
  ASSERT_EQ(invalid->size(), 1u);
  EXPECT_EQ((*invalid)[0]["value"][1], "2");
  auto histogram = Query(prom_port, "tandem_rpc_duration_seconds_count{rpc=\"ListModels\"}");
  ASSERT_TRUE(histogram.ok());
  EXPECT_EQ(histogram->size(), 1u);

  // The serving metrics of the one real generation: its request, first token, KV transfer
  // and decode steps, each from the role that saw it.
  auto value = [&](const std::string& promql) { return Value(prom_port, promql); };
  EXPECT_EQ(value("tandem_requests_total{role=\"gateway\",outcome=\"ok\"}"), 1);
  EXPECT_EQ(value("tandem_time_to_first_token_seconds_count{role=\"gateway\"}"), 1);
  EXPECT_EQ(value("tandem_prompt_tokens_total{role=\"gateway\"}"),
            generated->usage().prompt_tokens());
  EXPECT_EQ(value("tandem_generation_tokens_total{role=\"gateway\"}"),
            generated->usage().completion_tokens());
  EXPECT_EQ(value("tandem_request_generation_tokens_count{role=\"gateway\"}"), 1);
  // Every series names the model it serves.
  EXPECT_EQ(value("count(tandem_build_info{model=\"tiny-moe\"})"), 3);
  EXPECT_GT(value("tandem_kv_transfer_bytes_total{role=\"prefill\"}"), 0);
  EXPECT_EQ(value("tandem_kv_transfer_failures_total{role=\"prefill\"}"), 0);
  EXPECT_GT(value("tandem_decode_step_seconds_count{role=\"decode\"}"), 0);
  EXPECT_GT(value("tandem_generated_tokens_total{role=\"decode\"}"), 0);
  EXPECT_GT(value("tandem_kv_blocks{role=\"decode\",state=\"free\"}"), 0);

  // Every metric the services export is documented in docs/metrics.md.
  const std::string documented = ReadFile(testing::SourceDir() + "/docs/metrics.md");
  int families = 0;
  for (const Ports& p : {prefill, decode, gateway}) {
    auto page = http::Fetch("127.0.0.1", p.http_port, "GET", "/metrics", "", 5000);
    ASSERT_TRUE(page.ok());
    for (absl::string_view line : absl::StrSplit(page->body, '\n')) {
      if (!absl::ConsumePrefix(&line, "# TYPE ")) continue;
      const std::string name(line.substr(0, line.find(' ')));
      ++families;
      EXPECT_TRUE(absl::StrContains(documented, "`" + name + "`"))
          << name << " is not in docs/metrics.md";
    }
  }
  EXPECT_GE(families, 30);

  // Graceful drain: SIGTERM, exit status 0, nothing left running.
  for (Subprocess& p : services_.processes()) {
    auto status = p.Stop(SIGTERM, absl::Seconds(15));
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
    EXPECT_FALSE(p.Running());
  }
  for (const Ports& p : {prefill, decode, gateway}) {
    EXPECT_NE(kill(p.pid, 0), 0) << "pid " << p.pid << " still exists";
  }
  EXPECT_TRUE(prometheus->Stop(SIGTERM, absl::Seconds(15)).ok());
}

TEST_F(ClusterMetricsTest, ShippedRulesAndDashboardQueriesAllAnswerFromALiveCluster) {
  // The decoder streams a tiered plan's experts from a pack, so expert panels have data too.
  auto prepared = testing::MakeMixedWidthModel(dir_.path());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  const std::string& reordered = prepared->model_dir;
  const std::string& tiered = prepared->plan;
  const std::string& pack = prepared->pack;
  testing::ServiceSet set(reordered);
  auto prefill = set.Start("tandem-prefill", {});
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  auto decode = set.Start("tandem-decode", {"--plan=" + tiered, "--expert_pack=" + pack,
                                            absl::StrCat("--expert_cache_bytes=", 4 << 20)});
  ASSERT_TRUE(decode.ok()) << decode.status();
  auto gateway =
      set.Start("tandem-gateway", {absl::StrCat("--prefill=127.0.0.1:", prefill->grpc_port),
                                   absl::StrCat("--decode=127.0.0.1:", decode->grpc_port)});
  ASSERT_TRUE(gateway.ok()) << gateway.status();

  // The shipped config, scraping and evaluating every second, with this cluster as its targets.
  const std::string deploy = testing::SourceDir() + "/deploy/prometheus";
  const std::string config_dir = dir_.path() + "/prometheus";
  std::filesystem::create_directories(config_dir + "/targets");
  std::filesystem::copy(deploy + "/rules", config_dir + "/rules");
  {
    std::ofstream config(config_dir + "/prometheus.yml");
    config << absl::StrReplaceAll(ReadFile(deploy + "/prometheus.yml"),
                                  {{"scrape_interval: 5s", "scrape_interval: 1s"},
                                   {"evaluation_interval: 5s", "evaluation_interval: 1s"},
                                   {"refresh_interval: 10s", "refresh_interval: 1s"}});
    std::ofstream targets(config_dir + "/targets/test.json");
    targets << nlohmann::json::array({{{"labels", {{"cluster", "test"}}},
                                       {"targets",
                                        {absl::StrCat("127.0.0.1:", prefill->http_port),
                                         absl::StrCat("127.0.0.1:", decode->http_port),
                                         absl::StrCat("127.0.0.1:", gateway->http_port)}}}})
                   .dump();
  }
  int prom_port = 0;
  auto prometheus = StartPrometheus(config_dir + "/prometheus.yml", &prom_port);
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();

  // A short load: 4 gRPC clients and the OpenAI HTTP API, for about ten seconds.
  std::atomic<int> generated{0};
  std::vector<std::thread> clients;
  const util::Instant until = util::Instant::Now() + absl::Seconds(10);
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", gateway->grpc_port));
      if (!client.ok()) return;
      while (util::Instant::Now() < until) {
        v1::GenerateRequest request;
        request.set_prompt(c % 2 ? "The jury said it did find that" : "She opened the door and");
        request.mutable_sampling()->set_max_tokens(24);
        request.mutable_sampling()->set_ignore_eos(true);
        if ((*client)->Generate(request).ok()) ++generated;
        request.mutable_sampling()->set_temperature(-1);  // bad input: an RPC error
        if (c == 0) (void)(*client)->Generate(request);
      }
    });
  }
  clients.emplace_back([&] {
    while (util::Instant::Now() < until) {
      (void)http::Fetch("127.0.0.1", gateway->http_port, "POST", "/v1/completions",
                        R"({"prompt": "It is not easy to say what", "max_tokens": 16})", 30000);
      (void)http::Fetch("127.0.0.1", gateway->http_port, "POST", "/v1/completions",
                        R"({"prompt": "x", "temperature": 9})", 30000);
    }
  });
  for (auto& t : clients) t.join();
  ASSERT_GT(generated.load(), 0) << set.Log("tandem-gateway");

  // Every recording rule the shipped rules define has series.
  std::vector<std::string> records;
  for (absl::string_view line :
       absl::StrSplit(ReadFile(deploy + "/rules/tandem.rules.yml"), '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    if (absl::ConsumePrefix(&line, "- record: ")) records.emplace_back(line);
  }
  ASSERT_GE(records.size(), 10u);
  auto has_series = [&](const std::string& promql) {
    auto result = Query(prom_port, promql);
    return result.ok() && !result->empty();
  };
  for (const std::string& record : records) {
    EXPECT_TRUE(testing::WaitUntil([&] { return has_series(record); }, absl::Seconds(30)))
        << "recording rule " << record << " has no series";
  }
  // Every query of every dashboard panel has series, with the dashboard's variables set as
  // Grafana would (all models, a rate window).
  const nlohmann::json dashboard = nlohmann::json::parse(
      ReadFile(testing::SourceDir() + "/deploy/grafana/dashboards/tandem.json"), nullptr, false);
  ASSERT_TRUE(dashboard.is_object());
  int queries = 0;
  for (const auto& panel : dashboard["panels"]) {
    for (const auto& target : panel.value("targets", nlohmann::json::array())) {
      const std::string promql = absl::StrReplaceAll(
          target["expr"].get<std::string>(), {{"$model", ".*"}, {"$__rate_interval", "1m"}});
      ++queries;
      EXPECT_TRUE(testing::WaitUntil([&] { return has_series(promql); }, absl::Seconds(15)))
          << "panel '" << panel["title"].get<std::string>() << "': " << promql;
    }
  }
  EXPECT_GE(queries, 30);
  // Numbers, not only series: the decoder streamed experts and decoded tokens.
  auto value = [&](const std::string& promql) { return Value(prom_port, promql); };
  EXPECT_GT(value("sum(model:tandem_generated_tokens:rate1m)"), 0);
  EXPECT_GT(value("sum(rate(tandem_expert_load_bytes_total[1m]))"), 0);
  EXPECT_GT(value("sum(rate(tandem_expert_pairs_total{tier=\"cold\"}[1m]))"), 0);
  EXPECT_EQ(value("sum(tandem_gateway_instances)"), 2);
  EXPECT_GT(value("sum(rate(tandem_http_requests_total{code=\"400\"}[1m]))"), 0);
  EXPECT_TRUE(prometheus->Stop(SIGTERM, absl::Seconds(15)).ok());
}

TEST_F(ClusterMetricsTest, BadConfigurationFailsAtStartWithAClearMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--grpc_port=70000"}, "--grpc_port=70000 is not a port"},
      {{"--log_level=loud"}, "--log_level=loud"},
      {{"--no_such_flag=1"}, "unknown flag --no_such_flag"},
      {{"--model=/nonexistent"}, "--model=/nonexistent"},
      {{"--kv_block_size=0"}, "KV block size 0"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {testing::BinDir() + "/tandem-decode", "--model=" + model_};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const std::string log = dir_.path() + "/bad.log";
    std::filesystem::remove(log);
    auto proc = Subprocess::Start(argv, log);
    ASSERT_TRUE(proc.ok());
    ASSERT_TRUE(testing::WaitUntil([&] { return !proc->Running(); }, absl::Seconds(10)))
        << "did not exit for " << c.args[0];
    auto status = proc->Stop(SIGKILL, absl::Seconds(1));
    ASSERT_TRUE(status.ok());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << c.args[0];
    std::ifstream in(log);
    const std::string text(std::istreambuf_iterator<char>(in), {});
    EXPECT_THAT(text, HasSubstr(c.message)) << c.args[0];
  }
  // A config file with an unknown key names it.
  const std::string config = dir_.path() + "/decode.yaml";
  std::ofstream(config) << "grpc_prot: 5000\n";
  auto proc = Subprocess::Start(
      {testing::BinDir() + "/tandem-decode", "--model=" + model_, "--config=" + config},
      dir_.path() + "/cfg.log");
  ASSERT_TRUE(proc.ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return !proc->Running(); }, absl::Seconds(10)));
  std::ifstream in(dir_.path() + "/cfg.log");
  EXPECT_THAT(std::string(std::istreambuf_iterator<char>(in), {}),
              HasSubstr("unknown flag 'grpc_prot'"));
}

TEST_F(ClusterMetricsTest, HelpAndVersion) {
  for (const std::string binary : {"tandem-prefill", "tandem-decode", "tandem-gateway", "tandem"}) {
    for (const std::string flag : {"--help", "--version"}) {
      const std::string log = dir_.path() + "/" + binary + flag + ".log";
      auto proc = Subprocess::Start({testing::BinDir() + "/" + binary, flag}, log);
      ASSERT_TRUE(proc.ok());
      ASSERT_TRUE(testing::WaitUntil([&] { return !proc->Running(); }, absl::Seconds(10)));
      auto status = proc->Stop(SIGKILL, absl::Seconds(1));
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << binary << " " << flag;
      std::ifstream in(log);
      const std::string text(std::istreambuf_iterator<char>(in), {});
      EXPECT_THAT(text, HasSubstr(binary)) << flag;
      if (flag == "--help" && binary != "tandem") {
        EXPECT_THAT(text, HasSubstr("--grpc_port"));
        EXPECT_THAT(text, HasSubstr("--model"));
      }
    }
  }
}

}  // namespace
}  // namespace tandem
