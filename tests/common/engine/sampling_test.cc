#include "common/engine/sampling.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

SamplingParams Params(float temperature, std::optional<uint64_t> seed = 1) {
  SamplingParams params;
  params.temperature = temperature;
  params.seed = seed;
  return params;
}

std::vector<float> RandomLogits(std::mt19937_64& rng, int vocab) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = normal(rng);
  return logits;
}

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Pearson's chi-square statistic of `counts` against probabilities `p` (same length).
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double chi2 = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = n * p[i];
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

std::vector<double> Softmax(const std::vector<float>& logits, float temperature) {
  std::vector<double> p(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp(logits[i] / temperature);
  for (double& x : p) x /= total;
  return p;
}

std::vector<int> Histogram(Sampler& sampler, const std::vector<float>& logits, int n) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++counts[sampler.Sample(logits)];
  return counts;
}

TEST(SamplingParamsTest, DefaultsAreValid) { EXPECT_TRUE(SamplingParams().Validate(100).ok()); }

TEST(SamplingParamsTest, ValidateNamesTheField) {
  struct Case {
    const char* field;
    void (*mutate)(SamplingParams&);
  };
  const Case cases[] = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = 2.5f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = std::nanf(""); }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.5f; }},
      {"top_k", [](SamplingParams& p) { p.top_k = -1; }},
      {"max_tokens", [](SamplingParams& p) { p.max_tokens = 0; }},
      {"stop_token_ids",
       [](SamplingParams& p) {
         p.stop_token_ids = {3, 100};
       }},
      {"stop_token_ids", [](SamplingParams& p) { p.stop_token_ids = {-1}; }},
      {"stop_strings",
       [](SamplingParams& p) {
         p.stop_strings = {"a", "b", "c", "d", "e"};
       }},
      {"stop_strings", [](SamplingParams& p) { p.stop_strings = {""}; }},
      {"stop_strings", [](SamplingParams& p) { p.stop_strings = {std::string(65, 'x')}; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = 2.5f; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = -3.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 2.5f; }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{100, 1.0f}};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{1, 101.0f}};
       }},
      {"logprobs", [](SamplingParams& p) { p.logprobs = 21; }},
      {"prompt_logprobs", [](SamplingParams& p) { p.prompt_logprobs = -2; }},
  };
  for (const Case& c : cases) {
    SamplingParams params;
    c.mutate(params);
    absl::Status status = params.Validate(100);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(status.message(), HasSubstr(c.field));
  }
  SamplingParams edge;
  edge.temperature = 2.0f;
  edge.top_p = 1e-6f;
  edge.top_k = 1000;  // larger than the vocabulary: no restriction
  edge.stop_token_ids = {0, 99};
  edge.stop_strings = {"a", "b", "c", std::string(64, 'x')};
  EXPECT_TRUE(edge.Validate(100).ok());
  EXPECT_THAT(SamplingParams().Validate(0).message(), HasSubstr("vocab_size"));
}

TEST(SamplerTest, GreedyIsArgmaxWithLowestIndexOnTies) {
  Sampler sampler(Params(0.0f));
  EXPECT_EQ(sampler.Sample(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}), 1);
  EXPECT_EQ(sampler.Sample(std::vector<float>{5.0f}), 0);
  EXPECT_EQ(sampler.Sample(std::vector<float>{-2.0f, -1.0f, -1.0f}), 1);
  EXPECT_EQ(sampler.Sample(std::vector<float>{std::nanf(""), 1.0f, 0.0f}), 1);
  EXPECT_EQ(sampler.Sample(std::vector<float>{-kInf, -kInf}), 0);
}

TEST(SamplerTest, DegenerateLogitsSampleTheArgmax) {
  Sampler sampler(Params(1.0f));
  EXPECT_EQ(sampler.Sample(std::vector<float>{-kInf, -kInf, -kInf}), 0);
  EXPECT_EQ(sampler.Sample(std::vector<float>{0.0f, kInf, kInf}), 1);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(sampler.Sample(std::vector<float>{-kInf, 0.0f, std::nanf(""), -kInf}), 1);
  }
}

TEST(SamplerTest, TinyTemperatureActsGreedy) {
  Sampler sampler(Params(1e-3f));
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) {
    const std::vector<float> logits = RandomLogits(rng, 50);
    // A gap of 0.1 at temperature 1e-3 leaves every other token below e^-100 of the best.
    std::vector<float> clear = logits;
    clear[Argmax(logits)] += 0.1f;
    EXPECT_EQ(sampler.Sample(clear), Argmax(clear));
  }
}

TEST(SamplerTest, TopKOneIsGreedy) {
  SamplingParams params = Params(1.5f);
  params.top_k = 1;
  Sampler sampler(params);
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200; ++i) {
    const std::vector<float> logits = RandomLogits(rng, 64);
    EXPECT_EQ(sampler.Sample(logits), Argmax(logits));
  }
}

TEST(SamplerTest, TinyTopPIsGreedy) {
  SamplingParams params = Params(1.0f);
  params.top_p = 1e-6f;
  Sampler sampler(params);
  std::mt19937_64 rng(13);
  for (int i = 0; i < 200; ++i) {
    const std::vector<float> logits = RandomLogits(rng, 64);
    EXPECT_EQ(sampler.Sample(logits), Argmax(logits));
  }
  EXPECT_EQ(sampler.Sample(std::vector<float>{1.0f, 2.0f, 2.0f}), 1);  // ties: lowest index
}

TEST(SamplerTest, SameSeedSameTokens) {
  std::mt19937_64 rng(17);
  std::vector<std::vector<float>> steps;
  for (int i = 0; i < 200; ++i) steps.push_back(RandomLogits(rng, 32));
  SamplingParams params = Params(0.8f, 12345);
  params.top_k = 20;
  params.top_p = 0.9f;
  Sampler a(params), b(params);
  for (const auto& logits : steps) EXPECT_EQ(a.Sample(logits), b.Sample(logits));
}

TEST(SamplerTest, DifferentSeedsDifferOnAFlatDistribution) {
  const std::vector<float> flat(100, 0.0f);
  Sampler a(Params(1.0f, 1)), b(Params(1.0f, 2));
  std::vector<int32_t> from_a, from_b;
  for (int i = 0; i < 64; ++i) {
    from_a.push_back(a.Sample(flat));
    from_b.push_back(b.Sample(flat));
  }
  EXPECT_NE(from_a, from_b);
}

TEST(SamplerTest, DrawnSeedIsReportedAndReproduces) {
  SamplingParams params = Params(1.0f, std::nullopt);
  Sampler a(params);
  params.seed = a.seed();
  Sampler b(params);
  const std::vector<float> flat(1000, 0.0f);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(a.Sample(flat), b.Sample(flat));
}

// df = 4; P(chi2 > 18.47) = 0.001. Seeded, so the outcome is fixed.
TEST(SamplerTest, TemperatureOneMatchesSoftmax) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f};
  constexpr int kDraws = 20000;
  Sampler sampler(Params(1.0f, 2024));
  const std::vector<int> counts = Histogram(sampler, logits, kDraws);
  EXPECT_LT(ChiSquare(counts, Softmax(logits, 1.0f), kDraws), 18.47);
}

TEST(SamplerTest, TemperatureSharpensTheDistribution) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f};
  constexpr int kDraws = 20000;
  Sampler sampler(Params(0.5f, 2025));
  const std::vector<int> counts = Histogram(sampler, logits, kDraws);
  EXPECT_LT(ChiSquare(counts, Softmax(logits, 0.5f), kDraws), 18.47);
}

// df = 1; P(chi2 > 10.83) = 0.001.
TEST(SamplerTest, TopKRenormalisesOverTheKBest) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f};
  constexpr int kDraws = 20000;
  SamplingParams params = Params(1.0f, 99);
  params.top_k = 2;
  Sampler sampler(params);
  const std::vector<int> counts = Histogram(sampler, logits, kDraws);
  EXPECT_EQ(counts[0] + counts[3] + counts[4], 0);
  const std::vector<double> p = Softmax({1.0f, 2.0f}, 1.0f);
  EXPECT_LT(ChiSquare({counts[1], counts[2]}, p, kDraws), 10.83);
}

TEST(SamplerTest, TopPKeepsTheSmallestSetReachingTheMass) {
  // Probabilities 0.05, 0.5, 0.15, 0.3: top_p 0.75 keeps tokens 1 and 3 (0.5 + 0.3 >= 0.75).
  const std::vector<float> logits = {std::log(0.05f), std::log(0.5f), std::log(0.15f),
                                     std::log(0.3f)};
  constexpr int kDraws = 20000;
  SamplingParams params = Params(1.0f, 5);
  params.top_p = 0.75f;
  Sampler sampler(params);
  const std::vector<int> counts = Histogram(sampler, logits, kDraws);
  EXPECT_EQ(counts[0] + counts[2], 0);
  EXPECT_LT(ChiSquare({counts[1], counts[3]}, {0.625, 0.375}, kDraws), 10.83);
}

// --- StopChecker ---

constexpr int32_t kEos = 2;

SamplingParams StopParams(std::vector<std::string> stop_strings = {}, int max_tokens = 100) {
  SamplingParams params;
  params.stop_strings = std::move(stop_strings);
  params.max_tokens = max_tokens;
  return params;
}

TEST(StopCheckerTest, EosStopsWithoutItsText) {
  StopChecker checker(StopParams(), kEos);
  StopResult r = checker.Add(5, "Hi");
  EXPECT_EQ(r.reason, FinishReason::kNone);
  EXPECT_EQ(r.text, "Hi");
  r = checker.Add(kEos, "</s>");
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.stop_token, kEos);
  EXPECT_FALSE(r.stop_string.has_value());
  EXPECT_TRUE(checker.finished());
  EXPECT_EQ(checker.num_tokens(), 2);
}

TEST(StopCheckerTest, IgnoreEosContinues) {
  SamplingParams params = StopParams();
  params.ignore_eos = true;
  StopChecker checker(params, kEos);
  StopResult r = checker.Add(kEos, "</s>");
  EXPECT_EQ(r.reason, FinishReason::kNone);
  EXPECT_EQ(r.text, "</s>");
}

TEST(StopCheckerTest, StopTokenStops) {
  SamplingParams params = StopParams();
  params.stop_token_ids = {7, 9};
  StopChecker checker(params, kEos);
  EXPECT_EQ(checker.Add(5, "a").reason, FinishReason::kNone);
  StopResult r = checker.Add(9, "!");
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.stop_token, 9);
}

TEST(StopCheckerTest, MaxTokensFinishesWithLength) {
  StopChecker checker(StopParams({}, 3), kEos);
  EXPECT_EQ(checker.Add(5, "a").reason, FinishReason::kNone);
  EXPECT_EQ(checker.Add(5, "b").reason, FinishReason::kNone);
  StopResult r = checker.Add(5, "c");
  EXPECT_EQ(r.reason, FinishReason::kLength);
  EXPECT_EQ(r.text, "c");
  EXPECT_FALSE(r.stop_token.has_value());
}

TEST(StopCheckerTest, FinishingReleasesHeldText) {
  StopChecker length(StopParams({"XYZ"}, 2), kEos);
  EXPECT_EQ(length.Add(5, "aX").text, "a");
  StopResult r = length.Add(5, "Y");
  EXPECT_EQ(r.reason, FinishReason::kLength);
  EXPECT_EQ(r.text, "XY");

  StopChecker eos(StopParams({"XYZ"}), kEos);
  EXPECT_EQ(eos.Add(5, "aX").text, "a");
  r = eos.Add(kEos, "");
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.text, "X");
}

TEST(StopCheckerTest, StopStringWithinOnePiece) {
  StopChecker checker(StopParams({"o w"}), kEos);
  StopResult r = checker.Add(5, "Hello world");
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.text, "Hell");
  EXPECT_EQ(r.stop_string, "o w");
}

TEST(StopCheckerTest, StopStringSplitAcrossPieces) {
  StopChecker checker(StopParams({"lo W"}), kEos);
  StopResult r = checker.Add(5, "Hel");
  EXPECT_EQ(r.reason, FinishReason::kNone);
  EXPECT_EQ(r.text, "He");  // "l" could start "lo W"
  r = checker.Add(5, "lo Wor");
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.text, "l");
  EXPECT_EQ(r.stop_string, "lo W");
  EXPECT_DEATH(checker.Add(5, "ld"), "after the sequence finished");
}

TEST(StopCheckerTest, HeldTextIsReleasedWhenItStopsMatching) {
  StopChecker checker(StopParams({"abc"}), kEos);
  EXPECT_EQ(checker.Add(5, "xa").text, "x");
  EXPECT_EQ(checker.Add(5, "b").text, "");
  EXPECT_EQ(checker.Add(5, "d").text, "abd");
  EXPECT_EQ(checker.Add(5, "a").text, "");
  EXPECT_EQ(checker.Flush(), "a");
  EXPECT_EQ(checker.Flush(), "");
}

TEST(StopCheckerTest, OverlappingPartialMatches) {
  StopChecker checker(StopParams({"aab"}), kEos);
  std::string out;
  for (const char* piece : {"a", "a", "a"}) {
    StopResult r = checker.Add(5, piece);
    EXPECT_EQ(r.reason, FinishReason::kNone);
    out += r.text;
  }
  EXPECT_EQ(out, "a");  // "aa" still held
  StopResult r = checker.Add(5, "b");
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(out + r.text, "a");
}

TEST(StopCheckerTest, EarliestStopStringWins) {
  StopChecker checker(StopParams({"world", "lo"}), kEos);
  StopResult r = checker.Add(5, "hello world");
  EXPECT_EQ(r.text, "hel");
  EXPECT_EQ(r.stop_string, "lo");
}

TEST(StopCheckerTest, StopStringBeatsLengthOnTheLastToken) {
  StopChecker checker(StopParams({"!"}, 1), kEos);
  StopResult r = checker.Add(5, "ok!");
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.text, "ok");
}

TEST(StopCheckerTest, TextBeforeTheStopStringIsEmittedExactlyOnce) {
  StopChecker checker(StopParams({" is n"}), kEos);
  std::string out;
  for (const char* piece : {"The", " end", " is", " ", "near", "!"}) {
    StopResult r = checker.Add(5, piece);
    out += r.text;
    if (r.reason != FinishReason::kNone) break;
  }
  EXPECT_EQ(out, "The end");
}

// Random texts over a small alphabet, split at random, against an oracle: the output is the
// text before the first stop string found, checking after each piece. The streamed text must
// always be a prefix of that output (nothing is ever retracted) and add up to it exactly.
TEST(StopCheckerTest, StreamingMatchesOracle) {
  const std::vector<std::string> stops = {"abc", "bb", "cab", "aaaa"};
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> pieces;
    const int num_pieces = 1 + static_cast<int>(rng() % 10);
    for (int i = 0; i < num_pieces; ++i) {
      std::string piece;
      const int len = static_cast<int>(rng() % 4);
      for (int j = 0; j < len; ++j) piece += static_cast<char>('a' + rng() % 3);
      pieces.push_back(piece);
    }
    std::string expected, text;
    bool expect_stop = false;
    for (const std::string& piece : pieces) {
      text += piece;
      size_t first = std::string::npos;
      for (const std::string& stop : stops) first = std::min(first, text.find(stop));
      if (first != std::string::npos) {
        expected = text.substr(0, first);
        expect_stop = true;
        break;
      }
    }
    if (!expect_stop) expected = text;

    StopChecker checker(StopParams(stops), kEos);
    std::string out;
    FinishReason reason = FinishReason::kNone;
    for (const std::string& piece : pieces) {
      StopResult r = checker.Add(5, piece);
      out += r.text;
      ASSERT_EQ(expected.compare(0, out.size(), out), 0)
          << "retracted: " << out << " vs " << expected;
      reason = r.reason;
      if (reason != FinishReason::kNone) break;
    }
    if (reason == FinishReason::kNone) out += checker.Flush();
    EXPECT_EQ(out, expected) << "trial " << trial;
    EXPECT_EQ(reason == FinishReason::kStop, expect_stop) << "trial " << trial;
  }
}

}  // namespace
}  // namespace tandem::engine

namespace tandem::engine {
namespace {

// log-softmax by the book, in double.
std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  double max = -kInf;
  for (float x : logits) max = std::max<double>(max, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - max);
  std::vector<double> out;
  for (float x : logits) out.push_back(x - max - std::log(sum));
  return out;
}

TEST(SamplingParamsTest, MaxTokensZeroOnlyScoresAPrompt) {
  SamplingParams params;
  params.max_tokens = 0;
  EXPECT_THAT(params.Validate(100).message(), HasSubstr("max_tokens"));
  params.prompt_logprobs = 0;
  EXPECT_TRUE(params.Validate(100).ok());
}

TEST(LogprobsTest, MatchTheReferenceLogSoftmaxAndRankTheTop) {
  std::mt19937_64 rng(7);
  const std::vector<float> logits = RandomLogits(rng, 300);
  const std::vector<double> reference = LogSoftmax(logits);
  const TokenLogprobs lp = ComputeLogprobs(logits, 42, 5);
  EXPECT_EQ(lp.token, 42);
  EXPECT_NEAR(lp.logprob, reference[42], 1e-5);
  ASSERT_EQ(lp.top.size(), 5u);
  std::vector<int> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(lp.top[i].token, order[i]);
    EXPECT_NEAR(lp.top[i].logprob, reference[order[i]], 1e-5);
  }
  EXPECT_TRUE(ComputeLogprobs(logits, 3, 0).top.empty());
  EXPECT_EQ(ComputeLogprobs(logits, 3, 1000).top.size(), logits.size());
}

TEST(LogprobsTest, TiesRankTheLowerIdFirstAndNaNIsMinusInfinity) {
  const std::vector<float> logits = {1.0f, 2.0f, 2.0f, std::nanf("")};
  const TokenLogprobs lp = ComputeLogprobs(logits, 3, 3);
  EXPECT_EQ(lp.logprob, -kInf);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token, 1);
  EXPECT_EQ(lp.top[1].token, 2);
  EXPECT_EQ(lp.top[2].token, 0);
  EXPECT_NEAR(lp.top[0].logprob, std::log(std::exp(2.0) / (2 * std::exp(2.0) + std::exp(1.0))),
              1e-6);
}

TEST(LogprobsTest, PromptRowsScoreTheNextPromptToken) {
  // Two rows of a 3-token vocabulary for prompt positions 1 and 2 of a 3-token prompt: only
  // position 1's row predicts a prompt token (position 2's predicts what follows).
  const std::vector<float> rows = {0.0f, 1.0f, 2.0f, 5.0f, 5.0f, 5.0f};
  const std::vector<int32_t> prompt = {0, 1, 2};
  std::vector<TokenLogprobs> out;
  AppendPromptLogprobs(rows, 1, 2, prompt, 1, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].token, 2);
  EXPECT_NEAR(out[0].logprob, LogSoftmax({0.0f, 1.0f, 2.0f})[2], 1e-6);
}

TEST(PenaltyTest, LogitBiasDecidesGreedyPicks) {
  SamplingParams params = Params(0.0f);
  params.logit_bias = {{0, 10.0f}};
  Sampler sampler(params);
  EXPECT_EQ(sampler.Sample(std::vector<float>{1.0f, 5.0f, 3.0f}), 0);
  params.logit_bias = {{1, -100.0f}};
  Sampler banned(params);
  EXPECT_EQ(banned.Sample(std::vector<float>{1.0f, 5.0f, 3.0f}), 2);
}

TEST(PenaltyTest, PresenceAndFrequencyPenalizeGeneratedTokens) {
  const std::vector<float> logits = {3.0f, 2.5f, 0.0f};
  // Presence 1: after token 0 once, 3 - 1 = 2 < 2.5.
  SamplingParams presence = Params(0.0f);
  presence.presence_penalty = 1.0f;
  Sampler a(presence);
  EXPECT_EQ(a.Sample(logits), 0);
  EXPECT_EQ(a.Sample(logits), 1);
  // Then both were seen once: 2.0 vs 1.5.
  EXPECT_EQ(a.Sample(logits), 0);
  // Frequency 0.3: token 0 drops by 0.3 per use: 3.0, 2.7, 2.4 < 2.5 at the third.
  SamplingParams frequency = Params(0.0f);
  frequency.frequency_penalty = 0.3f;
  Sampler b(frequency);
  EXPECT_EQ(b.Sample(logits), 0);
  EXPECT_EQ(b.Sample(logits), 0);
  EXPECT_EQ(b.Sample(logits), 1);
  // A negative penalty favours repeats.
  SamplingParams favour = Params(0.0f);
  favour.presence_penalty = -2.0f;
  Sampler c(favour);
  c.SkipDraw(2);                   // counted like a sampled token
  EXPECT_EQ(c.Sample(logits), 0);  // 0 + 2 = 2 < 3
  favour.frequency_penalty = -1.5f;
  Sampler d(favour);
  d.SkipDraw(2);
  EXPECT_EQ(d.Sample(logits), 2);  // 0 + 2 + 1.5 = 3.5 > 3
}

TEST(PenaltyTest, RepetitionPenaltyCountsThePromptAndDividesOrMultiplies) {
  SamplingParams params = Params(0.0f);
  params.repetition_penalty = 2.0f;
  const std::vector<int32_t> prompt = {0};
  // Token 0 is in the prompt: 3 / 2 = 1.5 < 2.5.
  Sampler a(params, prompt);
  EXPECT_EQ(a.Sample(std::vector<float>{3.0f, 2.5f, 0.0f}), 1);
  // Negative logits are multiplied: -1 * 2 = -2 < -1.5.
  Sampler b(params, prompt);
  EXPECT_EQ(b.Sample(std::vector<float>{-1.0f, -1.5f, -3.0f}), 1);
  // Without the prompt, nothing is penalized.
  Sampler c(params);
  EXPECT_EQ(c.Sample(std::vector<float>{3.0f, 2.5f, 0.0f}), 0);
}

TEST(PenaltyTest, PenaltiesShapeTheDrawnDistribution) {
  // Temperature 1 after a presence penalty of 1 on token 0: softmax of the shifted logits.
  std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f};
  SamplingParams params = Params(1.0f, 99);
  params.presence_penalty = 1.0f;
  constexpr int kDraws = 20000;
  std::vector<int> counts(4, 0);
  for (int i = 0; i < kDraws; ++i) {
    Sampler sampler(params);
    sampler.SkipDraw(0);
    params.seed = *params.seed + 1;
    ++counts[sampler.Sample(logits)];
  }
  const std::vector<double> p = Softmax({0.0f, 1.0f, 1.0f, 1.0f}, 1.0f);
  EXPECT_LT(ChiSquare(counts, p, kDraws), 16.27);  // 3 dof, p = 0.001
}

TEST(PenaltyTest, UnpenalizedSamplingDrawsWhatItDidBefore) {
  // The penalty path must not change the stream of an unpenalized request: a bias of 0 on a
  // token counts as penalized but adds nothing.
  std::mt19937_64 rng(3);
  const std::vector<float> logits = RandomLogits(rng, 50);
  SamplingParams plain = Params(0.8f, 5);
  SamplingParams zero_bias = plain;
  zero_bias.logit_bias = {{7, 0.0f}};
  Sampler a(plain), b(zero_bias);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.Sample(logits), b.Sample(logits));
}

}  // namespace
}  // namespace tandem::engine
