// The engine against the PyTorch reference (tools/train/model.py) on small random-weight
// checkpoints of every architecture option it runs (tests/golden/arch, made by
// tools/train/arch_goldens.py): Qwen3-MoE's q/k norm and attention bias, Qwen2-MoE's shared
// expert and q/k/v bias, norm_topk_prob both ways, dense layers among sparse ones
// (mlp_only_layers, decoder_sparse_step), tied embeddings, Mixtral, and DeepSeek-MoE's ungated
// shared experts, first_k_dense_replace / moe_layer_freq dense layers and attention bias, and
// Qwen3.5-MoE's hybrid of Gated DeltaNet and gated attention (partial rotary, zero-centred
// norms, stacked experts, the published layout and the text-only one), whose chunked prefill
// and token-by-token decode carry the DeltaNet's state from step to step, and DeepSeek-V2/V3's
// multi-head latent attention (absorbed, over a cache of the latent and the rotary key; YaRN;
// with and without the query's low-rank step) and routers (group-limited softmax, scaled;
// sigmoid chosen with a selection bias within groups, renormalised and scaled), and sliding
// windows (Mixtral's on every layer, Qwen3-MoE's from max_window_layers on). Logits of
// the whole sequence, then of a chunked prefill and token-by-token decode through the paged KV
// cache, and the router's choices and weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/engine/forward.h"
#include "common/model/npy.h"
#include "nlohmann/json.hpp"
#include "tests/testing/golden.h"
#include "tests/testing/kernels.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::engine {
namespace {

using testing::kLogitTolerance;
using testing::NormalisedRowError;

std::string CaseDir(const std::string& name) {
  return testing::SourceDir() + "/tests/golden/arch/" + name;
}

class ArchitectureGoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    testing::UseExactKernels();
    auto weights =
        LoadModelWeights(*testing::OpenModelDir(CaseDir(GetParam())), LoadFormat::kSafetensors);
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = *std::move(weights);
    const auto& c = weights_->config;
    const KvCacheConfig kv = KvCacheConfigFor(c, /*block_size=*/8, /*num_blocks=*/48,
                                              kernels::KvDtype::kF32, /*max_sequences=*/2);
    auto pool = KvBlockPool::Create(kv);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    auto forward = ForwardPass::Create(weights_.get(), pool_.get());
    ASSERT_TRUE(forward.ok()) << forward.status();
    forward_ = *std::move(forward);
    std::ifstream in(CaseDir(GetParam()) + "/golden.json");
    golden_ = nlohmann::json::parse(in, nullptr, false);
    ASSERT_FALSE(golden_.is_discarded());
    ids_ = golden_["token_ids"].get<std::vector<int32_t>>();
    auto logits = model::ReadNpy(CaseDir(GetParam()) + "/logits.npy");
    ASSERT_TRUE(logits.ok()) << logits.status();
    logits_ = *logits->AsFloat32();
  }

  std::vector<float> Npy(const std::string& file) {
    auto array = model::ReadNpy(CaseDir(GetParam()) + "/" + file);
    EXPECT_TRUE(array.ok()) << array.status();
    return array.ok() ? *array->AsFloat32() : std::vector<float>();
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<ForwardPass> forward_;
  nlohmann::json golden_;
  std::vector<int32_t> ids_;
  std::vector<float> logits_;
};

TEST_P(ArchitectureGoldenTest, WholeSequenceLogitsAndRoutingMatchPyTorch) {
  const auto& c = weights_->config;
  const int vocab = static_cast<int>(c.vocab_size);
  const int experts = static_cast<int>(c.num_local_experts);
  const int top_k = static_cast<int>(c.num_experts_per_tok);
  const int n = static_cast<int>(ids_.size());
  BlockTable table;
  ASSERT_TRUE(table.Reserve(pool_.get(), n).ok());
  std::vector<std::vector<float>> logits;
  RouterTrace trace;
  StepInput in{ids_, 0, &table, LogitRows::kAll};
  ASSERT_TRUE(forward_->Step({&in, 1}, {}, &logits, &trace).ok());
  table.ReleaseAll(pool_.get());
  double worst = 0;
  for (int t = 0; t < n; ++t) {
    const double error = NormalisedRowError(&logits[0][static_cast<size_t>(t) * vocab],
                                            &logits_[static_cast<size_t>(t) * vocab], vocab);
    worst = std::max(worst, error);
    EXPECT_LT(error, kLogitTolerance) << "position " << t;
  }

  // The trace has an entry per layer; a dense layer's is empty.
  const auto sparse = golden_["sparse_layers"].get<std::vector<int>>();
  ASSERT_EQ(trace.experts.size(), static_cast<size_t>(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const bool is_sparse = std::find(sparse.begin(), sparse.end(), l) != sparse.end();
    EXPECT_EQ(c.IsSparseLayer(l), is_sparse) << "layer " << l;
    EXPECT_EQ(trace.experts[l].empty(), !is_sparse) << "layer " << l;
  }
  auto golden_experts = *model::ReadNpy(CaseDir(GetParam()) + "/experts.npy")->AsInt32();
  const std::vector<float> golden_weights = Npy("weights.npy");
  int compared = 0;
  for (size_t s = 0; s < sparse.size(); ++s) {
    const int l = sparse[s];
    for (int t = 0; t < n; ++t) {
      std::vector<float> p(&trace.probs[l][static_cast<size_t>(t) * experts],
                           &trace.probs[l][static_cast<size_t>(t + 1) * experts]);
      std::sort(p.rbegin(), p.rend());
      if (p[top_k - 1] - p[top_k] < 1e-5) continue;  // a near-tie may go either way
      ++compared;
      for (int j = 0; j < top_k; ++j) {
        const size_t at = (s * n + t) * top_k + j;
        EXPECT_EQ(trace.experts[l][static_cast<size_t>(t) * top_k + j], golden_experts[at])
            << "layer " << l << " token " << t << " rank " << j;
        EXPECT_NEAR(trace.weights[l][static_cast<size_t>(t) * top_k + j], golden_weights[at], 1e-5)
            << "layer " << l << " token " << t << " rank " << j;
      }
    }
  }
  EXPECT_GT(compared, static_cast<int>(sparse.size()) * n * 9 / 10);
  std::cout << GetParam() << ": worst normalised logit error " << worst << ", " << compared
            << " routed tokens compared\n";
}

TEST_P(ArchitectureGoldenTest, ChunkedPrefillThenCachedDecodeMatchPyTorch) {
  const int vocab = static_cast<int>(weights_->config.vocab_size);
  const int n = static_cast<int>(ids_.size());
  BlockTable table;
  ASSERT_TRUE(table.Reserve(pool_.get(), n).ok());
  std::vector<std::vector<float>> logits;
  // A prefill of 5 then 6 tokens (across a block boundary), then one token a step.
  int start = 0;
  for (int chunk : {5, 6}) {
    StepInput in{absl::MakeConstSpan(ids_).subspan(start, chunk), start, &table, LogitRows::kAll};
    ASSERT_TRUE(forward_->Step({&in, 1}, {}, &logits).ok());
    for (int i = 0; i < chunk; ++i) {
      EXPECT_LT(NormalisedRowError(&logits[0][static_cast<size_t>(i) * vocab],
                                   &logits_[static_cast<size_t>(start + i) * vocab], vocab),
                kLogitTolerance)
          << "position " << start + i;
    }
    start += chunk;
  }
  for (; start < n; ++start) {
    StepInput in{absl::MakeConstSpan(ids_).subspan(start, 1), start, &table};
    ASSERT_TRUE(forward_->Step({&in, 1}, {}, &logits).ok());
    EXPECT_LT(
        NormalisedRowError(logits[0].data(), &logits_[static_cast<size_t>(start) * vocab], vocab),
        kLogitTolerance)
        << "position " << start;
  }
  table.ReleaseAll(pool_.get());
}

// Two sequences in one step, a prompt chunk beside a decode token, give what each gives alone:
// per-sequence caches (K/V blocks, the DeltaNet's state slots) do not leak into each other.
TEST_P(ArchitectureGoldenTest, BatchedSequencesMatchTheirOwnRuns) {
  const int vocab = static_cast<int>(weights_->config.vocab_size);
  const int n = std::min<int>(static_cast<int>(ids_.size()), 20);
  const std::vector<int32_t> a(ids_.begin(), ids_.begin() + n);
  const std::vector<int32_t> b(ids_.rbegin(), ids_.rbegin() + n);
  auto alone = [&](const std::vector<int32_t>& ids) {
    BlockTable table;
    EXPECT_TRUE(table.Reserve(pool_.get(), n).ok());
    std::vector<std::vector<float>> logits;
    StepInput in{ids, 0, &table, LogitRows::kAll};
    EXPECT_TRUE(forward_->Step({&in, 1}, {}, &logits).ok());
    table.ReleaseAll(pool_.get());
    return logits.empty() ? std::vector<float>() : logits[0];
  };
  const std::vector<float> want_a = alone(a), want_b = alone(b);
  ASSERT_EQ(want_a.size(), static_cast<size_t>(n) * vocab);
  // a: its first n - 1 tokens, then its last as a decode token beside b's whole prompt.
  BlockTable ta, tb;
  ASSERT_TRUE(ta.Reserve(pool_.get(), n).ok());
  ASSERT_TRUE(tb.Reserve(pool_.get(), n).ok());
  std::vector<std::vector<float>> logits;
  StepInput first{absl::MakeConstSpan(a).first(n - 1), 0, &ta, LogitRows::kAll};
  ASSERT_TRUE(forward_->Step({&first, 1}, {}, &logits).ok());
  StepInput both[] = {{absl::MakeConstSpan(a).last(1), n - 1, &ta, LogitRows::kAll},
                      {b, 0, &tb, LogitRows::kAll}};
  ASSERT_TRUE(forward_->Step(both, {}, &logits).ok());
  EXPECT_LT(
      NormalisedRowError(logits[0].data(), &want_a[static_cast<size_t>(n - 1) * vocab], vocab),
      kLogitTolerance);
  for (int t = 0; t < n; ++t) {
    EXPECT_LT(NormalisedRowError(&logits[1][static_cast<size_t>(t) * vocab],
                                 &want_b[static_cast<size_t>(t) * vocab], vocab),
              kLogitTolerance)
        << "position " << t;
  }
  ta.ReleaseAll(pool_.get());
  tb.ReleaseAll(pool_.get());
}

INSTANTIATE_TEST_SUITE_P(RandomCheckpoints, ArchitectureGoldenTest,
                         ::testing::Values("qwen3_moe_norm_dense_tied", "qwen3_moe_step2_bias",
                                           "qwen2_moe_shared", "qwen2_moe_norm_tied", "mixtral",
                                           "deepseek_dense_shared", "deepseek_freq2_bias_tied",
                                           "qwen3_5_moe_hybrid", "qwen3_5_moe_text_tied",
                                           "deepseek_v2_latent_yarn", "deepseek_v3_sigmoid_groups",
                                           "qwen3_moe_sliding_window", "mixtral_sliding_window",
                                           "gpt_oss_sinks_windows", "gpt_oss_mxfp4", "gemma4_moe",
                                           "gemma4_text_moe"));

}  // namespace
}  // namespace tandem::engine
