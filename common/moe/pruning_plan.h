// Pruning plans (proto/tandem/v1/pruning_plan.proto, stored as proto JSON): which experts each
// layer's decoder keeps. `tandem prune` makes one from calibration statistics by a criterion
// (see docs/design.md): per layer, the `keep` experts with the highest score are
// retained, ties going to the lower index.
//   frequency  tokens routed to the expert
//   mass       sum of its router probability over them
//   ean        sum of its output norms over them
//   reap       mean of router probability x output norm over them
// A plan is validated against the model it is used with before anything runs on it.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/engine/forward.h"
#include "common/model/config.h"
#include "common/model/model_dir.h"
#include "common/moe/calibration.h"
#include "tandem/v1/pruning_plan.pb.h"

namespace tandem::moe {

// "frequency", "mass", "ean" or "reap"; INVALID_ARGUMENT otherwise.
absl::StatusOr<tandem::v1::PruningCriterion> ParseCriterion(const std::string& name);

// INVALID_ARGUMENT unless 1 <= keep <= the experts in `stats`.
absl::StatusOr<tandem::v1::PruningPlan> MakePlan(const CalibrationStats& stats,
                                                 tandem::v1::PruningCriterion criterion, int keep);

// INVALID_ARGUMENT naming the first problem: a plan for another number of layers or experts,
// a layer missing, repeated or out of order, an expert out of range, repeated or unsorted, or
// fewer retained experts than the model routes each token to.
absl::Status ValidatePlan(const tandem::v1::PruningPlan& plan, const model::ModelConfig& config);

// The router mask of a valid plan.
absl::StatusOr<engine::ExpertMask> MaskFromPlan(const tandem::v1::PruningPlan& plan,
                                                const model::ModelConfig& config);

// The plan at `plan_path` read for the model in `dir`: the plan, validated against the
// model's config, and its mask. Errors about the plan name its path.
struct PlanForModel {
  tandem::v1::PruningPlan plan;
  engine::ExpertMask mask;
};
absl::StatusOr<PlanForModel> LoadPlanFor(const std::string& plan_path, const model::ModelDir& dir);
// Its mask only.
absl::StatusOr<engine::ExpertMask> LoadPlanMask(const std::string& plan_path,
                                                const model::ModelDir& dir);

absl::Status SavePlan(const tandem::v1::PruningPlan& plan, const std::string& path);
// NOT_FOUND for a missing file, INVALID_ARGUMENT for JSON that is not a plan.
absl::StatusOr<tandem::v1::PruningPlan> LoadPlan(const std::string& path);

}  // namespace tandem::moe
