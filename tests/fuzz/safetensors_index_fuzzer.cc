// A sharded checkpoint's model.safetensors.index.json as model::SafetensorsModel::Open reads it:
// the index (strict JSON, weight_map, shard names that must stay inside the directory) over two
// real shards, "model-00001-of-00002.safetensors" (tensors a, b) and
// "model-00002-of-00002.safetensors" (tensor c).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace tandem::model {
namespace {

struct State {
  fuzz::MemFile index;
  fuzz::TempDir dir;

  State() {
    const float values[4] = {1, 2, 3, 4};
    auto view = [&](const char* name, std::vector<int64_t> shape, size_t count) {
      return TensorView{name, DType::kF32, std::move(shape),
                        reinterpret_cast<const std::byte*>(values), count * sizeof(float)};
    };
    FUZZ_CHECK(WriteSafetensors((dir.path() / "model-00001-of-00002.safetensors").string(),
                                {view("a", {2}, 2), view("b", {1, 1}, 1)})
                   .ok());
    FUZZ_CHECK(WriteSafetensors((dir.path() / "model-00002-of-00002.safetensors").string(),
                                {view("c", {4}, 4)})
                   .ok());
    std::filesystem::create_symlink(index.path(), dir.path() / "model.safetensors.index.json");
  }
};

}  // namespace
}  // namespace tandem::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::model;
  static State* state = new State();
  state->index.Write(data, size);
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> model =
      SafetensorsModel::Open(state->dir.path().string());
  if (!model.ok()) {
    FUZZ_CHECK(model.status().code() == absl::StatusCode::kInvalidArgument ||
               model.status().code() == absl::StatusCode::kNotFound);
    return 0;
  }
  // An index that opened maps every tensor of the shards it names to its shard.
  FUZZ_CHECK((*model)->num_shards() >= 1 && (*model)->num_shards() <= 2);
  for (const std::string& name : (*model)->Names()) {
    absl::StatusOr<TensorView> view = (*model)->Get(name);
    FUZZ_CHECK(view.ok());
    FUZZ_CHECK(view->size_bytes == static_cast<size_t>(view->num_elements()) * sizeof(float));
  }
  FUZZ_CHECK(!(*model)->Contains("d"));
  return 0;
}
