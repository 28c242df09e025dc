#include "common/engine/overlay.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/safetensors.h"
#include "common/util/sha256.h"
#include "common/util/status.h"

namespace tandem::engine {
namespace {

namespace fs = std::filesystem;
using model::TensorKind;

std::string Metadata(const model::SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata().find(key);
  return it == file.metadata().end() ? "" : it->second;
}

std::string Short(const std::string& sha) { return sha.substr(0, 12); }

// Copies the always-on fields of `from`.
LayerWeights AlwaysOnCopy(const LayerWeights& from) {
  LayerWeights to;
  to.attn_norm = from.attn_norm;
  to.ffn_norm = from.ffn_norm;
  to.moe.router = from.moe.router;
  to.moe.shared = from.moe.shared;
  to.moe.shared_gate = from.moe.shared_gate;
  to.dense = from.dense;
  to.post_attn_norm = from.post_attn_norm;
  to.post_ffn_norm = from.post_ffn_norm;
  to.post_dense_norm = from.post_dense_norm;
  to.pre_moe_norm = from.pre_moe_norm;
  to.post_moe_norm = from.post_moe_norm;
  to.layer_scalar = from.layer_scalar;
  to.moe.router_norm = from.moe.router_norm;
  to.moe.expert_scale = from.moe.expert_scale;
  return to;
}

// The field of `layer` (or the final norm) that holds a tensor of `kind`.
absl::Status Assign(const model::TensorSpec& spec, const model::TensorView& view,
                    const model::ModelConfig& config, LayerWeights* layer,
                    std::vector<float>* final_norm) {
  auto matrix = [&](WeightMatrix* m) -> absl::Status {
    ASSIGN_OR_RETURN(*m, WeightFromTensor(view));
    return absl::OkStatus();
  };
  switch (spec.kind) {
    case TensorKind::kAttnNorm:
      layer->attn_norm = NormFromTensor(view, config);
      return absl::OkStatus();
    case TensorKind::kFfnNorm:
      layer->ffn_norm = NormFromTensor(view, config);
      return absl::OkStatus();
    case TensorKind::kOutputNorm:
      *final_norm = NormFromTensor(view, config);
      return absl::OkStatus();
    case TensorKind::kPostAttnNorm:
      layer->post_attn_norm = NormFromTensor(view, config);
      return absl::OkStatus();
    case TensorKind::kPostFfnNorm:
      layer->post_ffn_norm = NormFromTensor(view, config);
      return absl::OkStatus();
    case TensorKind::kPostDenseNorm:
      layer->post_dense_norm = NormFromTensor(view, config);
      return absl::OkStatus();
    case TensorKind::kPreMoeNorm:
      layer->pre_moe_norm = NormFromTensor(view, config);
      return absl::OkStatus();
    case TensorKind::kPostMoeNorm:
      layer->post_moe_norm = NormFromTensor(view, config);
      return absl::OkStatus();
    case TensorKind::kLayerScalar:
      layer->layer_scalar = VectorFromTensor(view);
      return absl::OkStatus();
    case TensorKind::kRouterScale:
      layer->moe.router_norm = RouterNormFromScale(view, config);
      return absl::OkStatus();
    case TensorKind::kRouterExpertScale:
      layer->moe.expert_scale = VectorFromTensor(view);
      return absl::OkStatus();
    case TensorKind::kRouter:
      return matrix(&layer->moe.router);
    case TensorKind::kSharedGate:
      return matrix(&layer->moe.shared.gate);
    case TensorKind::kSharedUp:
      return matrix(&layer->moe.shared.up);
    case TensorKind::kSharedDown:
      return matrix(&layer->moe.shared.down);
    case TensorKind::kSharedExpertGate:
      return matrix(&layer->moe.shared_gate);
    case TensorKind::kDenseGate:
      return matrix(&layer->dense.gate);
    case TensorKind::kDenseUp:
      return matrix(&layer->dense.up);
    case TensorKind::kDenseDown:
      return matrix(&layer->dense.down);
    default:
      return absl::InternalError(absl::StrCat(spec.name, " is not always-on"));
  }
}

}  // namespace

bool IsAlwaysOn(TensorKind kind) {
  switch (kind) {
    case TensorKind::kAttnNorm:
    case TensorKind::kFfnNorm:
    case TensorKind::kOutputNorm:
    case TensorKind::kRouter:
    case TensorKind::kSharedGate:
    case TensorKind::kSharedUp:
    case TensorKind::kSharedDown:
    case TensorKind::kSharedExpertGate:
    case TensorKind::kDenseGate:
    case TensorKind::kDenseUp:
    case TensorKind::kDenseDown:
    case TensorKind::kPostAttnNorm:
    case TensorKind::kPostFfnNorm:
    case TensorKind::kPostDenseNorm:
    case TensorKind::kPreMoeNorm:
    case TensorKind::kPostMoeNorm:
    case TensorKind::kLayerScalar:
    case TensorKind::kRouterScale:
    case TensorKind::kRouterExpertScale:
      return true;
    default:
      return false;
  }
}

std::string PlanSha256(const ExpertMask& mask, const model::ModelConfig& config) {
  std::string text;
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    std::vector<int> kept;
    for (int e = 0; e < config.num_local_experts; ++e) {
      if (mask.retained.empty() || mask.retained[l][e]) kept.push_back(e);
    }
    absl::StrAppend(&text, absl::StrJoin(kept, ","), "\n");
  }
  return util::Sha256Hex(text);
}

absl::StatusOr<std::string> CheckpointSha256(const std::string& model_dir) {
  const fs::path single = fs::path(model_dir) / "model.safetensors";
  if (fs::exists(single)) return util::Sha256OfFile(single.string());
  std::vector<std::string> shards;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(model_dir, error)) {
    const std::string name = entry.path().filename().string();
    if (absl::EndsWith(name, ".safetensors")) shards.push_back(name);
  }
  if (error || shards.empty()) {
    return absl::NotFoundError(absl::StrCat("no safetensors checkpoint in ", model_dir));
  }
  std::sort(shards.begin(), shards.end());
  std::string lines;
  for (const std::string& shard : shards) {
    ASSIGN_OR_RETURN(std::string sha, util::Sha256OfFile((fs::path(model_dir) / shard).string()));
    absl::StrAppend(&lines, sha, "  ", shard, "\n");
  }
  return util::Sha256Hex(lines);
}

absl::StatusOr<std::unique_ptr<DecoderOverlay>> LoadDecoderOverlay(const std::string& path,
                                                                   const model::ModelDir& dir,
                                                                   const ModelWeights& base,
                                                                   const ExpertMask& plan) {
  const model::ModelConfig& config = base.config;
  ASSIGN_OR_RETURN(std::unique_ptr<model::SafetensorsFile> file,
                   model::SafetensorsFile::Open(path));
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("overlay ", path, ": ", why));
  };
  if (Metadata(*file, "format") != kOverlayFormat) {
    return refuse(absl::StrCat("not a decoder overlay (its metadata's format is \"",
                               Metadata(*file, "format"), "\", not \"", kOverlayFormat, "\")"));
  }
  if (Metadata(*file, "version") != kOverlayVersion) {
    return refuse(absl::StrCat("overlay version \"", Metadata(*file, "version"),
                               "\"; this build reads version ", kOverlayVersion));
  }
  auto overlay = std::make_unique<DecoderOverlay>();
  overlay->path = path;
  overlay->name = fs::path(path).filename().string();
  if (absl::EndsWith(overlay->name, ".safetensors")) {
    overlay->name.resize(overlay->name.size() - std::string_view(".safetensors").size());
  }
  overlay->base_sha256 = Metadata(*file, "base_sha256");
  overlay->plan_sha256 = Metadata(*file, "plan_sha256");
  overlay->recipe = Metadata(*file, "recipe");

  ASSIGN_OR_RETURN(const std::string base_sha, CheckpointSha256(dir.path()));
  if (overlay->base_sha256 != base_sha) {
    return refuse(absl::StrCat("made for base model \"", Metadata(*file, "base_model"),
                               "\" (checkpoint sha256 ", Short(overlay->base_sha256),
                               "...), not the checkpoint in ", dir.path(), " (sha256 ",
                               Short(base_sha), "...)"));
  }
  const std::string plan_sha = PlanSha256(plan, config);
  if (overlay->plan_sha256 != plan_sha) {
    return refuse(absl::StrCat(
        "made for pruning plan \"", Metadata(*file, "plan"), "\" (retained experts sha256 ",
        Short(overlay->plan_sha256), "...), not ",
        plan.retained.empty() ? "the full model (no --plan)"
                              : absl::StrCat("this plan (sha256 ", Short(plan_sha), "...)"),
        "; an overlay runs only with the plan it was distilled for"));
  }

  std::map<std::string, model::TensorSpec> always_on;
  for (model::TensorSpec& spec : model::ExpectedTensors(config)) {
    if (IsAlwaysOn(spec.kind)) always_on.emplace(spec.name, std::move(spec));
  }
  overlay->tensors = file->Names();
  if (overlay->tensors.empty()) return refuse("holds no tensors");
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    overlay->layers.push_back(AlwaysOnCopy(base.layers[l]));
  }
  overlay->final_norm = base.final_norm;
  for (const std::string& name : overlay->tensors) {
    auto it = always_on.find(name);
    if (it == always_on.end()) {
      return refuse(absl::StrCat(
          "tensor ", name,
          " is not an always-on tensor of this model; an overlay may hold only norms, routers, "
          "shared experts and dense MLPs (attention, routed experts, the embedding and the "
          "lm_head stay frozen)"));
    }
    ASSIGN_OR_RETURN(model::TensorView view, file->Get(name));
    const model::TensorSpec& spec = it->second;
    if (view.shape != spec.shape) {
      return refuse(absl::StrCat("tensor ", name, " has shape [", absl::StrJoin(view.shape, ", "),
                                 "], the model's is [", absl::StrJoin(spec.shape, ", "), "]"));
    }
    LayerWeights scratch;
    RETURN_IF_ERROR(Assign(spec, view, config,
                           spec.layer >= 0 ? &overlay->layers[spec.layer] : &scratch,
                           &overlay->final_norm));
  }
  ASSIGN_OR_RETURN(overlay->sha256, util::Sha256OfFile(path));
  return overlay;
}

}  // namespace tandem::engine
