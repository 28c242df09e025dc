// The parts of `tandem bench serve` (bench_serve.cc) that a test can reach: the request
// schedule and prompts, one streamed request per backend (gRPC through the SDK, or the
// OpenAI-compatible HTTP API), the statistics and the result JSON. The benchmark follows
// vLLM's benchmark_serving.py: requests arrive by a seeded Poisson process (or all at once),
// optionally capped in flight; each streams exactly --output_len tokens (EOS ignored); time to
// first token, inter-token latencies, time per output token and end-to-end latency are kept
// per request and summarised as mean/median/p90/p99.
//
// Times are seconds in RequestResult and the per-request JSON arrays, milliseconds in the
// summary statistics (as in vLLM's result files).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tandem/client.h"
#include "tools/cli/event_stream.h"

namespace tandem::cli::bench {

// Random prompts avoid the ids below this (SentencePiece's unk, BOS and EOS).
constexpr int32_t kFirstRandomTokenId = 3;

// "inf" (or "infinity") or a positive number of requests per second.
absl::StatusOr<double> ParseRequestRate(absl::string_view text);

// Send times, in seconds after the start, of `n` requests arriving at `rate` per second as a
// Poisson process: the first at 0, then exponential gaps of mean 1/rate drawn from `seed`
// (the same seed gives the same schedule everywhere). All 0 when `rate` is infinite.
std::vector<double> ArrivalTimes(int n, double rate, uint64_t seed);

// `n` prompts of `input_len` token ids, uniform in [kFirstRandomTokenId, vocab_size), drawn
// from `seed` (a stream independent of ArrivalTimes' for the same seed).
std::vector<std::vector<int32_t>> RandomPrompts(int n, int input_len, int64_t vocab_size,
                                                uint64_t seed);

// `n` prompts sharing one prefix (a system prompt): `prefix_len` random ids, the same in every
// prompt, then `input_len` random ids of each prompt's own (its question). From `seed`, as
// RandomPrompts.
std::vector<std::vector<int32_t>> SharedPrefixPrompts(int n, int prefix_len, int input_len,
                                                      int64_t vocab_size, uint64_t seed);

// The prompt of a conversation's next turn, which resends its history: the previous turn's
// prompt, the reply generated for it, then the new question.
std::vector<int32_t> NextTurn(const std::vector<int32_t>& previous_prompt,
                              const std::vector<int32_t>& reply,
                              const std::vector<int32_t>& question);

// The non-blank lines of a text file (without their line ends); an error if there are none.
absl::StatusOr<std::vector<std::string>> ReadPromptFile(const std::string& path);

// Service-level objectives for goodput, in milliseconds; unset ones are not checked.
struct Slos {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
};
// "ttft:500,tpot:50,e2el:2000" (any subset, any order; "" = none).
absl::StatusOr<Slos> ParseSlos(absl::string_view text);

// What one request did.
struct RequestResult {
  bool success = false;
  std::string error;                // why it failed; empty on success
  int64_t prompt_tokens = 0;        // from the final usage (or the prompt's known length)
  int64_t output_tokens = 0;        // from the final usage (or the tokens counted in the stream)
  std::vector<int32_t> output_ids;  // the generated token ids (gRPC backend only)
  double ttft = 0;                  // seconds from sending to the first token
  double e2el = 0;                  // seconds from sending to the end of the stream
  // Seconds between successive tokens: a chunk carrying n tokens after a gap g gives n
  // entries of g/n; tokens that arrive with the first token give entries of 0.
  std::vector<double> itls;

  // (e2el - ttft) / (output_tokens - 1); 0 for requests with one token or none.
  double Tpot() const;
};

// Turns the arrival times of token-carrying chunks into ttft and itls.
class StreamTimer {
 public:
  // A chunk carrying `tokens` (> 0) tokens arrived `seconds` after the request was sent.
  void OnChunk(double seconds, int tokens);
  bool started() const { return last_ >= 0; }
  int64_t tokens() const { return tokens_; }
  // Copies ttft and itls into `result`.
  void Fill(RequestResult* result) const;

 private:
  double ttft_ = 0;
  double last_ = -1;
  int64_t tokens_ = 0;
  std::vector<double> itls_;
};

// One prompt as sent: token ids (random dataset) or text (file dataset).
struct Prompt {
  std::vector<int32_t> token_ids;
  std::string text;
};

struct RequestOptions {
  std::string model;   // the model name sent with each request; empty = the server's only one
  int output_len = 0;  // max_tokens, with EOS ignored
  int logprobs = -1;   // each token's log-probability and this many alternatives; -1: none
  absl::Duration timeout = absl::Seconds(120);
};

// Streams one generation through the gateway gRPC API (GenerateStream; the client's own
// deadline applies) and times it. Never throws or hangs past the deadline: failures are in
// the result.
RequestResult RunGrpcRequest(sdk::Client& client, const Prompt& prompt,
                             const RequestOptions& options);

// The body of POST /v1/completions for `prompt`: streamed, greedy, ignore_eos, with usage.
std::string CompletionRequestBody(const Prompt& prompt, const RequestOptions& options);

// One event of a streamed completion.
struct CompletionEvent {
  bool done = false;                         // the "[DONE]" sentinel
  bool has_choice = false;                   // a non-empty "choices" array
  std::string text;                          // choices[0].text
  std::string finish_reason;                 // choices[0].finish_reason; empty while null
  std::optional<int64_t> prompt_tokens;      // usage.prompt_tokens
  std::optional<int64_t> completion_tokens;  // usage.completion_tokens
};
// Parses an event's data; an error for text that is not JSON and for an {"error": ...} event.
absl::StatusOr<CompletionEvent> ParseCompletionEvent(absl::string_view data);

// Streams one completion through POST /v1/completions on `endpoint` and times it: each event
// with a choice counts as a chunk of one token (an OpenAI chunk does not say how many tokens
// made its text), except a choice with no text that only reports the finish reason; the final
// usage gives the token counts. A stream that ends without "[DONE]" is a failure.
RequestResult RunHttpRequest(const HostPort& endpoint, const Prompt& prompt,
                             const RequestOptions& options);

// Calls send(i) for i = 0..n-1 (n = arrivals.size()), each on a thread of its own, no earlier
// than arrivals[i] seconds after the start and, when max_concurrency > 0, only while fewer
// than max_concurrency calls are in flight (so a call may start after its arrival time).
// `progress(done, n)` is called from the calling thread every ~100 ms and at the end. Returns
// when every call has returned: send must itself return by a deadline.
void Dispatch(const std::vector<double>& arrivals, int max_concurrency,
              const std::function<void(int)>& send,
              const std::function<void(int done, int total)>& progress);

// Linear interpolation between closest ranks (numpy.percentile's default); p in [0, 100].
// 0 for no values.
double Percentile(std::vector<double> values, double p);

// Milliseconds.
struct Distribution {
  double mean = 0;
  double std = 0;  // population standard deviation
  double median = 0;
  double p90 = 0;
  double p99 = 0;
};
Distribution Describe(const std::vector<double>& seconds);

// True when `r` succeeded and meets every set objective (a request of one token has TPOT 0).
bool MeetsSlos(const RequestResult& r, const Slos& slos);

struct Summary {
  double duration = 0;  // seconds, from the first send to the last response
  int completed = 0;
  int failed = 0;
  int64_t total_input_tokens = 0;   // of completed requests
  int64_t total_output_tokens = 0;  // of completed requests
  double request_throughput = 0;    // completed / duration
  double output_throughput = 0;     // output tokens / duration
  double total_token_throughput = 0;
  Distribution ttft, tpot, itl, e2el;     // tpot over requests of > 1 token; itl over all tokens
  int good = 0;                           // completed requests meeting every SLO
  std::optional<double> request_goodput;  // good / duration; unset when no SLOs were given
};
Summary Summarize(const std::vector<RequestResult>& results, double duration, const Slos& slos);

// How the run was set up, as recorded in the result.
struct RunInfo {
  std::string date;  // "YYYYmmdd-HHMMSS", local time
  std::string backend;
  std::string endpoint;
  std::string label;
  std::string model;
  std::string dataset;
  double request_rate = 0;  // requests/s; infinity = all at once
  int max_concurrency = 0;  // 0 = no cap
  int num_prompts = 0;
  int input_len = 0;
  int prefix_len = 0;  // shared_prefix: the prompts' common prefix
  int turns = 0;       // multi_turn: turns of each conversation
  int output_len = 0;
  int logprobs = -1;
  uint64_t seed = 0;
};

// The result file: vLLM's keys ("date", "backend", ..., "mean_ttft_ms", ..., "ttfts", "itls",
// "errors") plus "label", "e2els" and the run's lengths and seed. request_rate is "inf" for
// an infinite rate; max_concurrency and request_goodput are null when unset.
nlohmann::json ResultJson(const RunInfo& info, const Summary& summary, const Slos& slos,
                          const std::vector<RequestResult>& results);

// The human-readable summary table printed to stdout.
std::string SummaryTable(const RunInfo& info, const Summary& summary);

}  // namespace tandem::cli::bench
