#include "tools/cli/bench_serve_lib.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/util/clock.h"

namespace tandem::cli::bench {
namespace {

// splitmix64: spreads nearby seeds apart before they seed a Mersenne Twister.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from the top 53 bits (std::mt19937_64's sequence is fixed by the standard,
// unlike the standard distributions, so schedules are the same on every platform).
double Uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

absl::StatusOr<double> ParseRequestRate(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "inf" || lower == "infinity") return std::numeric_limits<double>::infinity();
  double rate = 0;
  if (!absl::SimpleAtod(lower, &rate) || !(rate > 0) || !std::isfinite(rate)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request rate '", text, "' is neither a positive number nor inf"));
  }
  return rate;
}

std::vector<double> ArrivalTimes(int n, double rate, uint64_t seed) {
  std::vector<double> times(std::max(n, 0), 0.0);
  if (std::isinf(rate)) return times;
  std::mt19937_64 rng(Mix(seed));
  for (int i = 1; i < n; ++i) {
    times[i] = times[i - 1] - std::log1p(-Uniform(rng)) / rate;  // exponential, mean 1/rate
  }
  return times;
}

std::vector<std::vector<int32_t>> RandomPrompts(int n, int input_len, int64_t vocab_size,
                                                uint64_t seed) {
  std::mt19937_64 rng(Mix(Mix(seed) ^ 0x70726f6d707473ULL));  // "prompts"
  const uint64_t span =
      static_cast<uint64_t>(std::max<int64_t>(vocab_size - kFirstRandomTokenId, 1));
  std::vector<std::vector<int32_t>> prompts(std::max(n, 0));
  for (auto& prompt : prompts) {
    prompt.resize(std::max(input_len, 0));
    for (int32_t& id : prompt) id = kFirstRandomTokenId + static_cast<int32_t>(rng() % span);
  }
  return prompts;
}

std::vector<std::vector<int32_t>> SharedPrefixPrompts(int n, int prefix_len, int input_len,
                                                      int64_t vocab_size, uint64_t seed) {
  // The prefix is drawn as one more prompt of a stream of its own; the questions as
  // RandomPrompts draws prompts.
  const std::vector<int32_t> prefix =
      RandomPrompts(1, prefix_len, vocab_size, Mix(seed ^ 0x707265666978ULL))[0];  // "prefix"
  std::vector<std::vector<int32_t>> prompts = RandomPrompts(n, input_len, vocab_size, seed);
  for (auto& prompt : prompts) prompt.insert(prompt.begin(), prefix.begin(), prefix.end());
  return prompts;
}

std::vector<int32_t> NextTurn(const std::vector<int32_t>& previous_prompt,
                              const std::vector<int32_t>& reply,
                              const std::vector<int32_t>& question) {
  std::vector<int32_t> prompt = previous_prompt;
  prompt.insert(prompt.end(), reply.begin(), reply.end());
  prompt.insert(prompt.end(), question.begin(), question.end());
  return prompt;
}

absl::StatusOr<std::vector<std::string>> ReadPromptFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the prompt file ", path));
  std::vector<std::string> prompts;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!absl::StripAsciiWhitespace(line).empty()) prompts.push_back(line);
  }
  if (prompts.empty()) return absl::InvalidArgumentError(path + " has no non-blank line");
  return prompts;
}

absl::StatusOr<Slos> ParseSlos(absl::string_view text) {
  Slos slos;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
    double ms = 0;
    if (parts.size() != 2 || !absl::SimpleAtod(parts[1], &ms) || !(ms > 0) || !std::isfinite(ms)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "goodput objective '", item, "' is not NAME:MILLISECONDS with a positive number"));
    }
    const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(parts[0]));
    std::optional<double>* slot = name == "ttft"   ? &slos.ttft_ms
                                  : name == "tpot" ? &slos.tpot_ms
                                  : name == "e2el" ? &slos.e2el_ms
                                                   : nullptr;
    if (slot == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("goodput objective '", name, "' is not ttft, tpot or e2el"));
    }
    if (slot->has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("goodput objective '", name, "' twice"));
    }
    *slot = ms;
  }
  return slos;
}

double RequestResult::Tpot() const {
  return output_tokens > 1 ? (e2el - ttft) / static_cast<double>(output_tokens - 1) : 0.0;
}

void StreamTimer::OnChunk(double seconds, int tokens) {
  if (tokens <= 0) return;
  if (last_ < 0) {
    ttft_ = seconds;
    itls_.insert(itls_.end(), tokens - 1, 0.0);
  } else {
    itls_.insert(itls_.end(), tokens, (seconds - last_) / tokens);
  }
  last_ = seconds;
  tokens_ += tokens;
}

void StreamTimer::Fill(RequestResult* result) const {
  result->ttft = ttft_;
  result->itls = itls_;
}

namespace {

void Finish(absl::Status status, const StreamTimer& timer, std::optional<int64_t> prompt_tokens,
            std::optional<int64_t> completion_tokens, const Prompt& prompt, RequestResult* result) {
  timer.Fill(result);
  result->prompt_tokens = prompt_tokens.value_or(static_cast<int64_t>(prompt.token_ids.size()));
  result->output_tokens = completion_tokens.value_or(timer.tokens());
  if (status.ok() && !timer.started()) {
    status = absl::DataLossError("the stream ended without a token");
  }
  result->success = status.ok();
  if (!status.ok()) result->error = status.ToString();
}

}  // namespace

RequestResult RunGrpcRequest(sdk::Client& client, const Prompt& prompt,
                             const RequestOptions& options) {
  v1::GenerateRequest request;
  request.set_model(options.model);
  if (!prompt.token_ids.empty()) {
    request.mutable_prompt_token_ids()->mutable_ids()->Assign(prompt.token_ids.begin(),
                                                              prompt.token_ids.end());
  } else {
    request.set_prompt(prompt.text);
  }
  auto* sampling = request.mutable_sampling();
  sampling->set_max_tokens(options.output_len);
  sampling->set_temperature(0);
  sampling->set_ignore_eos(true);
  if (options.logprobs >= 0) sampling->set_logprobs(options.logprobs);

  StreamTimer timer;
  std::optional<int64_t> prompt_tokens, completion_tokens;
  std::vector<int32_t> output_ids;
  const util::Instant start = util::Instant::Now();
  absl::Status status =
      client.GenerateStream(request, [&](const v1::GenerateStreamResponse& chunk) {
        if (chunk.token_ids_size() > 0) {
          timer.OnChunk(Seconds(util::Since(start)), chunk.token_ids_size());
          output_ids.insert(output_ids.end(), chunk.token_ids().begin(), chunk.token_ids().end());
        }
        if (chunk.has_usage()) {
          prompt_tokens = chunk.usage().prompt_tokens();
          completion_tokens = chunk.usage().completion_tokens();
        }
      });
  RequestResult result;
  result.e2el = Seconds(util::Since(start));
  Finish(std::move(status), timer, prompt_tokens, completion_tokens, prompt, &result);
  result.output_ids = std::move(output_ids);
  return result;
}

std::string CompletionRequestBody(const Prompt& prompt, const RequestOptions& options) {
  nlohmann::json body = {
      {"max_tokens", options.output_len},
      {"temperature", 0},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
      {"ignore_eos", true},
  };
  if (!options.model.empty()) body["model"] = options.model;
  if (options.logprobs >= 0) body["logprobs"] = options.logprobs;
  if (!prompt.token_ids.empty()) {
    body["prompt"] = prompt.token_ids;
  } else {
    body["prompt"] = prompt.text;
  }
  return body.dump();
}

absl::StatusOr<CompletionEvent> ParseCompletionEvent(absl::string_view data) {
  CompletionEvent event;
  if (absl::StripAsciiWhitespace(data) == "[DONE]") {
    event.done = true;
    return event;
  }
  const auto json = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("event is not a JSON object: ", data.substr(0, 200)));
  }
  if (auto error = json.find("error"); error != json.end() && !error->is_null()) {
    const std::string message =
        error->is_object() && error->contains("message") && (*error)["message"].is_string()
            ? (*error)["message"].get<std::string>()
            : error->dump();
    return absl::InternalError(absl::StrCat("error event: ", message));
  }
  if (auto choices = json.find("choices");
      choices != json.end() && choices->is_array() && !choices->empty()) {
    event.has_choice = true;
    const auto& choice = (*choices)[0];
    if (auto text = choice.find("text"); text != choice.end() && text->is_string()) {
      event.text = text->get<std::string>();
    }
    if (auto finish = choice.find("finish_reason"); finish != choice.end() && finish->is_string()) {
      event.finish_reason = finish->get<std::string>();
    }
  }
  if (auto usage = json.find("usage"); usage != json.end() && usage->is_object()) {
    if (auto p = usage->find("prompt_tokens"); p != usage->end() && p->is_number_integer()) {
      event.prompt_tokens = p->get<int64_t>();
    }
    if (auto c = usage->find("completion_tokens"); c != usage->end() && c->is_number_integer()) {
      event.completion_tokens = c->get<int64_t>();
    }
  }
  return event;
}

RequestResult RunHttpRequest(const HostPort& endpoint, const Prompt& prompt,
                             const RequestOptions& options) {
  const std::string body = CompletionRequestBody(prompt, options);
  StreamTimer timer;
  std::optional<int64_t> prompt_tokens, completion_tokens;
  absl::Status event_error;
  bool done = false;
  const util::Instant start = util::Instant::Now();
  absl::Status status = PostEventStream(
      endpoint, "/v1/completions", body, start + options.timeout, [&](absl::string_view data) {
        const double now = Seconds(util::Since(start));
        auto event = ParseCompletionEvent(data);
        if (!event.ok()) {
          event_error = event.status();
          return false;
        }
        if (event->done) {
          done = true;
          return false;
        }
        // A choice that only reports the finish (no text) carries no token.
        if (event->has_choice && !(event->text.empty() && !event->finish_reason.empty())) {
          timer.OnChunk(now, 1);
        }
        if (event->prompt_tokens) prompt_tokens = event->prompt_tokens;
        if (event->completion_tokens) completion_tokens = event->completion_tokens;
        return true;
      });
  RequestResult result;
  result.e2el = Seconds(util::Since(start));
  if (status.ok() && !event_error.ok()) status = event_error;
  if (status.ok() && !done) status = absl::DataLossError("the event stream ended before [DONE]");
  Finish(std::move(status), timer, prompt_tokens, completion_tokens, prompt, &result);
  return result;
}

namespace {

struct DispatchState {
  int in_flight = 0;
  int done = 0;
  int cap = 0;                // 0 = no cap
  std::vector<int> finished;  // indices whose threads can be joined
};
bool HasSlot(DispatchState* s) { return s->cap <= 0 || s->in_flight < s->cap; }
bool Idle(DispatchState* s) { return s->in_flight == 0; }

}  // namespace

void Dispatch(const std::vector<double>& arrivals, int max_concurrency,
              const std::function<void(int)>& send,
              const std::function<void(int done, int total)>& progress) {
  const int n = static_cast<int>(arrivals.size());
  constexpr absl::Duration kTick = absl::Milliseconds(100);
  absl::Mutex mu;
  DispatchState state;  // guarded by mu
  state.cap = max_concurrency;
  std::vector<std::thread> threads(n);
  // Joins finished threads as the run goes, so a long run does not hold every thread's stack.
  auto tick = [&] {
    std::vector<int> finished;
    int done = 0;
    {
      absl::MutexLock lock(&mu);
      finished.swap(state.finished);
      done = state.done;
    }
    for (int i : finished) threads[i].join();
    progress(done, n);
  };
  util::Instant next_tick = util::Instant::Now();
  auto maybe_tick = [&] {
    if (util::Instant::Now() < next_tick) return;
    tick();
    next_tick = util::Instant::Now() + kTick;
  };

  const util::Instant start = util::Instant::Now();
  for (int i = 0; i < n; ++i) {
    const util::Instant at = start + absl::Seconds(arrivals[i]);
    for (util::Instant now = util::Instant::Now(); now < at; now = util::Instant::Now()) {
      maybe_tick();
      absl::SleepFor(std::min(at - now, kTick));
    }
    while (true) {
      {
        absl::MutexLock lock(&mu);
        if (mu.AwaitWithTimeout(absl::Condition(&HasSlot, &state), kTick)) {
          ++state.in_flight;
          break;
        }
      }
      maybe_tick();
    }
    threads[i] = std::thread([&, i] {
      send(i);
      absl::MutexLock lock(&mu);
      --state.in_flight;
      ++state.done;
      state.finished.push_back(i);
    });
  }
  while (true) {
    bool idle = false;
    {
      absl::MutexLock lock(&mu);
      idle = mu.AwaitWithTimeout(absl::Condition(&Idle, &state), kTick);
    }
    tick();
    if (idle) break;
  }
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

Distribution Describe(const std::vector<double>& seconds) {
  Distribution d;
  if (seconds.empty()) return d;
  std::vector<double> ms(seconds.size());
  std::transform(seconds.begin(), seconds.end(), ms.begin(), [](double s) { return s * 1e3; });
  double sum = 0;
  for (double v : ms) sum += v;
  d.mean = sum / static_cast<double>(ms.size());
  double squares = 0;
  for (double v : ms) squares += (v - d.mean) * (v - d.mean);
  d.std = std::sqrt(squares / static_cast<double>(ms.size()));
  d.median = Percentile(ms, 50);
  d.p90 = Percentile(ms, 90);
  d.p99 = Percentile(ms, 99);
  return d;
}

bool MeetsSlos(const RequestResult& r, const Slos& slos) {
  if (!r.success) return false;
  if (slos.ttft_ms && r.ttft * 1e3 > *slos.ttft_ms) return false;
  if (slos.tpot_ms && r.Tpot() * 1e3 > *slos.tpot_ms) return false;
  if (slos.e2el_ms && r.e2el * 1e3 > *slos.e2el_ms) return false;
  return true;
}

Summary Summarize(const std::vector<RequestResult>& results, double duration, const Slos& slos) {
  Summary s;
  s.duration = duration;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const RequestResult& r : results) {
    if (!r.success) {
      ++s.failed;
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    ttfts.push_back(r.ttft);
    e2els.push_back(r.e2el);
    if (r.output_tokens > 1) tpots.push_back(r.Tpot());
    itls.insert(itls.end(), r.itls.begin(), r.itls.end());
    if (MeetsSlos(r, slos)) ++s.good;
  }
  if (duration > 0) {
    s.request_throughput = s.completed / duration;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / duration;
    s.total_token_throughput =
        static_cast<double>(s.total_input_tokens + s.total_output_tokens) / duration;
  }
  s.ttft = Describe(ttfts);
  s.tpot = Describe(tpots);
  s.itl = Describe(itls);
  s.e2el = Describe(e2els);
  if (!slos.empty()) s.request_goodput = duration > 0 ? s.good / duration : 0.0;
  return s;
}

nlohmann::json ResultJson(const RunInfo& info, const Summary& summary, const Slos& slos,
                          const std::vector<RequestResult>& results) {
  nlohmann::json j;
  j["date"] = info.date;
  j["backend"] = info.backend;
  j["endpoint"] = info.endpoint;
  j["label"] = info.label;
  j["model_id"] = info.model;
  j["dataset"] = info.dataset;
  j["request_rate"] =
      std::isinf(info.request_rate) ? nlohmann::json("inf") : nlohmann::json(info.request_rate);
  j["max_concurrency"] =
      info.max_concurrency > 0 ? nlohmann::json(info.max_concurrency) : nlohmann::json(nullptr);
  j["num_prompts"] = info.num_prompts;
  j["input_len"] = info.input_len;
  if (info.prefix_len > 0) j["prefix_len"] = info.prefix_len;
  if (info.turns > 0) j["turns"] = info.turns;
  j["output_len"] = info.output_len;
  j["logprobs"] = info.logprobs >= 0 ? nlohmann::json(info.logprobs) : nlohmann::json(nullptr);
  j["seed"] = info.seed;
  j["duration"] = summary.duration;
  j["completed"] = summary.completed;
  j["failed"] = summary.failed;
  j["total_input_tokens"] = summary.total_input_tokens;
  j["total_output_tokens"] = summary.total_output_tokens;
  j["request_throughput"] = summary.request_throughput;
  j["output_throughput"] = summary.output_throughput;
  j["total_token_throughput"] = summary.total_token_throughput;
  j["request_goodput"] =
      summary.request_goodput ? nlohmann::json(*summary.request_goodput) : nlohmann::json(nullptr);
  nlohmann::json goodput_slos = nlohmann::json::object();
  if (slos.ttft_ms) goodput_slos["ttft"] = *slos.ttft_ms;
  if (slos.tpot_ms) goodput_slos["tpot"] = *slos.tpot_ms;
  if (slos.e2el_ms) goodput_slos["e2el"] = *slos.e2el_ms;
  j["goodput_slos"] = goodput_slos;
  const std::pair<const char*, const Distribution*> metrics[] = {{"ttft", &summary.ttft},
                                                                 {"tpot", &summary.tpot},
                                                                 {"itl", &summary.itl},
                                                                 {"e2el", &summary.e2el}};
  for (const auto& [name, d] : metrics) {
    j[absl::StrCat("mean_", name, "_ms")] = d->mean;
    j[absl::StrCat("median_", name, "_ms")] = d->median;
    j[absl::StrCat("std_", name, "_ms")] = d->std;
    j[absl::StrCat("p90_", name, "_ms")] = d->p90;
    j[absl::StrCat("p99_", name, "_ms")] = d->p99;
  }
  auto& input_lens = j["input_lens"] = nlohmann::json::array();
  auto& output_lens = j["output_lens"] = nlohmann::json::array();
  auto& ttfts = j["ttfts"] = nlohmann::json::array();
  auto& itls = j["itls"] = nlohmann::json::array();
  auto& e2els = j["e2els"] = nlohmann::json::array();
  auto& errors = j["errors"] = nlohmann::json::array();
  for (const RequestResult& r : results) {
    input_lens.push_back(r.prompt_tokens);
    output_lens.push_back(r.output_tokens);
    ttfts.push_back(r.ttft);
    itls.push_back(r.itls);
    e2els.push_back(r.e2el);
    errors.push_back(r.error);
  }
  return j;
}

std::string SummaryTable(const RunInfo& info, const Summary& s) {
  std::string out;
  auto title = [&](absl::string_view text) {
    const int pad = std::max(0, 50 - static_cast<int>(text.size()) - 2);
    absl::StrAppend(&out, std::string(pad / 2, '='), " ", text, " ",
                    std::string(pad - pad / 2, '='), "\n");
  };
  auto row = [&](absl::string_view name, double value, int precision) {
    absl::StrAppend(&out, absl::StrFormat("%-40s%10.*f\n", name, precision, value));
  };
  auto text_row = [&](absl::string_view name, absl::string_view value) {
    absl::StrAppend(&out, absl::StrFormat("%-40s%10s\n", name, value));
  };
  title("Serving Benchmark Result");
  if (!info.label.empty()) text_row("Label:", info.label);
  text_row("Backend:", info.backend);
  text_row("Request rate (req/s):",
           std::isinf(info.request_rate) ? "inf" : absl::StrCat(info.request_rate));
  text_row("Max concurrency:",
           info.max_concurrency > 0 ? absl::StrCat(info.max_concurrency) : "none");
  row("Successful requests:", s.completed, 0);
  row("Failed requests:", s.failed, 0);
  row("Benchmark duration (s):", s.duration, 2);
  row("Total input tokens:", static_cast<double>(s.total_input_tokens), 0);
  row("Total generated tokens:", static_cast<double>(s.total_output_tokens), 0);
  row("Request throughput (req/s):", s.request_throughput, 2);
  if (s.request_goodput) row("Request goodput (req/s):", *s.request_goodput, 2);
  row("Output token throughput (tok/s):", s.output_throughput, 2);
  row("Total token throughput (tok/s):", s.total_token_throughput, 2);
  const std::tuple<const char*, const char*, const Distribution*> metrics[] = {
      {"Time to First Token", "TTFT", &s.ttft},
      {"Time per Output Token (excl. 1st token)", "TPOT", &s.tpot},
      {"Inter-token Latency", "ITL", &s.itl},
      {"End-to-end Latency", "E2EL", &s.e2el}};
  for (const auto& [heading, name, d] : metrics) {
    const std::string h = heading;
    const int pad = std::max(0, 50 - static_cast<int>(h.size()));
    absl::StrAppend(&out, std::string(pad / 2, '-'), h, std::string(pad - pad / 2, '-'), "\n");
    row(absl::StrCat("Mean ", name, " (ms):"), d->mean, 2);
    row(absl::StrCat("Median ", name, " (ms):"), d->median, 2);
    row(absl::StrCat("P90 ", name, " (ms):"), d->p90, 2);
    row(absl::StrCat("P99 ", name, " (ms):"), d->p99, 2);
  }
  absl::StrAppend(&out, std::string(50, '='), "\n");
  return out;
}

}  // namespace tandem::cli::bench
