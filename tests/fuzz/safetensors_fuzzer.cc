// A safetensors file as the engine opens a checkpoint: model::SafetensorsFile::Open (header
// parsing and validation over the mapped file), every tensor read back, then the file as a
// model directory's model.safetensors checked against the shipped tiny model's config.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/model/config.h"
#include "common/model/model_dir.h"
#include "common/model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace tandem::model {
namespace {

struct State {
  fuzz::MemFile file;
  fuzz::TempDir dir;  // holds model.safetensors -> the memory file
  ModelConfig config;

  State() {
    std::filesystem::create_symlink(file.path(), dir.path() / "model.safetensors");
    absl::StatusOr<std::unique_ptr<ModelDir>> tiny = ModelDir::Open(fuzz::TinyModelDir());
    FUZZ_CHECK(tiny.ok());
    config = (*tiny)->config();
  }
};

// What safetensors.h promises of a file that opened: each tensor's bytes are the file's, its
// size matches dtype and shape, and the tensors tile the data section.
void CheckFile(const SafetensorsFile& file, const uint8_t* data, size_t size) {
  uint64_t header_len;
  std::memcpy(&header_len, data, sizeof(header_len));
  const size_t data_offset = 8 + header_len;
  std::vector<TensorView> views;
  for (const std::string& name : file.Names()) {
    FUZZ_CHECK(file.Contains(name));
    absl::StatusOr<TensorView> view = file.Get(name);
    FUZZ_CHECK(view.ok());
    int64_t elements = 1;
    for (int64_t d : view->shape) {
      FUZZ_CHECK(d >= 0);
      FUZZ_CHECK(!__builtin_mul_overflow(elements, d, &elements));
    }
    FUZZ_CHECK(view->num_elements() == elements);
    FUZZ_CHECK(static_cast<uint64_t>(elements) * DTypeSize(view->dtype) == view->size_bytes);
    views.push_back(*std::move(view));
  }
  FUZZ_CHECK(views.size() == file.num_tensors());
  // In file order, tensor i starts where tensor i-1 ends: compare its bytes with the input's.
  std::stable_sort(views.begin(), views.end(),
                   [](const TensorView& a, const TensorView& b) { return a.data < b.data; });
  size_t offset = data_offset;
  for (const TensorView& view : views) {
    FUZZ_CHECK(offset + view.size_bytes <= size);
    FUZZ_CHECK(std::memcmp(view.data, data + offset, view.size_bytes) == 0);
    offset += view.size_bytes;
  }
  FUZZ_CHECK(offset == size);
  FUZZ_CHECK(!file.Get("no such tensor").ok());
}

}  // namespace
}  // namespace tandem::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::model;
  static State* state = new State();
  const std::string& path = state->file.Write(data, size);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  if (!file.ok()) {
    FUZZ_CHECK(file.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  CheckFile(**file, data, size);
  file->reset();

  absl::StatusOr<std::unique_ptr<SafetensorsModel>> model =
      SafetensorsModel::Open(state->dir.path().string());
  FUZZ_CHECK(model.ok());
  FUZZ_CHECK((*model)->num_shards() == 1);
  for (const std::string& name : (*model)->Names()) FUZZ_CHECK((*model)->Get(name).ok());
  absl::Status matches = ValidateAgainstConfig(**model, state->config);
  FUZZ_CHECK(matches.ok() || matches.code() == absl::StatusCode::kInvalidArgument);
  return 0;
}
