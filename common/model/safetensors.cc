#include "common/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status.h"
#include "nlohmann/json.hpp"

namespace tandem::model {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; big-endian hosts are not supported");

using Json = nlohmann::json;

// The installed Abseil's string_view is its own type, not std::string_view; absl::StrCat and
// friends need it.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // the reference loader's limit
constexpr size_t kMaxReportedProblems = 10;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Parses JSON without exceptions and reports the first key repeated inside one object
// (nlohmann::json would otherwise keep the last value silently). `duplicate_depth` is 1 for
// keys of the top-level object.
struct ParsedJson {
  Json value;  // discarded on a syntax error
  std::string duplicate_key;
  int duplicate_depth = 0;
};

ParsedJson ParseJsonStrict(std::string_view text) {
  ParsedJson out;
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && out.duplicate_key.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second) {
          out.duplicate_key = parsed.get<std::string>();
          out.duplicate_depth = static_cast<int>(open_objects.size());
        }
        break;
      default:
        break;
    }
    return true;
  };
  out.value = Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  return out;
}

// A non-negative JSON integer, or nullopt.
std::optional<uint64_t> NonNegativeInt(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<uint64_t>();
  return std::nullopt;
}

class FileCloser {
 public:
  explicit FileCloser(int fd) : fd_(fd) {}
  ~FileCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  int release() { return std::exchange(fd_, -1); }
  FileCloser(const FileCloser&) = delete;
  FileCloser& operator=(const FileCloser&) = delete;

 private:
  int fd_;
};

absl::Status OpenError(int error, const std::string& path) {
  if (error == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  return absl::ErrnoToStatus(error, absl::StrCat("cannot open ", path));
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kI8:
    case DType::kU8:
      return 1;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF32:
      return 4;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF32:
      return "F32";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32, DType::kI8, DType::kU8}) {
    if (DTypeName(d) == name) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype \"", Sv(name), "\" (supported: BF16, F16, F32, I8, U8)"));
}

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(std::string path, int fd, const std::byte* map, size_t map_size)
    : path_(std::move(path)), fd_(fd), map_(map), map_size_(map_size), data_offset_(0) {}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), map_size_);
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return OpenError(errno, path);
  FileCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": file is ", size, " bytes, shorter than the 8-byte header length field"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) return absl::ErrnoToStatus(errno, absl::StrCat("cannot mmap ", path));
  std::unique_ptr<SafetensorsFile> file(
      new SafetensorsFile(path, closer.release(), static_cast<const std::byte*>(map), size));
  absl::Status status = file->ParseHeader();
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  }
  return file;
}

absl::Status SafetensorsFile::ParseHeader() {
  uint64_t header_len;
  std::memcpy(&header_len, map_, sizeof(header_len));
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("header length ", header_len,
                                                   " exceeds the limit of ", kMaxHeaderBytes,
                                                   " bytes (corrupt or not a safetensors file)"));
  }
  if (header_len > map_size_ - 8) {
    return absl::InvalidArgumentError(absl::StrCat("header length ", header_len,
                                                   " is larger than the file (", map_size_,
                                                   " bytes); the file may be truncated"));
  }
  data_offset_ = 8 + header_len;
  const uint64_t data_size = map_size_ - data_offset_;
  const std::string_view header(reinterpret_cast<const char*>(map_) + 8, header_len);
  if (header.empty() || header.front() != '{') {
    return absl::InvalidArgumentError("header is not a JSON object (must start with '{')");
  }
  ParsedJson parsed = ParseJsonStrict(header);
  if (parsed.value.is_discarded()) return absl::InvalidArgumentError("header is not valid JSON");
  if (!parsed.value.is_object()) return absl::InvalidArgumentError("header is not a JSON object");
  if (!parsed.duplicate_key.empty()) {
    return absl::InvalidArgumentError(
        parsed.duplicate_depth == 1
            ? absl::StrCat("duplicate tensor name '", parsed.duplicate_key, "' in header")
            : absl::StrCat("duplicate key '", parsed.duplicate_key, "' in header"));
  }

  struct Extent {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Extent> extents;
  for (const auto& [name, info] : parsed.value.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) {
        return absl::InvalidArgumentError("__metadata__ must be an object of strings");
      }
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("__metadata__ value for '", key, "' must be a string"));
        }
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor '", name, "': ");
    if (name.empty()) return absl::InvalidArgumentError("empty tensor name in header");
    if (!info.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "entry must be an object"));
    }
    auto dtype_it = info.find("dtype");
    if (dtype_it == info.end() || !dtype_it->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "missing or non-string dtype"));
    }
    absl::StatusOr<DType> dtype = ParseDType(dtype_it->get<std::string>());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, dtype.status().message()));
    }

    auto shape_it = info.find("shape");
    if (shape_it == info.end() || !shape_it->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "shape must be an array of non-negative integers"));
    }
    std::vector<int64_t> shape;
    // Every partial product must fit in int64_t, as TensorView::num_elements() computes them:
    // a zero after huge dimensions does not excuse them.
    int64_t num_elements = 1;
    bool overflow = false;
    for (const Json& d : *shape_it) {
      std::optional<uint64_t> dim = NonNegativeInt(d);
      if (!dim.has_value() || *dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "shape must be an array of non-negative integers, got ", shape_it->dump()));
      }
      shape.push_back(static_cast<int64_t>(*dim));
      overflow |= __builtin_mul_overflow(num_elements, shape.back(), &num_elements);
    }
    uint64_t expected_bytes = 0;
    overflow |= __builtin_mul_overflow(static_cast<uint64_t>(num_elements), DTypeSize(*dtype),
                                       &expected_bytes);
    if (overflow) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "shape ", ShapeString(shape), " overflows the byte size"));
    }

    auto offsets_it = info.find("data_offsets");
    std::optional<uint64_t> begin, end;
    if (offsets_it != info.end() && offsets_it->is_array() && offsets_it->size() == 2) {
      begin = NonNegativeInt((*offsets_it)[0]);
      end = NonNegativeInt((*offsets_it)[1]);
    }
    if (!begin.has_value() || !end.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "data_offsets must be two non-negative integers [begin, end]"));
    }
    if (*begin > *end) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "data_offsets begin ", *begin, " is after end ", *end));
    }
    if (*end > data_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "data_offsets [", *begin, ", ", *end, "] extend beyond the data section (",
          data_size, " bytes); the file may be truncated"));
    }
    if (*end - *begin != expected_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "byte size ", *end - *begin, " does not match dtype ", Sv(DTypeName(*dtype)),
          " and shape ", ShapeString(shape), " (expected ", expected_bytes, " bytes)"));
    }
    auto [it, inserted] =
        tensors_.emplace(name, Entry{*dtype, std::move(shape), static_cast<size_t>(*begin),
                                     static_cast<size_t>(expected_bytes)});
    if (!inserted) {  // unreachable after the duplicate-key check; kept as a guard
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name '", name, "'"));
    }
    extents.push_back(Extent{*begin, *end, &it->first});
  }

  // Like the reference implementation, tensors must tile the data section exactly.
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const Extent& e : extents) {
    if (e.begin < covered) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", *e.name, "' overlaps tensor '",
                                                     *previous, "' in the data section"));
    }
    if (e.begin > covered) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", *e.name, "' starts at data offset ", e.begin,
                       " leaving a gap after offset ", covered, " (unreferenced bytes)"));
    }
    covered = e.end;
    previous = e.name;
  }
  if (covered != data_size) {
    return absl::InvalidArgumentError(absl::StrCat("data section has ", data_size - covered,
                                                   " trailing bytes not covered by any tensor"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorView> SafetensorsFile::Get(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named '", Sv(name), "'"));
  }
  const Entry& e = it->second;
  return TensorView{it->first, e.dtype, e.shape, map_ + data_offset_ + e.begin, e.size_bytes};
}

bool SafetensorsFile::Contains(std::string_view name) const {
  return tensors_.find(name) != tensors_.end();
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsModel

absl::StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::unique_ptr<SafetensorsModel> model(new SafetensorsModel());
  std::error_code ec;
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(single, ec)) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single));
    for (const std::string& name : file->Names()) model->shard_of_.emplace(name, 0);
    model->shards_.push_back(std::move(file));
    return model;
  }
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (!fs::exists(index_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("no model.safetensors or model.safetensors.index.json in ", dir));
  }

  std::ifstream in(index_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", index_path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  const std::string where = absl::StrCat(index_path.string(), ": ");
  ParsedJson index = ParseJsonStrict(text.str());
  if (index.value.is_discarded() || !index.value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "not a JSON object"));
  }
  if (!index.duplicate_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "duplicate key '", index.duplicate_key, "'"));
  }
  auto map_it = index.value.find("weight_map");
  if (map_it == index.value.end() || !map_it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "missing \"weight_map\" object"));
  }
  if (map_it->empty()) {  // a checkpoint of no tensors, whatever shards lie beside it
    return absl::InvalidArgumentError(absl::StrCat(where, "\"weight_map\" is empty"));
  }

  std::map<std::string, size_t> shard_index;  // file name -> index in shards_
  for (const auto& [tensor, file_json] : map_it->items()) {
    if (!file_json.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "weight_map entry for '", tensor, "' must be a file name string"));
    }
    const std::string file_name = file_json.get<std::string>();
    // Shards must be plain names inside `dir`; an index must not reach elsewhere.
    if (file_name.empty() || file_name == "." || file_name == ".." ||
        file_name.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(where, "weight_map entry for '", tensor,
                                                     "' is not a plain file name: \"", file_name,
                                                     "\""));
    }
    auto [it, inserted] = shard_index.emplace(file_name, model->shards_.size());
    if (inserted) {
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> shard,
                       SafetensorsFile::Open(fs::path(dir) / file_name));
      model->shards_.push_back(std::move(shard));
    }
    if (!model->shards_[it->second]->Contains(tensor)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "weight_map puts tensor '", tensor,
                                                     "' in ", file_name, ", which lacks it"));
    }
    model->shard_of_.emplace(tensor, it->second);
  }
  for (const auto& [file_name, i] : shard_index) {
    for (const std::string& tensor : model->shards_[i]->Names()) {
      auto it = model->shard_of_.find(tensor);
      if (it == model->shard_of_.end() || it->second != i) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "shard ", file_name, " holds tensor '", tensor,
                         "', which weight_map does not assign to it"));
      }
    }
  }
  return model;
}

absl::StatusOr<TensorView> SafetensorsModel::Get(std::string_view name) const {
  auto it = shard_of_.find(name);
  if (it == shard_of_.end()) {
    return absl::NotFoundError(absl::StrCat("model has no tensor named '", Sv(name), "'"));
  }
  return shards_[it->second]->Get(name);
}

bool SafetensorsModel::Contains(std::string_view name) const {
  return shard_of_.find(name) != shard_of_.end();
}

std::vector<std::string> SafetensorsModel::Names() const {
  std::vector<std::string> names;
  names.reserve(shard_of_.size());
  for (const auto& [name, shard] : shard_of_) names.push_back(name);
  return names;
}

absl::Status ValidateAgainstConfig(const SafetensorsModel& model, const ModelConfig& config) {
  std::vector<std::string> problems;
  std::set<std::string, std::less<>> expected_names;
  const std::vector<std::string> names = model.Names();
  for (const TensorSpec& spec : ExpectedTensors(config, DetectExpertLayout(config, names))) {
    expected_names.insert(spec.name);
    absl::StatusOr<TensorView> t = model.Get(spec.name);
    if (!t.ok()) {
      problems.push_back(absl::StrCat("missing tensor '", spec.name, "'"));
      continue;
    }
    if (t->shape != spec.shape) {
      problems.push_back(absl::StrCat("tensor '", spec.name, "' has shape ", ShapeString(t->shape),
                                      ", expected ", ShapeString(spec.shape)));
    }
    const bool float_dtype =
        t->dtype == DType::kBF16 || t->dtype == DType::kF16 || t->dtype == DType::kF32;
    DType dtype = DType::kF16;
    const char* wanted = "F16 (scales)";
    switch (spec.storage) {
      case TensorStorage::kFloat:
        wanted = "BF16, F16 or F32";
        break;
      case TensorStorage::kInt8:
        dtype = DType::kI8;
        wanted = "I8 (int8 levels)";
        break;
      case TensorStorage::kInt4:
        dtype = DType::kU8;
        wanted = "U8 (int4 levels, two a byte)";
        break;
      case TensorStorage::kMxfp4Blocks:
        dtype = DType::kU8;
        wanted = "U8 (MXFP4 blocks)";
        break;
      case TensorStorage::kMxfp4Scales:
        dtype = DType::kU8;
        wanted = "U8 (MXFP4 exponents)";
        break;
      case TensorStorage::kScale:
        break;
    }
    const bool dtype_ok = spec.storage == TensorStorage::kFloat ? float_dtype : t->dtype == dtype;
    if (!dtype_ok) {
      problems.push_back(absl::StrCat("tensor '", spec.name, "' has dtype ",
                                      Sv(DTypeName(t->dtype)), ", expected ", wanted));
    }
  }
  for (const std::string& name : names) {
    if (!expected_names.contains(name) && !IsIgnoredTensor(config, name)) {
      problems.push_back(absl::StrCat("unexpected tensor '", name, "'"));
    }
  }
  if (problems.empty()) return absl::OkStatus();
  const size_t total = problems.size();
  if (total > kMaxReportedProblems) {
    problems.resize(kMaxReportedProblems);
    problems.push_back(absl::StrCat("and ", total - kMaxReportedProblems, " more"));
  }
  return absl::InvalidArgumentError(absl::StrCat("checkpoint does not match config (model_type ",
                                                 Sv(config.model_type()), "): ", total,
                                                 " problem(s): ", absl::StrJoin(problems, "; ")));
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || header.contains(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteSafetensors: bad or duplicate tensor name '", t.name, "'"));
    }
    uint64_t expected = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(expected, static_cast<uint64_t>(d), &expected)) {
        return absl::InvalidArgumentError(
            absl::StrCat("WriteSafetensors: tensor '", t.name, "' has a bad shape"));
      }
    }
    if (expected != t.size_bytes || (t.data == nullptr && t.size_bytes != 0)) {
      return absl::InvalidArgumentError(absl::StrCat("WriteSafetensors: tensor '", t.name, "' has ",
                                                     t.size_bytes, " bytes, its shape ",
                                                     ShapeString(t.shape), " needs ", expected));
    }
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.size_bytes}}};
    offset += t.size_bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_len = header_text.size();

  // Write beside the target and rename, so readers never see a half-written checkpoint.
  const std::string tmp_path = path + ".tmp";
  {
    std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
    if (!out) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", tmp_path));
    out.write(reinterpret_cast<const char*>(&header_len), sizeof(header_len));
    out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
    for (const TensorView& t : tensors) {
      out.write(reinterpret_cast<const char*>(t.data), static_cast<std::streamsize>(t.size_bytes));
    }
    out.close();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp_path, ec);
      return absl::DataLossError(absl::StrCat("failed writing ", tmp_path));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp_path, path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp_path, " to ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

namespace {

// A tensor made here rather than mapped, owning its bytes.
TensorView OwnedTensor(std::string name, DType dtype, std::vector<int64_t> shape,
                       std::vector<std::byte> bytes) {
  auto owner = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  TensorView view{std::move(name), dtype, std::move(shape), owner->data(), owner->size()};
  view.owner = std::move(owner);
  return view;
}

bool IsExpertKind(TensorKind kind) {
  switch (kind) {
    case TensorKind::kExpertGate:
    case TensorKind::kExpertUp:
    case TensorKind::kExpertDown:
    case TensorKind::kExpertGateBias:
    case TensorKind::kExpertUpBias:
    case TensorKind::kExpertDownBias:
      return true;
    default:
      return false;
  }
}

// float16's bits of 2^k; 0 below its smallest subnormal (2^-24). k <= 15.
uint16_t F16PowerOfTwo(int k) {
  if (k >= -14) return static_cast<uint16_t>((k + 15) << 10);
  if (k >= -24) return static_cast<uint16_t>(1u << (k + 24));
  return 0;
}

}  // namespace

absl::StatusOr<TensorView> GetTensor(const SafetensorsModel& checkpoint, const ModelConfig& config,
                                     TensorKind kind, int layer, int expert, ExpertLayout layout) {
  if (layout != ExpertLayout::kStacked || !IsExpertKind(kind)) {
    return checkpoint.Get(TensorName(*config.arch, kind, layer, expert));
  }
  if (expert < 0 || expert >= config.num_local_experts) {
    return absl::InvalidArgumentError(absl::StrCat("no expert ", expert));
  }
  const bool bias = kind == TensorKind::kExpertGateBias || kind == TensorKind::kExpertUpBias ||
                    kind == TensorKind::kExpertDownBias;
  const bool down = kind == TensorKind::kExpertDown || kind == TensorKind::kExpertDownBias;
  const bool up = kind == TensorKind::kExpertUp || kind == TensorKind::kExpertUpBias;
  const TensorKind stacked_kind =
      bias ? (down ? TensorKind::kExpertsDownBias : TensorKind::kExpertsGateUpBias)
           : (down ? TensorKind::kExpertsDown : TensorKind::kExpertsGateUp);
  const std::string stacked_name = TensorName(*config.arch, stacked_kind, layer);
  if (stacked_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(config.model_type()), " stores no stacked ",
                                                   bias ? "bias" : "matrix", " for ",
                                                   TensorName(*config.arch, kind, layer, expert)));
  }
  ASSIGN_OR_RETURN(TensorView all, checkpoint.Get(stacked_name));
  std::string name = TensorName(*config.arch, kind, layer, expert);
  std::vector<int64_t> shape = TensorShape(config, kind);
  // Shapes were validated against the config: (experts, ...).
  const size_t per_expert = all.size_bytes / static_cast<size_t>(config.num_local_experts);
  const std::byte* base = all.data + static_cast<size_t>(expert) * per_expert;
  if (down && bias)
    return TensorView{std::move(name), all.dtype, std::move(shape), base, per_expert};
  if (!config.arch->stacked_interleaved) {
    // (experts, 2 * intermediate, hidden): the expert's gate rows, then its up rows.
    const size_t bytes = per_expert / (down ? 1 : 2);
    return TensorView{std::move(name), all.dtype, std::move(shape), base + (up ? bytes : 0), bytes};
  }
  // Interleaved, as x @ W: gather the expert's matrix a row per output.
  const size_t element = DTypeSize(all.dtype);
  const size_t inter = static_cast<size_t>(config.intermediate_size);
  const size_t hidden = static_cast<size_t>(config.hidden_size);
  std::vector<std::byte> bytes(per_expert / (down ? 1 : 2));
  auto copy = [&](size_t to, size_t from) {
    std::memcpy(bytes.data() + to * element, base + from * element, element);
  };
  if (bias) {  // (2 * intermediate,): gate, up alternate
    for (size_t i = 0; i < inter; ++i) copy(i, 2 * i + (up ? 1 : 0));
  } else if (!down) {  // (hidden, 2 * intermediate) -> (intermediate, hidden)
    for (size_t i = 0; i < inter; ++i) {
      for (size_t h = 0; h < hidden; ++h)
        copy(i * hidden + h, h * 2 * inter + 2 * i + (up ? 1 : 0));
    }
  } else {  // (intermediate, hidden) -> (hidden, intermediate)
    for (size_t h = 0; h < hidden; ++h) {
      for (size_t i = 0; i < inter; ++i) copy(h * inter + i, i * hidden + h);
    }
  }
  return OwnedTensor(std::move(name), all.dtype, std::move(shape), std::move(bytes));
}

absl::StatusOr<QuantizedTensor> GetQuantizedTensor(const SafetensorsModel& checkpoint,
                                                   const ModelConfig& config, TensorKind kind,
                                                   int layer, int expert, ExpertLayout layout) {
  const QuantizationConfig& q = config.quantization;
  if (!q.mxfp4) {
    ASSIGN_OR_RETURN(TensorView levels, GetTensor(checkpoint, config, kind, layer, expert, layout));
    ASSIGN_OR_RETURN(TensorView scales, checkpoint.Get(ScaleTensorName(levels.name)));
    return QuantizedTensor{std::move(levels), std::move(scales)};
  }
  const bool down = kind == TensorKind::kExpertDown;
  if (layout != ExpertLayout::kStacked ||
      (kind != TensorKind::kExpertGate && kind != TensorKind::kExpertUp && !down)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MXFP4 weights are stacked experts' matrices, not ",
                     TensorName(*config.arch, kind, layer, expert)));
  }
  if (expert < 0 || expert >= config.num_local_experts) {
    return absl::InvalidArgumentError(absl::StrCat("no expert ", expert));
  }
  const std::string stacked =
      TensorName(*config.arch, down ? TensorKind::kExpertsDown : TensorKind::kExpertsGateUp, layer);
  ASSIGN_OR_RETURN(TensorView blocks, checkpoint.Get(stacked + "_blocks"));
  ASSIGN_OR_RETURN(TensorView exponents, checkpoint.Get(stacked + "_scales"));
  // Rows a stacked expert has and those of this matrix: gate_up's 2 * intermediate alternate.
  const int64_t inter = config.intermediate_size, hidden = config.hidden_size;
  const int64_t stacked_rows = down ? hidden : 2 * inter;
  const int64_t rows = down ? hidden : inter;
  const int64_t cols = down ? inter : hidden;
  const int64_t groups = cols / 32;
  // E2M1 codes times two: the int8 levels.
  static constexpr int8_t kTwiceE2m1[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};
  std::vector<std::byte> levels(static_cast<size_t>(rows * cols));
  std::vector<std::byte> scales(static_cast<size_t>(rows * groups) * 2);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t from = int64_t{expert} * stacked_rows +
                         (down ? r : 2 * r + (kind == TensorKind::kExpertUp ? 1 : 0));
    const auto* code = reinterpret_cast<const uint8_t*>(blocks.data) + from * cols / 2;
    auto* level = reinterpret_cast<int8_t*>(levels.data()) + r * cols;
    for (int64_t c = 0; c < cols / 2; ++c) {
      level[2 * c] = kTwiceE2m1[code[c] & 15];
      level[2 * c + 1] = kTwiceE2m1[code[c] >> 4];
    }
    const auto* exponent = reinterpret_cast<const uint8_t*>(exponents.data) + from * groups;
    for (int64_t g = 0; g < groups; ++g) {
      const int k = static_cast<int>(exponent[g]) - 128;  // 2^(e - 127) / 2: levels are doubled
      if (k > 15) {
        return absl::InvalidArgumentError(absl::StrCat(
            stacked, "_scales holds exponent ", static_cast<int>(exponent[g]), " (a scale of 2^",
            exponent[g] - 127, "), past what Tandem's float16 scales hold"));
      }
      const uint16_t bits = F16PowerOfTwo(k);
      std::memcpy(scales.data() + (r * groups + g) * 2, &bits, 2);
    }
  }
  std::string name = TensorName(*config.arch, kind, layer, expert);
  std::string scale_name = ScaleTensorName(name);
  return QuantizedTensor{
      OwnedTensor(std::move(name), DType::kI8, {rows, cols}, std::move(levels)),
      OwnedTensor(std::move(scale_name), DType::kF16, {rows, groups}, std::move(scales))};
}

}  // namespace tandem::model
