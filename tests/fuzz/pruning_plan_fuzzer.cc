// A pruning plan (proto JSON) as tandem-decode and tandem serve load one for the shipped tiny
// model (moe::LoadPlanFor: the JSON parsed, validated against the model's config.json, its
// mask built), then what decode derives from a valid plan: the mixed-width policy of a plan
// with tiers, applied to every pair of retained experts, and the expert cache's priorities.
#include <algorithm>
#include <string>
#include <vector>

#include "common/moe/pruning_plan.h"
#include "common/moe/tiers.h"
#include "tests/fuzz/fuzz_util.h"

namespace tandem::moe {
namespace {

void CheckValid(const PlanForModel& loaded, const model::ModelConfig& config) {
  const tandem::v1::PruningPlan& plan = loaded.plan;
  FUZZ_CHECK(ValidatePlan(plan, config).ok());
  FUZZ_CHECK(static_cast<int64_t>(loaded.mask.retained.size()) == config.num_hidden_layers);
  for (const tandem::v1::LayerPlan& layer : plan.layers()) {
    const std::vector<bool>& retained = loaded.mask.retained[layer.layer()];
    FUZZ_CHECK(static_cast<int64_t>(retained.size()) == config.num_local_experts);
    FUZZ_CHECK(std::count(retained.begin(), retained.end(), true) == layer.retained_experts_size());
    for (int e : layer.retained_experts()) FUZZ_CHECK(retained[e]);
  }

  const std::vector<std::vector<double>> priorities = CachePriorities(plan);
  FUZZ_CHECK(static_cast<int64_t>(priorities.size()) == config.num_hidden_layers);
  for (const std::vector<double>& layer : priorities) {
    FUZZ_CHECK(static_cast<int64_t>(layer.size()) == config.num_local_experts);
  }
  if (!plan.has_tiers()) {
    FUZZ_CHECK(!TierWidthPolicy::Create(plan, config).ok());
    return;
  }
  absl::StatusOr<std::unique_ptr<TierWidthPolicy>> policy = TierWidthPolicy::Create(plan, config);
  FUZZ_CHECK(policy.ok());
  const int full = static_cast<int>(config.intermediate_size);
  for (const tandem::v1::LayerPlan& layer : plan.layers()) {
    const auto& experts = layer.retained_experts();
    for (int i = 0; i < experts.size(); ++i) {
      for (int j = 0; j < experts.size(); ++j) {
        if (i == j) continue;
        const int32_t routed[2] = {experts[i], experts[j]};
        float weights[2] = {0.6f, 0.4f};
        int widths[2] = {-1, -1};
        (*policy)->Widths(layer.layer(), routed, weights, widths);
        for (int w : widths) FUZZ_CHECK(w >= 0 && w <= full);
        FUZZ_CHECK(widths[0] == full || widths[1] == full);  // the dominant runs whole
      }
    }
  }
}

}  // namespace
}  // namespace tandem::moe

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::MemFile* file = new tandem::fuzz::MemFile();
  static const tandem::model::ModelDir* model_dir =
      tandem::model::ModelDir::Open(tandem::fuzz::TinyModelDir()).value().release();
  absl::StatusOr<tandem::moe::PlanForModel> loaded =
      tandem::moe::LoadPlanFor(file->Write(data, size), *model_dir);
  if (loaded.ok()) {
    tandem::moe::CheckValid(*loaded, model_dir->config());
  } else {
    FUZZ_CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
  }
  return 0;
}
