#include "common/engine/quantize.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine/model_weights.h"
#include "common/engine/overlay.h"
#include "common/kernels/packed_matrix.h"
#include "common/model/config.h"
#include "common/model/safetensors.h"
#include "common/util/status.h"
#include "nlohmann/json.hpp"

namespace tandem::engine {

absl::StatusOr<int> QuantizeCheckpoint(const std::string& model_dir, const QuantizeOptions& options,
                                       const std::string& out_dir) {
  namespace fs = std::filesystem;
  using Json = nlohmann::json;
  std::error_code error;
  if (fs::exists(out_dir, error) && fs::equivalent(model_dir, out_dir, error)) {
    return absl::InvalidArgumentError("the quantized checkpoint must go to another directory");
  }
  if (options.group_size != 0 && options.group_size != 32 && options.group_size != 64 &&
      options.group_size != 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--group_size must be 32, 64 or 128 (0: the largest that fits), got ", options.group_size));
  }
  if (options.bits != 8 && options.bits != 4) {
    return absl::InvalidArgumentError(absl::StrCat("--bits must be 8 or 4, got ", options.bits));
  }
  if (options.lm_head_bits != 0 && options.lm_head_bits != 8 && options.lm_head_bits != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lm_head_bits must be 8 or 4, got ", options.lm_head_bits));
  }
  if (options.lm_head_bits != 0 && !options.lm_head) {
    return absl::InvalidArgumentError("--lm_head_bits needs lm_head among the modules");
  }
  if (!options.experts && !options.attention && !options.shared_expert && !options.dense_mlp &&
      !options.lm_head) {
    return absl::InvalidArgumentError("quantize at least one module");
  }
  std::ifstream config_in(model_dir + "/config.json");
  if (!config_in)
    return absl::NotFoundError(absl::StrCat("cannot read ", model_dir, "/config.json"));
  Json config_json = Json::parse(config_in, nullptr, /*allow_exceptions=*/false);
  if (!config_json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(model_dir, "/config.json is not a JSON object"));
  }
  if (config_json.contains("quantization_config") &&
      !config_json["quantization_config"].is_null()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir, " is already quantized (its config.json has quantization_config)"));
  }
  ASSIGN_OR_RETURN(model::ModelConfig source, model::ParseModelConfig(config_json.dump()));
  // What is written: the modules chosen that the model has, in the group asked for or else the
  // largest that divides every width they read.
  model::QuantizationConfig q;
  q.bits = options.bits;
  q.experts = options.experts;
  q.attention = options.attention;
  q.shared_expert = options.shared_expert && source.HasSharedExpert();
  q.dense_mlp = options.dense_mlp && source.HasDenseLayers();
  q.lm_head = options.lm_head && !source.tie_word_embeddings;
  if (!q.experts && !q.attention && !q.shared_expert && !q.dense_mlp && !q.lm_head) {
    return absl::InvalidArgumentError("the model has none of the modules chosen to quantize");
  }
  q.group_size = options.group_size;
  if (q.group_size == 0) {
    for (int g : {128, 64, 32}) {
      q.group_size = g;
      if (model::CheckGroupDividesWidths(source, q).ok()) break;
    }
    if (absl::Status s = model::CheckGroupDividesWidths(source, q); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no group size of 128, 64 or 32 fits this model: ", s.message()));
    }
  }
  const int group_size = q.group_size;
  Json modules = Json::array();
  if (q.experts) modules.push_back("experts");
  if (q.attention) modules.push_back("attention");
  if (q.shared_expert) modules.push_back("shared_expert");
  if (q.dense_mlp) modules.push_back("dense_mlp");
  if (q.lm_head) modules.push_back("lm_head");
  config_json["quantization_config"] = {{"quant_method", "tandem"},
                                        {"bits", q.bits},
                                        {"group_size", group_size},
                                        {"symmetric", true},
                                        {"modules", modules}};
  if (options.lm_head_bits != 0 && options.lm_head_bits != options.bits && q.lm_head) {
    config_json["quantization_config"]["lm_head_bits"] = options.lm_head_bits;
  }
  // Parsing the new config checks the group against every quantized matrix's width.
  ASSIGN_OR_RETURN(model::ModelConfig target, model::ParseModelConfig(config_json.dump()));
  ASSIGN_OR_RETURN(auto checkpoint, model::SafetensorsModel::Open(model_dir));
  RETURN_IF_ERROR(model::ValidateAgainstConfig(*checkpoint, source));
  // Stacked experts (mlp.experts.gate_up_proj) are read an expert at a time and written one
  // tensor each, a layout every architecture that stacks them also reads.
  const model::ExpertLayout layout = model::DetectExpertLayout(source, checkpoint->Names());
  ASSIGN_OR_RETURN(std::string source_sha256, CheckpointSha256(model_dir));

  std::vector<std::vector<std::byte>> owned;
  std::vector<model::TensorView> out;
  const std::vector<model::TensorSpec> specs = model::ExpectedTensors(source);
  owned.reserve(2 * specs.size());
  for (const model::TensorSpec& spec : specs) {
    ASSIGN_OR_RETURN(model::TensorView view, spec.expert >= 0
                                                 ? model::GetTensor(*checkpoint, source, spec.kind,
                                                                    spec.layer, spec.expert, layout)
                                                 : checkpoint->Get(spec.name));
    if (!target.quantization.Quantizes(spec.kind)) {
      out.push_back(view);
      continue;
    }
    const int rows = static_cast<int>(view.shape[0]);
    const int cols = static_cast<int>(view.shape[1]);
    const int bits = target.quantization.BitsOf(spec.kind);
    const std::vector<float> values = VectorFromTensor(view);
    const kernels::QuantizedRows q = kernels::QuantizeRows(
        values.data(), cols, rows, cols,
        bits == 8 ? kernels::WeightFormat::kInt8 : kernels::WeightFormat::kInt4, group_size);
    std::vector<std::byte> levels(bits == 8 ? q.q.size() : q.q.size() / 2);
    if (bits == 8) {
      std::memcpy(levels.data(), q.q.data(), q.q.size());
    } else {
      kernels::PackNibbles(q.q.data(), static_cast<int64_t>(q.q.size()),
                           reinterpret_cast<uint8_t*>(levels.data()));
    }
    owned.push_back(std::move(levels));
    out.push_back({spec.name,
                   bits == 8 ? model::DType::kI8 : model::DType::kU8,
                   {rows, bits == 8 ? cols : cols / 2},
                   owned.back().data(),
                   owned.back().size()});
    std::vector<std::byte> scales(q.scales.size() * 2);
    std::memcpy(scales.data(), q.scales.data(), scales.size());
    owned.push_back(std::move(scales));
    out.push_back({model::ScaleTensorName(spec.name),
                   model::DType::kF16,
                   {rows, cols / group_size},
                   owned.back().data(),
                   owned.back().size()});
  }

  std::map<std::string, std::string> metadata;
  if (auto file = model::SafetensorsFile::Open(model_dir + "/model.safetensors"); file.ok()) {
    metadata = (*file)->metadata();
  }
  metadata["tandem.quantization"] = config_json["quantization_config"].dump();
  metadata["tandem.quantized_from_sha256"] = source_sha256;

  fs::create_directories(out_dir, error);
  if (error) return absl::PermissionDeniedError(absl::StrCat("cannot create ", out_dir));
  for (const fs::directory_entry& entry : fs::directory_iterator(model_dir)) {
    const std::string file = entry.path().filename().string();
    if (!entry.is_regular_file() || file == "config.json" ||
        file.find(".safetensors") != std::string::npos) {
      continue;
    }
    fs::copy_file(entry.path(), fs::path(out_dir) / file, fs::copy_options::overwrite_existing,
                  error);
    if (error) {
      return absl::PermissionDeniedError(absl::StrCat("cannot copy ", file, " to ", out_dir));
    }
  }
  std::ofstream config_out(out_dir + "/config.json", std::ios::trunc);
  config_out << config_json.dump(2) << "\n";
  config_out.close();
  if (!config_out)
    return absl::DataLossError(absl::StrCat("writing ", out_dir, "/config.json failed"));
  RETURN_IF_ERROR(model::WriteSafetensors(out_dir + "/model.safetensors", out, metadata));
  return group_size;
}

}  // namespace tandem::engine
