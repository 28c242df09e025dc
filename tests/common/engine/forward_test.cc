// The engine against the PyTorch model that trained the shipped weights: logits, router
// choices and greedy continuations of the golden prompts (tests/golden/tiny-moe), computed
// whole, chunked, token by token through the paged KV cache, and batched.
#include "common/engine/forward.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/kernels.h"
#include "common/model/npy.h"
#include "nlohmann/json.hpp"
#include "tests/testing/golden.h"
#include "tests/testing/kernels.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::engine {
namespace {

class ForwardGoldenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::UseExactKernels();
    const std::string dir = testing::SourceDir() + "/models/tiny-moe";
    auto weights = LoadModelWeights(*testing::OpenModelDir(dir), LoadFormat::kSafetensors);
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = weights->release();
    std::ifstream in(testing::SourceDir() + "/tests/golden/tiny-moe/manifest.json");
    manifest_ = new nlohmann::json(nlohmann::json::parse(in, nullptr, false));
    ASSERT_FALSE(manifest_->is_discarded());
  }
  static void TearDownTestSuite() {
    delete weights_;
    delete manifest_;
  }

  void SetUp() override {
    ASSERT_NE(weights_, nullptr) << "the shipped model did not load";
    const auto& c = weights_->config;
    KvCacheConfig kv{static_cast<int>(c.num_hidden_layers), static_cast<int>(c.num_key_value_heads),
                     static_cast<int>(c.head_dim), /*block_size=*/16, /*num_blocks=*/256};
    auto pool = KvBlockPool::Create(kv);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    auto fwd = ForwardPass::Create(weights_, pool_.get());
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    forward_ = *std::move(fwd);
  }

  std::vector<float> GoldenLogits(int k) {
    auto array = model::ReadNpy(
        absl::StrCat(testing::SourceDir(), "/tests/golden/tiny-moe/prompt_", k, "_logits.npy"));
    EXPECT_TRUE(array.ok());
    return *array->AsFloat32();
  }

  static double RowError(const float* a, const float* b, int n) {
    return testing::NormalisedRowError(a, b, n);
  }

  // Runs `ids` as one prefill on `forward` (the fixture's by default); logits of the last token.
  absl::Status RunPrompt(const std::vector<int32_t>& ids, const MoeOptions& moe,
                         std::vector<std::vector<float>>* logits, RouterTrace* trace = nullptr,
                         ForwardPass* forward = nullptr) {
    BlockTable table;
    if (absl::Status s = table.Reserve(pool_.get(), static_cast<int>(ids.size())); !s.ok()) {
      return s;
    }
    StepInput in{ids, 0, &table};
    absl::Status status =
        (forward != nullptr ? forward : forward_.get())->Step({&in, 1}, moe, logits, trace);
    table.ReleaseAll(pool_.get());
    return status;
  }

  // Every position's logits of `ids` run as one prefill on `forward` (the fixture's by default).
  std::vector<float> AllLogits(const std::vector<int32_t>& ids, RouterTrace* trace = nullptr,
                               ForwardPass* forward = nullptr) {
    BlockTable table;
    EXPECT_EQ(table.Reserve(pool_.get(), static_cast<int>(ids.size())), absl::OkStatus());
    std::vector<std::vector<float>> logits;
    StepInput in{ids, 0, &table, LogitRows::kAll};
    EXPECT_EQ((forward != nullptr ? forward : forward_.get())->Step({&in, 1}, {}, &logits, trace),
              absl::OkStatus());
    table.ReleaseAll(pool_.get());
    return logits.empty() ? std::vector<float>() : logits[0];
  }

  static ModelWeights* weights_;
  static nlohmann::json* manifest_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<ForwardPass> forward_;
};

ModelWeights* ForwardGoldenTest::weights_ = nullptr;
nlohmann::json* ForwardGoldenTest::manifest_ = nullptr;

using testing::kLogitTolerance;

// The default level rounds activations (bf16 into bf16 weights' products, int8 into quantized
// ones): how far that moves the logits from PyTorch's float32, against the exact level's
// distance. Routers keep float32 activations on every level, but an earlier rounding can still
// tip a near-tie and move a whole row; the next token and the typical row stay put.
TEST_F(ForwardGoldenTest, DefaultLevelStaysCloseToPyTorch) {
  const kernels::Backend* fast = kernels::cpu::FindBackend("auto");
  ASSERT_NE(fast, nullptr);
  auto forward = ForwardPass::Create(weights_, pool_.get(), fast);
  ASSERT_TRUE(forward.ok());
  const int vocab = static_cast<int>(weights_->config.vocab_size);
  std::vector<double> errors;
  int agree = 0;
  for (size_t k = 0; k < (*manifest_)["prompts"].size(); ++k) {
    const auto& prompt = (*manifest_)["prompts"][k];
    const auto ids = prompt["token_ids"].get<std::vector<int32_t>>();
    const auto positions = prompt["logit_positions"].get<std::vector<int>>();
    const std::vector<float> logits = AllLogits(ids, nullptr, forward->get());
    ASSERT_EQ(logits.size(), ids.size() * vocab);
    const std::vector<float> golden = GoldenLogits(static_cast<int>(k));
    for (size_t i = 0; i < positions.size(); ++i) {
      const float* got = &logits[static_cast<size_t>(positions[i]) * vocab];
      const float* want = &golden[i * vocab];
      errors.push_back(RowError(got, want, vocab));
      agree +=
          std::max_element(got, got + vocab) - got == std::max_element(want, want + vocab) - want;
    }
  }
  std::sort(errors.begin(), errors.end());
  const double median = errors[errors.size() / 2];
  std::cout << fast->name << ": normalised logit error against PyTorch median " << median
            << ", worst " << errors.back() << "; next token agrees at " << agree << " of "
            << errors.size() << " positions\n";
  if (fast->rounding == kernels::ActivationRounding::kNone) {
    EXPECT_LT(errors.back(), kLogitTolerance);  // this CPU's fastest level is exact
    return;
  }
  EXPECT_LT(median, 5e-3);
  EXPECT_LT(errors.back(), 0.1);
  EXPECT_GE(agree, static_cast<int>(errors.size()) - 1);
}

TEST_F(ForwardGoldenTest, WholePromptLogitsAndRoutingMatchPyTorch) {
  const int vocab = static_cast<int>(weights_->config.vocab_size);
  const int layers = static_cast<int>(weights_->config.num_hidden_layers);
  const int experts = static_cast<int>(weights_->config.num_local_experts);
  int routing_compared = 0, routing_skipped = 0;
  double worst = 0;
  for (size_t k = 0; k < (*manifest_)["prompts"].size(); ++k) {
    SCOPED_TRACE(absl::StrCat("prompt ", k));
    const auto& prompt = (*manifest_)["prompts"][k];
    const auto ids = prompt["token_ids"].get<std::vector<int32_t>>();
    const auto positions = prompt["logit_positions"].get<std::vector<int>>();
    RouterTrace trace;
    const std::vector<float> logits = AllLogits(ids, &trace);
    ASSERT_EQ(logits.size(), ids.size() * vocab);
    const std::vector<float> golden = GoldenLogits(static_cast<int>(k));
    for (size_t i = 0; i < positions.size(); ++i) {
      const double error =
          RowError(&logits[static_cast<size_t>(positions[i]) * vocab], &golden[i * vocab], vocab);
      worst = std::max(worst, error);
      EXPECT_LT(error, kLogitTolerance) << "position " << positions[i];
    }
    // Router choices agree wherever the 2nd and 3rd probabilities are not a near-tie.
    auto golden_experts =
        *model::ReadNpy(absl::StrCat(testing::SourceDir(), "/tests/golden/tiny-moe/prompt_", k,
                                     "_experts.npy"))
             ->AsInt32();
    const int n = static_cast<int>(ids.size());
    for (int l = 0; l < layers; ++l) {
      for (int t = 0; t < n; ++t) {
        std::vector<float> p(&trace.probs[l][static_cast<size_t>(t) * experts],
                             &trace.probs[l][static_cast<size_t>(t + 1) * experts]);
        std::sort(p.rbegin(), p.rend());
        if (p[1] - p[2] < 1e-4) {
          ++routing_skipped;
          continue;
        }
        ++routing_compared;
        std::vector<int> ours = {trace.experts[l][t * 2], trace.experts[l][t * 2 + 1]};
        std::vector<int> theirs = {golden_experts[(static_cast<size_t>(l) * n + t) * 2],
                                   golden_experts[(static_cast<size_t>(l) * n + t) * 2 + 1]};
        std::sort(ours.begin(), ours.end());
        std::sort(theirs.begin(), theirs.end());
        EXPECT_EQ(ours, theirs) << "layer " << l << " token " << t;
      }
    }
  }
  EXPECT_GT(routing_compared, 20 * routing_skipped);
  std::cout << "worst normalised logit error " << worst << "; router choices compared "
            << routing_compared << ", near-ties skipped " << routing_skipped << "\n";
}

TEST_F(ForwardGoldenTest, ChunkedPrefillAndCachedDecodeGiveTheGreedyContinuation) {
  const int vocab = static_cast<int>(weights_->config.vocab_size);
  for (size_t k = 0; k < (*manifest_)["prompts"].size(); ++k) {
    SCOPED_TRACE(absl::StrCat("prompt ", k));
    const auto& prompt = (*manifest_)["prompts"][k];
    const auto ids = prompt["token_ids"].get<std::vector<int32_t>>();
    const auto greedy = prompt["greedy_token_ids"].get<std::vector<int32_t>>();
    BlockTable table;
    ASSERT_TRUE(table.Reserve(pool_.get(), static_cast<int>(ids.size() + greedy.size())).ok());
    std::vector<std::vector<float>> logits;
    // Prefill in chunks of 7 tokens.
    for (size_t start = 0; start < ids.size(); start += 7) {
      const size_t n = std::min<size_t>(7, ids.size() - start);
      StepInput in{absl::MakeConstSpan(ids).subspan(start, n), static_cast<int>(start), &table};
      ASSERT_TRUE(forward_->Step({&in, 1}, {}, &logits).ok());
    }
    const std::vector<float> golden = GoldenLogits(static_cast<int>(k));
    EXPECT_LT(RowError(logits[0].data(), &golden[golden.size() - vocab], vocab), kLogitTolerance);
    // Decode one token at a time from the cache.
    std::vector<int32_t> generated;
    for (size_t i = 0; i < greedy.size(); ++i) {
      const int32_t next = static_cast<int32_t>(
          std::max_element(logits[0].begin(), logits[0].end()) - logits[0].begin());
      generated.push_back(next);
      if (i + 1 == greedy.size()) break;
      StepInput in{absl::MakeConstSpan(&generated.back(), 1), static_cast<int>(ids.size() + i),
                   &table};
      ASSERT_TRUE(forward_->Step({&in, 1}, {}, &logits).ok());
    }
    EXPECT_EQ(generated, greedy);
    table.ReleaseAll(pool_.get());
  }
}

// A prompt's queries attend in blocks (Backend::causal_attention); a decode token alone
// (paged_attention). At the default level over bf16 and int8 caches the two kernels round
// differently, so each golden prompt run whole and run token by token agree closely rather
// than bitwise; over a float32 cache both are the one-query kernel.
TEST_F(ForwardGoldenTest, PromptBlocksAgreeWithTokenByTokenInEveryKvDtype) {
  const kernels::Backend* fast = kernels::cpu::FindBackend("auto");
  ASSERT_NE(fast, nullptr);
  const auto& c = weights_->config;
  const int vocab = static_cast<int>(c.vocab_size);
  for (kernels::KvDtype dtype :
       {kernels::KvDtype::kF32, kernels::KvDtype::kBf16, kernels::KvDtype::kInt8}) {
    SCOPED_TRACE(kernels::KvDtypeName(dtype));
    auto pool = KvBlockPool::Create({static_cast<int>(c.num_hidden_layers),
                                     static_cast<int>(c.num_key_value_heads),
                                     static_cast<int>(c.head_dim), 16, 256, dtype});
    ASSERT_TRUE(pool.ok()) << pool.status();
    auto forward = ForwardPass::Create(weights_, pool->get(), fast);
    ASSERT_TRUE(forward.ok()) << forward.status();
    std::vector<double> errors;
    int agree = 0;
    for (size_t k = 0; k < (*manifest_)["prompts"].size(); ++k) {
      const auto ids = (*manifest_)["prompts"][k]["token_ids"].get<std::vector<int32_t>>();
      BlockTable whole_table, token_table;
      ASSERT_TRUE(whole_table.Reserve(pool->get(), static_cast<int>(ids.size())).ok());
      ASSERT_TRUE(token_table.Reserve(pool->get(), static_cast<int>(ids.size())).ok());
      std::vector<std::vector<float>> whole, one;
      StepInput in{ids, 0, &whole_table, LogitRows::kAll};
      ASSERT_TRUE((*forward)->Step({&in, 1}, {}, &whole).ok());
      for (size_t i = 0; i < ids.size(); ++i) {
        StepInput token{absl::MakeConstSpan(ids).subspan(i, 1), static_cast<int>(i), &token_table};
        ASSERT_TRUE((*forward)->Step({&token, 1}, {}, &one).ok());
        const float* got = &whole[0][i * vocab];
        errors.push_back(RowError(got, one[0].data(), vocab));
        agree += std::max_element(got, got + vocab) - got ==
                 std::max_element(one[0].begin(), one[0].end()) - one[0].begin();
      }
      whole_table.ReleaseAll(pool->get());
      token_table.ReleaseAll(pool->get());
    }
    std::sort(errors.begin(), errors.end());
    const double median = errors[errors.size() / 2];
    std::cout << fast->name << ", " << kernels::KvDtypeName(dtype)
              << " cache: whole prompts against token by token, normalised logit error median "
              << median << ", worst " << errors.back() << "; next token agrees at " << agree
              << " of " << errors.size() << " positions\n";
    EXPECT_LT(median, 5e-3);
    EXPECT_LT(errors.back(), 0.1);
    EXPECT_GE(agree, static_cast<int>(errors.size()) - 2);
  }
}

TEST_F(ForwardGoldenTest, BatchedSequencesMatchSeparateRuns) {
  const auto& prompts = (*manifest_)["prompts"];
  std::vector<std::vector<int32_t>> ids;
  for (size_t k = 0; k < 4; ++k) ids.push_back(prompts[k]["token_ids"].get<std::vector<int32_t>>());
  std::vector<BlockTable> tables(ids.size());
  std::vector<StepInput> batch;
  for (size_t s = 0; s < ids.size(); ++s) {
    ASSERT_TRUE(tables[s].Reserve(pool_.get(), static_cast<int>(ids[s].size())).ok());
    batch.push_back({ids[s], 0, &tables[s]});
  }
  std::vector<std::vector<float>> together;
  ASSERT_TRUE(forward_->Step(batch, {}, &together).ok());
  for (size_t s = 0; s < ids.size(); ++s) {
    BlockTable alone_table;
    ASSERT_TRUE(alone_table.Reserve(pool_.get(), static_cast<int>(ids[s].size())).ok());
    StepInput alone{ids[s], 0, &alone_table};
    std::vector<std::vector<float>> logits;
    ASSERT_TRUE(forward_->Step({&alone, 1}, {}, &logits).ok());
    EXPECT_LT(RowError(together[s].data(), logits[0].data(), static_cast<int>(logits[0].size())),
              1e-5);
    alone_table.ReleaseAll(pool_.get());
    tables[s].ReleaseAll(pool_.get());
  }
}

TEST_F(ForwardGoldenTest, ExpertMaskKeepsTopKAndNeverRoutesToPrunedExperts) {
  const auto& c = weights_->config;
  ExpertMask mask;
  mask.retained.assign(c.num_hidden_layers, std::vector<bool>(c.num_local_experts, false));
  for (auto& layer : mask.retained) {
    for (int e = 0; e < c.num_local_experts; e += 2) layer[e] = true;  // keep the even experts
  }
  const auto ids = (*manifest_)["prompts"][0]["token_ids"].get<std::vector<int32_t>>();
  BlockTable table;
  ASSERT_TRUE(table.Reserve(pool_.get(), static_cast<int>(ids.size())).ok());
  StepInput in{ids, 0, &table};
  std::vector<std::vector<float>> logits;
  RouterTrace trace;
  ASSERT_TRUE(forward_->Step({&in, 1}, {.mask = &mask}, &logits, &trace).ok());
  for (const auto& layer : trace.experts) {
    for (int32_t e : layer) EXPECT_EQ(e % 2, 0);
  }
  for (const auto& layer : trace.weights) {
    for (size_t t = 0; t + 1 < layer.size(); t += 2)
      EXPECT_NEAR(layer[t] + layer[t + 1], 1.0, 1e-6);
  }
  table.ReleaseAll(pool_.get());
}

// A pruned decoder loads only the retained experts: their weights are the full model's, the
// others are absent, its steps equal the full model's under the same mask, and it refuses any
// step that could route to an expert it does not hold.
TEST_F(ForwardGoldenTest, RetainedOnlyWeightsRunTheMaskedModelAndRefuseOthers) {
  const auto& c = weights_->config;
  ExpertMask mask;
  mask.retained.assign(c.num_hidden_layers, std::vector<bool>(c.num_local_experts, false));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (int e = l % 3; e < c.num_local_experts; e += 3) mask.retained[l][e] = true;
  }
  const std::string dir = testing::SourceDir() + "/models/tiny-moe";
  auto slim = LoadModelWeights(*testing::OpenModelDir(dir), LoadFormat::kSafetensors, 0, mask);
  ASSERT_TRUE(slim.ok()) << slim.status();
  int64_t full_bytes = 0, slim_bytes = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (int e = 0; e < c.num_local_experts; ++e) {
      const ExpertWeights& want = weights_->layers[l].moe.experts[e];
      const ExpertWeights& got = (*slim)->layers[l].moe.experts[e];
      full_bytes += static_cast<int64_t>(want.gate.data.size() * 3) * 2;
      slim_bytes +=
          static_cast<int64_t>(got.gate.data.size() + got.up.data.size() + got.down.data.size()) *
          2;
      ASSERT_EQ((*slim)->HasExpert(l, e), mask.retained[l][e]);
      if (mask.retained[l][e]) {
        EXPECT_EQ(got.gate.data, want.gate.data);
        EXPECT_EQ(got.down.data, want.down.data);
      } else {
        EXPECT_TRUE(got.gate.data.empty() && got.up.data.empty() && got.down.data.empty());
      }
    }
  }
  // Layers 0 and 3 keep 6 of 16 experts, the others 5: 32/96 of the expert bytes.
  EXPECT_EQ(slim_bytes * 96, full_bytes * 32);

  auto slim_forward = ForwardPass::Create(slim->get(), pool_.get());
  ASSERT_TRUE(slim_forward.ok()) << slim_forward.status();
  const auto ids = (*manifest_)["prompts"][2]["token_ids"].get<std::vector<int32_t>>();
  std::vector<std::vector<float>> want, got;
  ASSERT_EQ(RunPrompt(ids, {.mask = &mask}, &want), absl::OkStatus());
  ASSERT_EQ(RunPrompt(ids, {.mask = &mask}, &got, nullptr, slim_forward->get()), absl::OkStatus());
  EXPECT_EQ(got[0], want[0]);

  // No mask, or a mask that retains an expert the engine lacks, is refused before any work.
  const absl::Status unmasked = RunPrompt(ids, {}, &got, nullptr, slim_forward->get());
  EXPECT_EQ(unmasked.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unmasked.message(), ::testing::HasSubstr("only some experts"));
  ExpertMask wider = mask;
  wider.retained[4][0] = true;  // layer 4 keeps experts 1, 4, 7, ...
  const absl::Status absent = RunPrompt(ids, {.mask = &wider}, &got, nullptr, slim_forward->get());
  EXPECT_EQ(absent.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(absent.message(), ::testing::HasSubstr("expert 0 of layer 4"));
  EXPECT_EQ(pool_->num_free(), pool_->num_total());

  ExpertMask misshapen;
  misshapen.retained.assign(2, std::vector<bool>(3, true));
  EXPECT_EQ(LoadModelWeights(*testing::OpenModelDir(dir), LoadFormat::kSafetensors, 0, misshapen)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Runs every routed pair at the width fn(layer, rank j) gives.
class FnWidths : public ExpertWidthPolicy {
 public:
  explicit FnWidths(std::function<int(int, int)> fn) : fn_(std::move(fn)) {}
  void Widths(int layer, absl::Span<const int32_t> experts, absl::Span<float>,
              absl::Span<int> widths) const override {
    for (size_t j = 0; j < experts.size(); ++j) widths[j] = fn_(layer, static_cast<int>(j));
  }

 private:
  std::function<int(int, int)> fn_;
};

TEST_F(ForwardGoldenTest, FullWidthPolicyChangesNothing) {
  const int inter = static_cast<int>(weights_->config.intermediate_size);
  FnWidths full([&](int, int) { return inter; });
  const auto ids = (*manifest_)["prompts"][1]["token_ids"].get<std::vector<int32_t>>();
  std::vector<std::vector<float>> plain, with_policy;
  EXPECT_EQ(RunPrompt(ids, {}, &plain), absl::OkStatus());
  EXPECT_EQ(RunPrompt(ids, {.widths = &full}, &with_policy), absl::OkStatus());
  EXPECT_EQ(plain, with_policy);
}

// Width w reads only the first w neurons: the same as a checkpoint whose other neurons are
// zero (silu(0) * 0 = 0), run at full width. Width 0 for every pair leaves only attention.
TEST_F(ForwardGoldenTest, NarrowWidthsEqualExpertsWithTheOtherNeuronsZeroed) {
  const int inter = static_cast<int>(weights_->config.intermediate_size);
  const int hidden = static_cast<int>(weights_->config.hidden_size);
  const auto ids = (*manifest_)["prompts"][2]["token_ids"].get<std::vector<int32_t>>();
  for (int width : {inter / 2 + 3, 17, 0}) {
    FnWidths narrow([&](int, int) { return width; });
    std::vector<std::vector<float>> got;
    RouterTrace trace;
    ASSERT_EQ(RunPrompt(ids, {.widths = &narrow}, &got, &trace), absl::OkStatus());
    for (const auto& layer : trace.widths) {
      for (int32_t w : layer) ASSERT_EQ(w, width);
    }
    ModelWeights zeroed = *weights_;
    for (LayerWeights& layer : zeroed.layers) {
      for (ExpertWeights& e : layer.moe.experts) {
        for (WeightMatrix* m : {&e.gate, &e.up}) {  // rows [width, inter) zero, packed again
          std::vector<uint16_t> rows(static_cast<size_t>(inter) * hidden, 0);
          for (int r = 0; r < width; ++r) {
            for (int c = 0; c < hidden; ++c) {
              rows[static_cast<size_t>(r) * hidden + c] = kernels::cpu::F32ToBf16(m->at(r, c));
            }
          }
          *m = PackBf16Matrix(rows.data(), inter, hidden);
        }
      }
    }
    auto fwd = ForwardPass::Create(&zeroed, pool_.get());
    ASSERT_TRUE(fwd.ok());
    std::vector<std::vector<float>> want;
    ASSERT_EQ(RunPrompt(ids, {}, &want, nullptr, fwd->get()), absl::OkStatus());
    EXPECT_LT(RowError(got[0].data(), want[0].data(), static_cast<int>(want[0].size())), 1e-6)
        << "width " << width;
  }
}

// Dominant full, auxiliary narrowed or skipped: an expert runs at two widths in one step, and a
// sequence still gets the same logits alone as in a batch.
TEST_F(ForwardGoldenTest, MixedWidthsDoNotDependOnTheBatch) {
  const int inter = static_cast<int>(weights_->config.intermediate_size);
  FnWidths mixed([&](int layer, int j) { return j == 0 ? inter : (layer % 2 ? inter / 4 : 0); });
  const auto& prompts = (*manifest_)["prompts"];
  std::vector<std::vector<int32_t>> ids;
  for (size_t k = 0; k < 3; ++k) ids.push_back(prompts[k]["token_ids"].get<std::vector<int32_t>>());
  std::vector<BlockTable> tables(ids.size());
  std::vector<StepInput> batch;
  for (size_t s = 0; s < ids.size(); ++s) {
    ASSERT_TRUE(tables[s].Reserve(pool_.get(), static_cast<int>(ids[s].size())).ok());
    batch.push_back({ids[s], 0, &tables[s]});
  }
  std::vector<std::vector<float>> together;
  ASSERT_TRUE(forward_->Step(batch, {.widths = &mixed}, &together).ok());
  EXPECT_GT(forward_->last_step_stats().expert_runs, 0);
  std::vector<std::vector<float>> full;
  for (size_t s = 0; s < ids.size(); ++s) {
    std::vector<std::vector<float>> alone;
    ASSERT_EQ(RunPrompt(ids[s], {.widths = &mixed}, &alone), absl::OkStatus());
    EXPECT_LT(RowError(together[s].data(), alone[0].data(), static_cast<int>(alone[0].size())),
              1e-5);
    ASSERT_EQ(RunPrompt(ids[s], {}, &full), absl::OkStatus());
    EXPECT_GT(RowError(alone[0].data(), full[0].data(), static_cast<int>(full[0].size())), 1e-3)
        << "narrowing should change the logits";
    tables[s].ReleaseAll(pool_.get());
  }
}

// Colocated mode: one step holds a full-pool sequence and a pruned one.
TEST_F(ForwardGoldenTest, PerSequenceMoeOptionsOverrideTheStep) {
  const auto& c = weights_->config;
  ExpertMask mask;
  mask.retained.assign(c.num_hidden_layers, std::vector<bool>(c.num_local_experts, true));
  for (auto& layer : mask.retained) {
    for (int e = 0; e < c.num_local_experts / 2; ++e) layer[e] = false;
  }
  const MoeOptions pruned{.mask = &mask};
  const auto a = (*manifest_)["prompts"][4]["token_ids"].get<std::vector<int32_t>>();
  const auto b = (*manifest_)["prompts"][5]["token_ids"].get<std::vector<int32_t>>();
  BlockTable ta, tb;
  ASSERT_TRUE(ta.Reserve(pool_.get(), static_cast<int>(a.size())).ok());
  ASSERT_TRUE(tb.Reserve(pool_.get(), static_cast<int>(b.size())).ok());
  std::vector<StepInput> batch = {{a, 0, &ta}, {b, 0, &tb, LogitRows::kLast, &pruned}};
  std::vector<std::vector<float>> together, want_a, want_b;
  ASSERT_TRUE(forward_->Step(batch, {}, &together).ok());
  ASSERT_EQ(RunPrompt(a, {}, &want_a), absl::OkStatus());
  ASSERT_EQ(RunPrompt(b, pruned, &want_b), absl::OkStatus());
  const int vocab = static_cast<int>(c.vocab_size);
  EXPECT_LT(RowError(together[0].data(), want_a[0].data(), vocab), 1e-5);
  EXPECT_LT(RowError(together[1].data(), want_b[0].data(), vocab), 1e-5);
  ta.ReleaseAll(pool_.get());
  tb.ReleaseAll(pool_.get());
}

TEST_F(ForwardGoldenTest, OutOfRangeWidthIsInvalidArgument) {
  const int inter = static_cast<int>(weights_->config.intermediate_size);
  const auto ids = (*manifest_)["prompts"][0]["token_ids"].get<std::vector<int32_t>>();
  std::vector<std::vector<float>> logits;
  for (int bad : {-1, inter + 1}) {
    FnWidths policy([&](int, int j) { return j == 1 ? bad : inter; });
    absl::Status status = RunPrompt(ids, {.widths = &policy}, &logits);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("width"));
  }
}

// Routes token t of layer l to experts (t + l) % E and (t + l + 1) % E, whatever the weights.
class RotatingRouter : public RouterOverride {
 public:
  void Logits(int layer, int32_t, int position, absl::Span<float> logits) const override {
    const int e = static_cast<int>(logits.size());
    std::fill(logits.begin(), logits.end(), 0.0f);
    logits[(position + layer) % e] = 3.0f;
    logits[(position + layer + 1) % e] = 2.0f;
  }
};

TEST_F(ForwardGoldenTest, RouterOverrideDecidesTheExperts) {
  const int num_experts = static_cast<int>(weights_->config.num_local_experts);
  forward_->SetRouterOverride(std::make_unique<RotatingRouter>());
  const auto ids = (*manifest_)["prompts"][3]["token_ids"].get<std::vector<int32_t>>();
  std::vector<std::vector<float>> logits;
  RouterTrace trace;
  ASSERT_EQ(RunPrompt(ids, {}, &logits, &trace), absl::OkStatus());
  for (size_t l = 0; l < trace.experts.size(); ++l) {
    for (size_t t = 0; t < ids.size(); ++t) {
      EXPECT_EQ(trace.experts[l][2 * t], static_cast<int>(t + l) % num_experts);
      EXPECT_EQ(trace.experts[l][2 * t + 1], static_cast<int>(t + l + 1) % num_experts);
      EXPECT_NEAR(trace.weights[l][2 * t], 1 / (1 + std::exp(-1.0)), 1e-6);
    }
  }
  forward_->SetRouterOverride(nullptr);
}

TEST_F(ForwardGoldenTest, BadInputIsRejected) {
  BlockTable table;
  ASSERT_TRUE(table.Reserve(pool_.get(), 4).ok());
  std::vector<std::vector<float>> logits;
  const std::vector<int32_t> bad_token = {1, 999999};
  StepInput a{bad_token, 0, &table};
  EXPECT_EQ(forward_->Step({&a, 1}, {}, &logits).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> ok = {1, 2};
  StepInput b{ok, 100, &table};  // beyond the reserved blocks
  EXPECT_EQ(forward_->Step({&b, 1}, {}, &logits).code(), absl::StatusCode::kInvalidArgument);
  StepInput c{ok, 0, nullptr};
  EXPECT_EQ(forward_->Step({&c, 1}, {}, &logits).code(), absl::StatusCode::kInvalidArgument);
  table.ReleaseAll(pool_.get());
}

// The tiny model's shape at random weights (seed 3) over a 2,048-position context, with a
// sliding window in every layer where `window` > 0; a bf16 pool of `blocks` blocks of 16; 1,100
// token ids. Tests of long contexts split over threads.
class LongContextModel {
 public:
  void Open(int blocks, int window) {
    std::ifstream in(testing::SourceDir() + "/models/tiny-moe/config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config["max_position_embeddings"] = 2048;
    if (window > 0) config["sliding_window"] = window;  // Mixtral: every layer
    std::ofstream(dir_.path() + "/config.json") << config.dump();
    auto weights =
        LoadModelWeights(*testing::OpenModelDir(dir_.path()), LoadFormat::kDummy, /*seed=*/3);
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = *std::move(weights);
    auto pool = KvBlockPool::Create(KvCacheConfigFor(c(), 16, blocks, kernels::KvDtype::kBf16, 4));
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    auto forward =
        ForwardPass::Create(weights_.get(), pool_.get(), kernels::cpu::FindBackend("auto"));
    ASSERT_TRUE(forward.ok()) << forward.status();
    forward_ = *std::move(forward);
    ids_.resize(1100);
    for (size_t i = 0; i < ids_.size(); ++i) {
      ids_[i] = static_cast<int32_t>((i * 7919 + 13) % c().vocab_size);
    }
  }
  // Reserves `table` for every id and prefills ids [0, head) in chunks of 256.
  void Prefill(BlockTable* table, int head) {
    ASSERT_TRUE(table->Reserve(pool_.get(), static_cast<int>(ids_.size())).ok());
    std::vector<std::vector<float>> logits;
    for (int start = 0; start < head; start += 256) {
      StepInput chunk{ids(start, std::min(256, head - start)), start, table};
      ASSERT_TRUE(forward_->Step({&chunk, 1}, {}, &logits).ok());
    }
  }
  // The logits of `n` ids from `start` run as one step on `table` (every row's).
  std::vector<float> Step(BlockTable* table, int start, int n) {
    std::vector<std::vector<float>> logits;
    StepInput in{ids(start, n), start, table, LogitRows::kAll};
    EXPECT_TRUE(forward_->Step({&in, 1}, {}, &logits).ok());
    return logits.empty() ? std::vector<float>() : logits[0];
  }
  absl::Span<const int32_t> ids(int start, int n) const {
    return absl::MakeConstSpan(ids_).subspan(start, n);
  }
  const model::ModelConfig& c() const { return weights_->config; }
  int vocab() const { return static_cast<int>(c().vocab_size); }
  KvBlockPool* pool() { return pool_.get(); }

 private:
  testing::TempDir dir_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<ForwardPass> forward_;
  std::vector<int32_t> ids_;
};

// Sliding-window layers kept in rings (the window's positions and a round's, written over as the
// sequence moves on) compute what the same layers paged over the whole context compute: a
// gpt-oss-shaped model (windows of 100 on the even layers, whole-context odd layers; ring of 23
// blocks of 16) with two sequences in one step, prompts of 1,000 and 700 tokens in chunks of
// 600 (three rounds of a ring's 269 tokens each) and 300, then decode steps, every row's logits
// against a pool without rings, on random weights with sinks and biases.
TEST(ForwardLongContextTest, WindowRingsComputeWhatPagedWindowsDo) {
  testing::TempDir dir;
  std::ofstream(dir.path() + "/config.json") << R"({
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
    "num_experts_per_tok": 2, "sliding_window": 100, "max_position_embeddings": 2048,
    "rope_theta": 10000})";
  auto weights = LoadModelWeights(*testing::OpenModelDir(dir.path()), LoadFormat::kDummy, 5);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const model::ModelConfig& c = (*weights)->config;
  for (LayerWeights& layer : (*weights)->layers) {  // sinks that matter
    for (size_t h = 0; h < layer.attention.sinks.size(); ++h) layer.attention.sinks[h] = 0.5f * h;
  }
  std::vector<std::vector<std::vector<float>>> runs;
  for (const bool rings : {true, false}) {
    const KvCacheConfig kv = KvCacheConfigFor(c, 16, 2 * 70, kernels::KvDtype::kBf16, 2, rings);
    EXPECT_EQ(!kv.rings.empty(), rings);
    EXPECT_EQ(kv.num_layers, rings ? 2 : 4);
    const CacheLayout layout = CacheLayoutFor(c, 16, kernels::KvDtype::kBf16, rings);
    EXPECT_EQ(layout.ring_blocks[0], rings ? 23 : 0);  // (100 - 1 + 256) / 16, rounded up
    auto pool = KvBlockPool::Create(kv);
    ASSERT_TRUE(pool.ok()) << pool.status();
    auto forward = ForwardPass::Create(weights->get(), pool->get());
    ASSERT_TRUE(forward.ok()) << forward.status();
    std::vector<int32_t> ids(1100);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % 512);
    BlockTable a, b;
    ASSERT_TRUE(a.Reserve(pool->get(), 1100).ok());
    ASSERT_TRUE(b.Reserve(pool->get(), 1100).ok());
    std::vector<std::vector<float>> steps, logits;
    auto step = [&](int a_start, int a_n, int b_start, int b_n) {
      std::vector<StepInput> batch;
      if (a_n > 0)
        batch.push_back(
            {absl::MakeConstSpan(ids).subspan(a_start, a_n), a_start, &a, LogitRows::kAll});
      if (b_n > 0)
        batch.push_back(
            {absl::MakeConstSpan(ids).subspan(b_start, b_n), b_start, &b, LogitRows::kAll});
      ASSERT_EQ((*forward)->Step(batch, {}, &logits), absl::OkStatus());
      for (auto& l : logits) steps.push_back(l);
    };
    step(0, 600, 0, 300);
    step(600, 400, 300, 300);
    step(0, 0, 600, 100);
    for (int i = 0; i < 4; ++i) step(1000 + i, 1, 700 + i, 1);
    runs.push_back(steps);
    a.ReleaseAll(pool->get());
    b.ReleaseAll(pool->get());
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  const int vocab = static_cast<int>(c.vocab_size);
  double worst = 0;
  for (size_t s = 0; s < runs[0].size(); ++s) {
    ASSERT_EQ(runs[0][s].size(), runs[1][s].size());
    for (size_t row = 0; row < runs[0][s].size() / vocab; ++row) {
      for (float x : absl::MakeConstSpan(runs[0][s]).subspan(row * vocab, vocab)) {
        ASSERT_TRUE(std::isfinite(x));
      }
      worst = std::max(worst, testing::NormalisedRowError(&runs[0][s][row * vocab],
                                                          &runs[1][s][row * vocab], vocab));
    }
  }
  std::cout << "rings against paged windows: worst normalised logit error " << worst << "\n";
  EXPECT_LT(worst, 1e-5);
}

// A block of prompt queries whose context splits over threads: a 3-token chunk after 1,097
// prompt tokens is one unit, so its context runs in parts merged by their log-sum-exps. On
// random weights with a 2,048-position context and a bf16 cache, the chunk's logits agree with
// the same tokens decoded one at a time (each split the same way, one query per part).
TEST(ForwardLongContextTest, SplitPromptBlocksAgreeWithTokenByToken) {
  LongContextModel m;
  ASSERT_NO_FATAL_FAILURE(m.Open(/*blocks=*/160, /*window=*/0));
  const int head = 1097, vocab = m.vocab();
  // Both tables hold the same first 1,097 tokens, prefilled in chunks of 256.
  BlockTable block_table, token_table;
  ASSERT_NO_FATAL_FAILURE(m.Prefill(&block_table, head));
  ASSERT_NO_FATAL_FAILURE(m.Prefill(&token_table, head));
  const std::vector<float> block = m.Step(&block_table, head, 3);
  ASSERT_EQ(block.size(), 3u * vocab);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> token = m.Step(&token_table, head + i, 1);
    ASSERT_EQ(token.size(), static_cast<size_t>(vocab));
    EXPECT_LT(testing::NormalisedRowError(&block[i * vocab], token.data(), vocab), 2e-2)
        << "token " << head + i;
  }
  block_table.ReleaseAll(m.pool());
  token_table.ReleaseAll(m.pool());
}

// Sliding windows over long contexts split over threads read nothing before their window: with
// every layer's keys and values before the first query's window overwritten with NaN, a decode
// token (its window split into parts) gives the logits of the untouched cache, and a 3-token
// prompt chunk (a query block, each query its own window) agrees with the tokens decoded one at
// a time, all finite.
TEST(ForwardLongContextTest, SlidingWindowsReadNothingBeforeTheirWindow) {
  LongContextModel m;
  ASSERT_NO_FATAL_FAILURE(m.Open(/*blocks=*/300, /*window=*/700));
  ASSERT_EQ(m.c().LayerWindow(0), 700);
  const int head = 1097, vocab = m.vocab();
  BlockTable clean, poisoned, poisoned_token, tokens;
  for (BlockTable* table : {&clean, &poisoned, &poisoned_token, &tokens}) {
    ASSERT_NO_FATAL_FAILURE(m.Prefill(table, head));
  }
  const int kv_dim = static_cast<int>(m.c().num_key_value_heads * m.c().head_dim);
  const std::vector<float> nan_row(kv_dim, NAN);
  for (BlockTable* table : {&poisoned, &poisoned_token}) {
    for (int layer = 0; layer < m.pool()->config().num_layers; ++layer) {
      const kernels::PagedKvOut out = m.pool()->Writer(layer, table->blocks().data());
      for (int32_t pos = 0; pos < head + 1 - 700; ++pos) {
        kernels::cpu::ActiveBackend().kv_store(out, 1, &pos, nan_row.data(), nan_row.data());
      }
    }
  }
  const std::vector<float> want = m.Step(&clean, head, 1);
  const std::vector<float> block = m.Step(&poisoned, head, 3);
  ASSERT_EQ(block.size(), 3u * vocab);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> token = m.Step(&tokens, head + i, 1);
    ASSERT_EQ(token.size(), static_cast<size_t>(vocab));
    for (int v = 0; v < vocab; ++v) ASSERT_TRUE(std::isfinite(block[i * vocab + v])) << i;
    EXPECT_LT(testing::NormalisedRowError(&block[i * vocab], token.data(), vocab), 2e-2)
        << "token " << head + i;
    if (i == 0) {
      EXPECT_LT(testing::NormalisedRowError(token.data(), want.data(), vocab), 1e-6);
    }
  }
  // The decode token itself, its window's positions in parts over the threads.
  EXPECT_EQ(m.Step(&poisoned_token, head, 1), want);
  for (BlockTable* table : {&clean, &poisoned, &poisoned_token, &tokens}) {
    table->ReleaseAll(m.pool());
  }
}

}  // namespace
}  // namespace tandem::engine
