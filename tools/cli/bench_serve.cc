// tandem bench serve: the serving benchmark (bench_serve_lib.h) against a running gateway or
// tandem-serve, through the gRPC API (the SDK) or the OpenAI-compatible HTTP API.
//   tandem bench serve --endpoint HOST:PORT [--backend grpc|http]
//       [--dataset random|shared_prefix|multi_turn --input_len N [--prefix_len P]
//        [--turns T] (--model DIR | --vocab_size V) | --dataset file --dataset_path FILE]
//        [--output_len N --num_prompts N --request_rate R|inf
//        --max_concurrency C --seed S --goodput ttft:MS,tpot:MS,e2el:MS --label TEXT
//        --model_name NAME --timeout_s S --out RESULT.json]
// Prints a summary table to stdout, a progress bar to stderr when stderr is a terminal, and
// writes every number (and each request's timings) to --out.
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/model/model_dir.h"
#include "common/util/clock.h"
#include "tandem/client.h"
#include "tools/cli/bench_serve_lib.h"
#include "tools/cli/commands.h"

ABSL_FLAG(std::string, backend, "grpc",
          "bench serve: grpc (the gateway gRPC API through the C++ SDK) or http (the "
          "OpenAI-compatible POST /v1/completions, streamed; --endpoint is then the HTTP port).");
ABSL_FLAG(std::string, dataset, "random",
          "bench serve: random (--input_len random token ids per prompt, ids >= 3 below the "
          "vocabulary size), shared_prefix (one --prefix_len prefix of random ids, a system "
          "prompt, then --input_len ids of each prompt's own), multi_turn (conversations of "
          "--turns turns, each turn resending the history: the previous prompt, its reply and a "
          "new --input_len question; gRPC only; --num_prompts counts turns) or file "
          "(--dataset_path, one prompt a line, cycled).");
ABSL_FLAG(int, prefix_len, 512, "bench serve: the shared prefix of --dataset shared_prefix.");
ABSL_FLAG(int, turns, 4, "bench serve: turns of each conversation of --dataset multi_turn.");
ABSL_FLAG(std::string, dataset_path, "", "bench serve: the prompt file of --dataset file.");
ABSL_FLAG(int, input_len, 128, "bench serve: prompt tokens of each random prompt.");
ABSL_FLAG(int, output_len, 64,
          "bench serve: tokens every request generates (EOS ignored, so all are this long).");
ABSL_FLAG(int, num_prompts, 100, "bench serve: requests to send.");
ABSL_FLAG(int, logprobs, -1,
          "bench serve: ask for each token's log-probability and this many alternatives "
          "(0 to 20; -1: none), to measure what log-probabilities cost.");
ABSL_FLAG(std::string, request_rate, "inf",
          "bench serve: requests per second, arriving as a Poisson process drawn from --seed; "
          "inf sends them all at once.");
ABSL_FLAG(int, max_concurrency, 0,
          "bench serve: at most this many requests in flight (0 = no cap); combines with "
          "--request_rate.");
ABSL_FLAG(std::string, goodput, "",
          "bench serve: service-level objectives in ms for request goodput, e.g. "
          "ttft:500,tpot:50,e2el:2000 (any subset).");
ABSL_FLAG(std::string, label, "",
          "bench serve: free text stored in the result (e.g. disaggregated, colocated).");
ABSL_FLAG(int64_t, vocab_size, 0,
          "bench serve: vocabulary size for random prompts; 0 = vocab_size from --model DIR's "
          "config.json.");
ABSL_FLAG(std::string, model_name, "",
          "bench serve: the model name sent with each request; empty = the server's only one.");

namespace tandem::cli {
namespace {

absl::StatusOr<int64_t> VocabSize() {
  if (const int64_t v = absl::GetFlag(FLAGS_vocab_size); v > 0) return v;
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        "--dataset random needs the vocabulary size: --vocab_size V or --model DIR");
  }
  auto model = model::ModelDir::Open(dir);
  if (!model.ok()) return model.status();
  return (*model)->config().vocab_size;
}

absl::StatusOr<std::vector<bench::Prompt>> Prompts(uint64_t seed) {
  const std::string dataset = absl::GetFlag(FLAGS_dataset);
  const int n = absl::GetFlag(FLAGS_num_prompts);
  std::vector<bench::Prompt> prompts(n);
  if (dataset == "random" || dataset == "shared_prefix" || dataset == "multi_turn") {
    const int input_len = absl::GetFlag(FLAGS_input_len);
    if (input_len < 1) return absl::InvalidArgumentError("--input_len must be at least 1");
    auto vocab = VocabSize();
    if (!vocab.ok()) return vocab.status();
    if (*vocab <= bench::kFirstRandomTokenId) {
      return absl::InvalidArgumentError(absl::StrCat("vocabulary size ", *vocab, " is too small"));
    }
    // multi_turn: each turn's question; the prompts are built as the replies come.
    std::vector<std::vector<int32_t>> ids;
    if (dataset == "shared_prefix") {
      const int prefix_len = absl::GetFlag(FLAGS_prefix_len);
      if (prefix_len < 1) return absl::InvalidArgumentError("--prefix_len must be at least 1");
      ids = bench::SharedPrefixPrompts(n, prefix_len, input_len, *vocab, seed);
    } else {
      ids = bench::RandomPrompts(n, input_len, *vocab, seed);
    }
    for (int i = 0; i < n; ++i) prompts[i].token_ids = std::move(ids[i]);
  } else if (dataset == "file") {
    if (absl::GetFlag(FLAGS_dataset_path).empty()) {
      return absl::InvalidArgumentError("--dataset file needs --dataset_path FILE");
    }
    auto lines = bench::ReadPromptFile(absl::GetFlag(FLAGS_dataset_path));
    if (!lines.ok()) return lines.status();
    for (int i = 0; i < n; ++i) prompts[i].text = (*lines)[i % lines->size()];
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dataset ", dataset, ": expected random, shared_prefix, multi_turn or file"));
  }
  return prompts;
}

void DrawProgress(int done, int total, util::Instant start) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? done * kWidth / total : kWidth;
  std::cerr << absl::StrFormat("\rbench serve [%s%s] %d/%d requests, %.1f s",
                               std::string(filled, '#'), std::string(kWidth - filled, '.'), done,
                               total, absl::ToDoubleSeconds(util::Since(start)))
            << std::flush;
}

}  // namespace

int BenchServe() {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "grpc" && backend != "http") {
    return Report(
        absl::InvalidArgumentError(absl::StrCat("--backend ", backend, ": expected grpc or http")));
  }
  const int num_prompts = absl::GetFlag(FLAGS_num_prompts);
  const int output_len = absl::GetFlag(FLAGS_output_len);
  const int max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
  if (num_prompts < 1 || output_len < 1 || max_concurrency < 0) {
    return Report(absl::InvalidArgumentError(
        "--num_prompts and --output_len must be at least 1, --max_concurrency at least 0"));
  }
  auto rate = bench::ParseRequestRate(absl::GetFlag(FLAGS_request_rate));
  if (!rate.ok()) return Report(rate.status());
  auto slos = bench::ParseSlos(absl::GetFlag(FLAGS_goodput));
  if (!slos.ok()) return Report(slos.status());
  const uint64_t seed = static_cast<uint64_t>(std::max<int64_t>(absl::GetFlag(FLAGS_seed), 0));
  auto prompts = Prompts(seed);
  if (!prompts.ok()) return Report(prompts.status());
  // multi_turn: the requests are conversations, each a chain of --turns turns.
  const bool multi_turn = absl::GetFlag(FLAGS_dataset) == "multi_turn";
  const int turns = multi_turn ? absl::GetFlag(FLAGS_turns) : 1;
  if (multi_turn && (turns < 1 || num_prompts % turns != 0 || backend != "grpc")) {
    return Report(absl::InvalidArgumentError(
        "--dataset multi_turn needs --backend grpc (the replies' token ids) and --turns of at "
        "least 1 dividing --num_prompts"));
  }
  const std::vector<double> arrivals = bench::ArrivalTimes(num_prompts / turns, *rate, seed);

  bench::RequestOptions options;
  options.model = absl::GetFlag(FLAGS_model_name);
  options.output_len = output_len;
  options.logprobs = absl::GetFlag(FLAGS_logprobs);
  if (options.logprobs < -1 || options.logprobs > 20) {
    return Report(absl::InvalidArgumentError("--logprobs must be in [0, 20], or -1 for none"));
  }
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  const std::string endpoint = absl::GetFlag(FLAGS_endpoint);
  std::function<bench::RequestResult(const bench::Prompt&)> run;
  std::unique_ptr<sdk::Client> client;
  if (backend == "grpc") {
    sdk::ClientOptions client_options;
    client_options.timeout = options.timeout;
    auto connected = sdk::Client::Connect(endpoint, client_options);
    if (!connected.ok()) return Report(connected.status());
    client = *std::move(connected);
    run = [&](const bench::Prompt& p) { return bench::RunGrpcRequest(*client, p, options); };
  } else {
    auto host_port = ParseHostPort(endpoint);
    if (!host_port.ok()) return Report(host_port.status());
    run = [&options, target = *host_port](const bench::Prompt& p) {
      return bench::RunHttpRequest(target, p, options);
    };
  }

  // One request first, not counted (as vLLM's benchmark does): a misconfigured endpoint fails
  // here with its error instead of as num_prompts failures, and the server is warm.
  const bench::RequestResult probe = run((*prompts)[0]);
  if (!probe.success) {
    return Report(absl::FailedPreconditionError(
        absl::StrCat("the first (warm-up) request to ", endpoint, " failed: ", probe.error)));
  }

  bench::RunInfo info;
  info.date = absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone());
  info.backend = backend;
  info.endpoint = endpoint;
  info.label = absl::GetFlag(FLAGS_label);
  info.model = options.model;
  info.dataset = absl::GetFlag(FLAGS_dataset);
  info.request_rate = *rate;
  info.max_concurrency = max_concurrency;
  info.num_prompts = num_prompts;
  info.input_len = info.dataset == "file" ? 0 : absl::GetFlag(FLAGS_input_len);
  info.prefix_len = info.dataset == "shared_prefix" ? absl::GetFlag(FLAGS_prefix_len) : 0;
  info.turns = multi_turn ? turns : 0;
  info.output_len = output_len;
  info.logprobs = options.logprobs;
  info.seed = seed;
  std::cerr << absl::StrCat(
      "bench serve: ", num_prompts, " requests to ", endpoint, " (", backend, ") at ",
      std::isinf(*rate) ? "once" : absl::StrCat(*rate, " requests/s"),
      max_concurrency > 0 ? absl::StrCat(", at most ", max_concurrency, " in flight") : "", "\n");

  std::vector<bench::RequestResult> results(num_prompts);
  const bool tty = isatty(STDERR_FILENO) == 1;
  const util::Instant start = util::Instant::Now();
  // A conversation's turns go one after another, each resending the history.
  auto send = [&](int i) {
    if (!multi_turn) {
      results[i] = run((*prompts)[i]);
      return;
    }
    bench::Prompt turn = (*prompts)[i * turns];
    for (int t = 0; t < turns; ++t) {
      bench::RequestResult& r = results[i * turns + t];
      r = run(turn);
      if (!r.success) {
        for (int rest = t + 1; rest < turns; ++rest) {
          results[i * turns + rest].error = "an earlier turn of its conversation failed";
        }
        break;
      }
      if (t + 1 == turns) break;
      turn.token_ids =
          bench::NextTurn(turn.token_ids, r.output_ids, (*prompts)[i * turns + t + 1].token_ids);
    }
  };
  bench::Dispatch(arrivals, max_concurrency, send, [&](int done, int total) {
    if (tty) DrawProgress(done, total, start);
  });
  const double duration = absl::ToDoubleSeconds(util::Since(start));
  if (tty) std::cerr << "\n";

  const bench::Summary summary = bench::Summarize(results, duration, *slos);
  std::cout << bench::SummaryTable(info, summary) << std::flush;
  std::map<std::string, int> errors;
  for (const auto& r : results) {
    if (!r.success) ++errors[r.error];
  }
  for (const auto& [error, count] : errors) {
    std::cerr << "bench serve: " << count << " request(s) failed: " << error << "\n";
  }
  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    std::ofstream file(out);
    file << bench::ResultJson(info, summary, *slos, results).dump(1) << "\n";
    if (!file) return Report(absl::InternalError("cannot write " + out));
    std::cerr << "bench serve: result in " << out << "\n";
  }
  if (summary.completed == 0) {
    return Report(absl::UnavailableError("every request failed"));
  }
  return 0;
}

}  // namespace tandem::cli
