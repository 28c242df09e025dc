// Memory-mapped safetensors checkpoints: a single file (SafetensorsFile) or a Hugging Face
// model directory, single-file or sharded with an index (SafetensorsModel).
//
// Opening validates the whole header up front, so a file that opens is safe to read: every
// tensor's bytes lie inside the file, match its dtype and shape exactly, and do not overlap.
// Malformed input yields INVALID_ARGUMENT naming the tensor and the problem, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/config.h"

namespace tandem::model {

// Element types Tandem reads from checkpoints: floats, and the bytes of quantized weights
// (int8 levels as I8, int4 levels two to a byte as U8; docs/quantization.md).
enum class DType { kBF16, kF16, kF32, kI8, kU8 };

size_t DTypeSize(DType dtype);            // bytes per element
std::string_view DTypeName(DType dtype);  // the safetensors spelling: "BF16", "F16", "I8", ...
absl::StatusOr<DType> ParseDType(std::string_view name);

// A tensor inside a mapped file. `data` stays valid while the file that produced it is open.
// It is not necessarily aligned to the element size (the format does not guarantee it), so
// read elements with memcpy or copy the tensor out.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // row-major
  const std::byte* data;       // size_bytes bytes
  size_t size_bytes;           // product(shape) * DTypeSize(dtype)
  // The bytes `data` points into where the view was made rather than mapped (an expert gathered
  // out of an interleaved stack, MXFP4 converted); null for a view into a file.
  std::shared_ptr<const std::vector<std::byte>> owner = nullptr;

  int64_t num_elements() const;
};

// One .safetensors file, mapped read-only for its lifetime. Thread-safe for reads.
class SafetensorsFile {
 public:
  // NOT_FOUND when `path` does not exist; INVALID_ARGUMENT for any malformation.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // NOT_FOUND when the file has no tensor of that name.
  absl::StatusOr<TensorView> Get(std::string_view name) const;
  bool Contains(std::string_view name) const;
  std::vector<std::string> Names() const;  // sorted
  size_t num_tensors() const { return tensors_.size(); }
  // The header's "__metadata__" (string to string); empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    size_t begin;  // offset into the data section
    size_t size_bytes;
  };

  SafetensorsFile(std::string path, int fd, const std::byte* map, size_t map_size);
  // Validates the header and fills tensors_ and metadata_.
  absl::Status ParseHeader();

  std::string path_;
  int fd_;
  const std::byte* map_;
  size_t map_size_;
  size_t data_offset_;  // 8 + header length
  std::map<std::string, Entry, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A Hugging Face model directory's weights: DIR/model.safetensors, or when that is absent
// DIR/model.safetensors.index.json, whose "weight_map" maps each tensor to a shard file in DIR.
// Tensor lookups go to the right shard. Thread-safe for reads.
class SafetensorsModel {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsModel>> Open(const std::string& dir);

  SafetensorsModel(const SafetensorsModel&) = delete;
  SafetensorsModel& operator=(const SafetensorsModel&) = delete;

  // NOT_FOUND when no shard has a tensor of that name.
  absl::StatusOr<TensorView> Get(std::string_view name) const;
  bool Contains(std::string_view name) const;
  std::vector<std::string> Names() const;  // sorted, across all shards
  size_t num_shards() const { return shards_.size(); }
  // The first shard's "__metadata__" (a single file's); what tools such as tandem reorder
  // write there is the same in every shard they write.
  const std::map<std::string, std::string>& metadata() const { return shards_[0]->metadata(); }

 private:
  SafetensorsModel() = default;

  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, size_t, std::less<>> shard_of_;  // tensor name -> index in shards_
};

// Checks that `model` holds exactly ExpectedTensors(config) in the expert layout it uses: each
// with the expected shape and a supported dtype, and nothing else but the tensors the
// architecture skips (IsIgnoredTensor). INVALID_ARGUMENT listing the problems otherwise.
absl::Status ValidateAgainstConfig(const SafetensorsModel& model, const ModelConfig& config);

// The checkpoint's tensor of `kind` (of `layer`, `expert` where the kind has them). Where the
// checkpoint stores the experts stacked (`layout`, DetectExpertLayout), an expert's gate, up or
// down matrix (or bias) is named and shaped as the per-expert tensor would be, so a tool
// reading experts one at a time reads either layout and writes the per-expert one: a view into
// its layer's stacked tensor where it is a contiguous run of it (gate rows then up rows), else
// a copy gathered out of it (ArchitectureSpec::stacked_interleaved: gate and up in alternate
// columns, stored as x @ W).
absl::StatusOr<TensorView> GetTensor(const SafetensorsModel& checkpoint, const ModelConfig& config,
                                     TensorKind kind, int layer = -1, int expert = -1,
                                     ExpertLayout layout = ExpertLayout::kPerExpert);

// A quantized weight of `kind` (config.quantization.Quantizes(kind)) as levels (I8, or U8 with
// two int4 levels a byte) and float16 scales (rows, cols / group_size): as tandem quantize
// writes them (the weight and its ScaleTensorName), or converted from stacked MXFP4 experts
// (QuantizationConfig::mxfp4) to int8 levels, twice the E2M1 values, with scales 2^(exponent -
// 128), which hold every value exactly; an exponent past float16's range is refused (above) or
// its group flushed to zero (below 2^-24, every value under 6 * 2^-24).
struct QuantizedTensor {
  TensorView levels;
  TensorView scales;
};
absl::StatusOr<QuantizedTensor> GetQuantizedTensor(const SafetensorsModel& checkpoint,
                                                   const ModelConfig& config, TensorKind kind,
                                                   int layer = -1, int expert = -1,
                                                   ExpertLayout layout = ExpertLayout::kPerExpert);

// Writes `tensors` (in the given order, contiguous) and `metadata` as a safetensors file,
// with the header padded to a multiple of 8 bytes. Used by tools that write checkpoints and by
// tests.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace tandem::model
