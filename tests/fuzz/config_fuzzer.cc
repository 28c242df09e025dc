// config.json as a model directory is opened with it (model::ModelDir::Open): parsing and
// validation (the directory's other files are absent, so optional), then what
// callers derive from a valid config (tensor names and shapes, the expected checkpoint tensors).
#include <filesystem>
#include <set>
#include <string>

#include "common/model/config.h"
#include "common/model/model_dir.h"
#include "tests/fuzz/fuzz_util.h"

namespace tandem::model {
namespace {

constexpr TensorKind kKinds[] = {
    TensorKind::kTokenEmbedding, TensorKind::kOutputNorm,     TensorKind::kOutput,
    TensorKind::kAttnNorm,       TensorKind::kAttnQ,          TensorKind::kAttnK,
    TensorKind::kAttnV,          TensorKind::kAttnOut,        TensorKind::kAttnQNorm,
    TensorKind::kAttnKNorm,      TensorKind::kFfnNorm,        TensorKind::kRouter,
    TensorKind::kExpertGate,     TensorKind::kExpertUp,       TensorKind::kExpertDown,
    TensorKind::kAttnSinks,      TensorKind::kExpertGateBias, TensorKind::kExpertDownBias};

// What config.h promises of a config that parsed.
void CheckValid(const ModelConfig& c) {
  FUZZ_CHECK(c.arch != nullptr);
  for (int64_t size : {c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers,
                       c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                       c.num_local_experts, c.num_experts_per_tok, c.max_position_embeddings}) {
    FUZZ_CHECK(size > 0);
  }
  FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0);
  FUZZ_CHECK(c.num_experts_per_tok <= c.num_local_experts);
  FUZZ_CHECK(c.sliding_window >= 0);
  FUZZ_CHECK(c.rope_theta > 0 && c.rms_norm_eps > 0);
  FUZZ_CHECK(c.bos_token_id >= -1 && c.bos_token_id < c.vocab_size);
  FUZZ_CHECK(c.eos_token_id >= -1 && c.eos_token_id < c.vocab_size);
  FUZZ_CHECK(c.eos_token_ids.empty() == (c.eos_token_id == -1));
  for (int32_t id : c.eos_token_ids) FUZZ_CHECK(id >= 0 && id < c.vocab_size);
  for (TensorKind kind : kKinds) {
    for (int64_t d : TensorShape(c, kind)) FUZZ_CHECK(d > 0);
    TensorName(*c.arch, kind, static_cast<int>(c.num_hidden_layers - 1),
               static_cast<int>(c.num_local_experts - 1));
  }
  // The whole list has layers x experts x 3 entries: enumerate it when that is modest (a
  // hostile config may ask for 1024 x 4096, which is valid but a 12M-entry list).
  if (c.num_hidden_layers * c.num_local_experts <= 4096) {
    std::set<std::string> names;
    for (const TensorSpec& spec : ExpectedTensors(c)) {
      FUZZ_CHECK(!spec.name.empty());
      FUZZ_CHECK(names.insert(spec.name).second);
      // A float or int8 tensor has its kind's shape; int4 levels, scales and MXFP4 blocks
      // pack it.
      if (spec.storage == TensorStorage::kFloat || spec.storage == TensorStorage::kInt8) {
        FUZZ_CHECK(spec.shape == TensorShape(c, spec.kind, spec.layer));
      }
      for (int64_t d : spec.shape) FUZZ_CHECK(d > 0);
    }
  }
}

}  // namespace
}  // namespace tandem::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::MemFile* file = new tandem::fuzz::MemFile();
  static tandem::fuzz::TempDir* dir = [] {
    auto* d = new tandem::fuzz::TempDir();
    std::filesystem::create_symlink(file->path(), d->path() / "config.json");
    return d;
  }();
  file->Write(data, size);
  absl::StatusOr<std::unique_ptr<tandem::model::ModelDir>> model =
      tandem::model::ModelDir::Open(dir->path().string());
  if (model.ok()) {
    tandem::model::CheckValid((*model)->config());
  } else {
    FUZZ_CHECK(model.status().code() == absl::StatusCode::kInvalidArgument);
  }
  return 0;
}
