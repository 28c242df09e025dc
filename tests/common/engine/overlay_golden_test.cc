// The engine's distilled decoder against the PyTorch student (tools/train/distill.py), on the
// shipped overlays (tests/golden/distill, made by tools/train/overlay_golden.py): a full
// prefill of the first `split` tokens (the model's weights), then the rest as the plan's
// decoder with the overlay, reading that KV cache (handoff); and the student alone over every
// position (conventional).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <iostream>
#include <vector>

#include "common/engine/forward.h"
#include "common/engine/overlay.h"
#include "common/model/npy.h"
#include "common/moe/pruning_plan.h"
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
  return testing::SourceDir() + "/tests/golden/distill/" + name;
}

class OverlayGoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { testing::UseExactKernels(); }
};

TEST_P(OverlayGoldenTest, DistilledDecoderMatchesThePyTorchStudent) {
  std::ifstream in(CaseDir(GetParam()) + "/golden.json");
  ASSERT_TRUE(in) << "no " << CaseDir(GetParam()) << "/golden.json (tools/train/overlay_golden.py)";
  const nlohmann::json golden = nlohmann::json::parse(in);
  const std::string root = testing::SourceDir() + "/";
  const std::string model_dir = root + golden["model"].get<std::string>();
  auto weights = LoadModelWeights(*testing::OpenModelDir(model_dir), LoadFormat::kSafetensors);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const auto& c = (*weights)->config;
  // The plan as the golden file gives it: its hash is the one the overlay names.
  auto loaded = moe::LoadPlanMask(root + golden["plan"].get<std::string>(),
                                  *testing::OpenModelDir(model_dir));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const ExpertMask plan = *std::move(loaded);
  ASSERT_EQ(PlanSha256(plan, c), golden["plan_sha256"].get<std::string>());
  auto overlay = LoadDecoderOverlay(root + golden["overlay"].get<std::string>(),
                                    *testing::OpenModelDir(model_dir), **weights, plan);
  ASSERT_TRUE(overlay.ok()) << overlay.status();
  auto pool = KvBlockPool::Create(KvCacheConfigFor(c, /*block_size=*/8, /*num_blocks=*/24,
                                                   kernels::KvDtype::kF32, /*max_sequences=*/3));
  ASSERT_TRUE(pool.ok());
  auto forward = ForwardPass::Create(weights->get(), pool->get());
  ASSERT_TRUE(forward.ok());
  const auto ids = golden["token_ids"].get<std::vector<int32_t>>();
  const int n = static_cast<int>(ids.size());
  const int split = golden["split"].get<int>();
  const int vocab = static_cast<int>(c.vocab_size);
  const MoeOptions full{};
  const MoeOptions distilled{.mask = &plan, .overlay = overlay->get()};
  auto compare = [&](const std::vector<float>& got, const std::string& file, int rows) {
    auto want = model::ReadNpy(CaseDir(GetParam()) + "/" + file);
    ASSERT_TRUE(want.ok()) << want.status();
    const std::vector<float> expected = *want->AsFloat32();
    ASSERT_EQ(expected.size(), static_cast<size_t>(rows) * vocab);
    ASSERT_EQ(got.size(), expected.size());
    double worst = 0;
    for (int r = 0; r < rows; ++r) {
      const double error = NormalisedRowError(&got[static_cast<size_t>(r) * vocab],
                                              &expected[static_cast<size_t>(r) * vocab], vocab);
      worst = std::max(worst, error);
      EXPECT_LT(error, kLogitTolerance) << file << " row " << r;
    }
    std::cout << GetParam() << " " << file << ": worst normalised logit error " << worst << "\n";
  };

  BlockTable table;
  ASSERT_TRUE(table.Reserve(pool->get(), n).ok());
  std::vector<std::vector<float>> logits;
  // Handoff: the full prefill's KV, then the distilled decoder over the rest in one chunk.
  StepInput prefill{absl::MakeConstSpan(ids).subspan(0, split), 0, &table, LogitRows::kNone};
  ASSERT_TRUE((*forward)->Step({&prefill, 1}, full, &logits).ok());
  // A recurrent model's state after the prefill, for running the decode part again below.
  std::vector<std::byte> prefill_state;
  if (table.state_slot() >= 0) {
    const std::byte* state = (*pool)->state(table.state_slot());
    prefill_state.assign(state, state + (*pool)->config().state_bytes);
  }
  StepInput decode{absl::MakeConstSpan(ids).subspan(split), split, &table, LogitRows::kAll};
  ASSERT_TRUE((*forward)->Step({&decode, 1}, distilled, &logits).ok());
  compare(logits[0], "handoff_logits.npy", n - split);
  // Again in one step with another sequence's prompt on the base weights before and after it
  // (colocated serving's mixed batches): the same logits.
  BlockTable other_before, other_after;
  ASSERT_TRUE(other_before.Reserve(pool->get(), split).ok());
  ASSERT_TRUE(other_after.Reserve(pool->get(), split).ok());
  if (!prefill_state.empty()) {
    std::copy(prefill_state.begin(), prefill_state.end(), (*pool)->state(table.state_slot()));
  }
  const auto prompt = absl::MakeConstSpan(ids).subspan(0, split);
  StepInput mixed[] = {
      {prompt, 0, &other_before, LogitRows::kLast, &full},
      {absl::MakeConstSpan(ids).subspan(split), split, &table, LogitRows::kAll, &distilled},
      {prompt, 0, &other_after, LogitRows::kLast, &full}};
  ASSERT_TRUE((*forward)->Step(mixed, full, &logits).ok());
  compare(logits[1], "handoff_logits.npy", n - split);
  EXPECT_EQ(logits[0], logits[2]);
  other_before.ReleaseAll(pool->get());
  other_after.ReleaseAll(pool->get());
  // Conventional: the distilled decoder over every position.
  StepInput all{ids, 0, &table, LogitRows::kAll};
  ASSERT_TRUE((*forward)->Step({&all, 1}, distilled, &logits).ok());
  compare(logits[0], "conventional_logits.npy", n);
  table.ReleaseAll(pool->get());
}

INSTANTIATE_TEST_SUITE_P(Shipped, OverlayGoldenTest,
                         ::testing::Values("tiny-moe-reap-keep8", "tiny-fg-moe-reap-keep32",
                                           "tiny-hybrid-moe-reap-keep32"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace tandem::engine
