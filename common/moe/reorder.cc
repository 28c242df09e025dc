#include "common/moe/reorder.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "common/model/safetensors.h"
#include "common/util/status.h"

namespace tandem::moe {

using model::TensorKind;

std::vector<int> NeuronOrder(const std::vector<double>& importance) {
  std::vector<int> order(importance.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return importance[a] > importance[b]; });
  return order;
}

absl::StatusOr<bool> IsReordered(const model::ModelDir& dir) {
  ASSIGN_OR_RETURN(const model::SafetensorsModel* checkpoint, dir.checkpoint());
  return checkpoint->metadata().count(kNeuronOrderKey) > 0;
}

absl::Status ReorderCheckpoint(const model::ModelDir& dir, const CalibrationStats& stats,
                               const std::string& out_dir) {
  namespace fs = std::filesystem;
  const std::string& model_dir = dir.path();
  std::error_code error;
  if (fs::exists(out_dir, error) && fs::equivalent(model_dir, out_dir, error)) {
    return absl::InvalidArgumentError("the reordered checkpoint must go to another directory");
  }
  const model::ModelConfig& config = dir.config();
  if (config.quantization.bits != 0) {
    // Permuting down's columns would move them across quantization groups.
    return absl::InvalidArgumentError(absl::StrCat(
        model_dir, " is quantized: reorder the bf16 checkpoint, then quantize the result"));
  }
  ASSIGN_OR_RETURN(const model::SafetensorsModel* checkpoint, dir.checkpoint());
  RETURN_IF_ERROR(model::ValidateAgainstConfig(*checkpoint, config));
  const model::ExpertLayout layout = model::DetectExpertLayout(config, checkpoint->Names());
  const int layers = static_cast<int>(config.num_hidden_layers);
  const int experts = static_cast<int>(config.num_local_experts);
  const int inter = static_cast<int>(config.intermediate_size);
  const int hidden = static_cast<int>(config.hidden_size);
  if (static_cast<int>(stats.layers.size()) != layers) {
    return absl::InvalidArgumentError(absl::StrCat("the statistics have ", stats.layers.size(),
                                                   " layers; the model has ", layers));
  }
  for (int l = 0; l < layers; ++l) {
    const auto& importance = stats.layers[l].neuron_importance;
    if (static_cast<int>(importance.size()) != experts ||
        std::any_of(importance.begin(), importance.end(), [&](const std::vector<double>& v) {
          return static_cast<int>(v.size()) != inter;
        })) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l,
                                                     " of the statistics does not hold ", experts,
                                                     " experts of ", inter, " neurons"));
    }
  }

  // The permuted copies of the expert tensors; views of everything else point into the map.
  // Stacked experts (mlp.experts.gate_up_proj) are written one tensor each, a layout every
  // architecture that stacks them also reads.
  std::vector<std::vector<std::byte>> owned;
  std::vector<model::TensorView> out;
  for (const std::string& name : checkpoint->Names()) {
    if (layout == model::ExpertLayout::kStacked) {
      bool stacked = false;
      for (int l = 0; l < layers && !stacked; ++l) {
        for (TensorKind kind : {TensorKind::kExpertsGateUp, TensorKind::kExpertsDown,
                                TensorKind::kExpertsGateUpBias, TensorKind::kExpertsDownBias}) {
          const std::string stacked_name = model::TensorName(*config.arch, kind, l);
          stacked = stacked || (!stacked_name.empty() && name == stacked_name);
        }
      }
      if (stacked) continue;
    }
    ASSIGN_OR_RETURN(model::TensorView view, checkpoint->Get(name));
    out.push_back(view);
  }
  // An expert's tensors: its matrices, and its biases where the model has them (gpt-oss).
  std::vector<TensorKind> expert_kinds = {TensorKind::kExpertGate, TensorKind::kExpertUp,
                                          TensorKind::kExpertDown};
  if (config.expert_bias) {
    expert_kinds.insert(expert_kinds.end(), {TensorKind::kExpertGateBias, TensorKind::kExpertUpBias,
                                             TensorKind::kExpertDownBias});
  }
  if (layout == model::ExpertLayout::kStacked) {
    for (int l = 0; l < layers; ++l) {
      if (!config.IsSparseLayer(l)) continue;
      for (int e = 0; e < experts; ++e) {
        for (TensorKind kind : expert_kinds) {
          ASSIGN_OR_RETURN(model::TensorView view,
                           model::GetTensor(*checkpoint, config, kind, l, e, layout));
          out.push_back(view);
        }
      }
    }
  }
  owned.reserve(static_cast<size_t>(layers) * experts * expert_kinds.size());
  for (int l = 0; l < layers; ++l) {
    if (!config.IsSparseLayer(l)) continue;  // a dense MLP layer has no experts to reorder
    for (int e = 0; e < experts; ++e) {
      const std::vector<int> order = NeuronOrder(stats.layers[l].neuron_importance[e]);
      for (TensorKind kind : expert_kinds) {
        if (kind == TensorKind::kExpertDownBias) continue;  // (hidden,): no neuron's own
        const std::string name = model::TensorName(*config.arch, kind, l, e);
        auto it = std::find_if(out.begin(), out.end(),
                               [&](const model::TensorView& v) { return v.name == name; });
        const size_t element = model::DTypeSize(it->dtype);
        std::vector<std::byte> data(it->size_bytes);
        if (kind == TensorKind::kExpertDown) {  // (hidden, inter): permute the columns
          for (int r = 0; r < hidden; ++r) {
            const std::byte* src = it->data + static_cast<size_t>(r) * inter * element;
            std::byte* dst = data.data() + static_cast<size_t>(r) * inter * element;
            for (int i = 0; i < inter; ++i) {
              std::memcpy(dst + i * element, src + static_cast<size_t>(order[i]) * element,
                          element);
            }
          }
        } else {  // (inter, hidden) or a bias (inter,): permute the rows
          const bool bias =
              kind == TensorKind::kExpertGateBias || kind == TensorKind::kExpertUpBias;
          const size_t row = static_cast<size_t>(bias ? 1 : hidden) * element;
          for (int i = 0; i < inter; ++i) {
            std::memcpy(data.data() + i * row, it->data + order[i] * row, row);
          }
        }
        owned.push_back(std::move(data));
        it->data = owned.back().data();
      }
    }
  }

  fs::create_directories(out_dir, error);
  if (error) return absl::PermissionDeniedError(absl::StrCat("cannot create ", out_dir));
  for (const fs::directory_entry& entry : fs::directory_iterator(model_dir)) {
    const std::string file = entry.path().filename().string();
    if (!entry.is_regular_file() || file.find(".safetensors") != std::string::npos) continue;
    fs::copy_file(entry.path(), fs::path(out_dir) / file, fs::copy_options::overwrite_existing,
                  error);
    if (error)
      return absl::PermissionDeniedError(absl::StrCat("cannot copy ", file, " to ", out_dir));
  }
  return model::WriteSafetensors(out_dir + "/model.safetensors", out,
                                 {{kNeuronOrderKey, "descending calibration importance"},
                                  {"tandem.calibration_text", stats.text},
                                  {"tandem.calibration_text_sha256", stats.text_sha256},
                                  {"tandem.calibration_tokens", absl::StrCat(stats.tokens)}});
}

}  // namespace tandem::moe
