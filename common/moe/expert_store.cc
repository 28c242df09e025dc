#include "common/moe/expert_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/util/status.h"

namespace tandem::moe {
namespace {

constexpr char kMagic[] = "tandem-expert-pack v1";

int64_t RoundUp(int64_t bytes, int64_t to) { return (bytes + to - 1) / to * to; }

// Whether the offsets of `layout` fit in int64_t, so that a header with huge sizes is refused
// instead of overflowing them.
bool OffsetsFit(const PackLayout& layout) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max() - PackLayout::kAlignment;
  int64_t expert_bytes, experts, experts_bytes;
  return !__builtin_mul_overflow(int64_t{layout.intermediate}, layout.bundle_bytes(),
                                 &expert_bytes) &&
         expert_bytes <= kMax &&
         !__builtin_mul_overflow(int64_t{layout.layers}, int64_t{layout.experts}, &experts) &&
         !__builtin_mul_overflow(experts, RoundUp(expert_bytes, PackLayout::kAlignment),
                                 &experts_bytes) &&
         experts_bytes <= kMax;
}

std::string Header(const PackLayout& layout) {
  std::string header =
      absl::StrCat(kMagic, " layers ", layout.layers, " experts ", layout.experts, " hidden ",
                   layout.hidden, " intermediate ", layout.intermediate, "\n");
  header.resize(PackLayout::kAlignment, '\0');
  return header;
}

absl::StatusOr<PackLayout> ParseHeader(const char* header, const std::string& path) {
  // "tandem-expert-pack v1 layers L experts E hidden H intermediate I\n", each size a positive
  // int (absl::SimpleAtoi refuses what would overflow one, where sscanf's %d is undefined).
  const std::vector<absl::string_view> words =
      absl::StrSplit(header, absl::ByAnyChar(" \n"), absl::SkipEmpty());
  PackLayout layout;
  const std::pair<const char*, int*> fields[] = {{"layers", &layout.layers},
                                                 {"experts", &layout.experts},
                                                 {"hidden", &layout.hidden},
                                                 {"intermediate", &layout.intermediate}};
  bool ok =
      words.size() == 2 + 2 * std::size(fields) && absl::StrCat(words[0], " ", words[1]) == kMagic;
  for (size_t i = 0; ok && i < std::size(fields); ++i) {
    ok = words[2 + 2 * i] == fields[i].first &&
         absl::SimpleAtoi(words[3 + 2 * i], fields[i].second) && *fields[i].second >= 1;
  }
  if (!ok) return absl::InvalidArgumentError(absl::StrCat(path, " is not a ", kMagic, " file"));
  if (!OffsetsFit(layout)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": its header's sizes make a pack too large to address"));
  }
  return layout;
}

absl::Status CheckRead(const PackLayout& layout, int layer, int expert, int first, int count) {
  if (layer < 0 || layer >= layout.layers || expert < 0 || expert >= layout.experts || first < 0 ||
      count < 0 || count > layout.intermediate - first) {
    return absl::InvalidArgumentError(absl::StrCat("bundles [", first, ", ", int64_t{first} + count,
                                                   ") of expert ", expert, " of layer ", layer,
                                                   " are outside the pack"));
  }
  return absl::OkStatus();
}

class HostPack : public ExpertBacking {
 public:
  HostPack(PackLayout layout, std::vector<std::byte> data)
      : layout_(layout), data_(std::move(data)) {}
  const PackLayout& layout() const override { return layout_; }
  absl::Status Read(int layer, int expert, int first, int count, std::byte* out) override {
    RETURN_IF_ERROR(CheckRead(layout_, layer, expert, first, count));
    const int64_t bytes = count * layout_.bundle_bytes();
    std::memcpy(out, data_.data() + layout_.offset(layer, expert) + first * layout_.bundle_bytes(),
                bytes);
    bytes_read_ += bytes;
    return absl::OkStatus();
  }
  int64_t bytes_read() const override { return bytes_read_; }

 private:
  const PackLayout layout_;
  std::vector<std::byte> data_;
  int64_t bytes_read_ = 0;
};

class DirectFile : public ExpertBacking {
 public:
  DirectFile(PackLayout layout, int fd, std::string path)
      : layout_(layout), fd_(fd), path_(std::move(path)) {}
  ~DirectFile() override {
    close(fd_);
    std::free(bounce_);
  }
  const PackLayout& layout() const override { return layout_; }
  absl::Status Read(int layer, int expert, int first, int count, std::byte* out) override {
    RETURN_IF_ERROR(CheckRead(layout_, layer, expert, first, count));
    if (count == 0) return absl::OkStatus();
    // O_DIRECT reads whole aligned blocks into an aligned buffer; experts are padded to the
    // alignment, so the blocks never run into the next expert's or past the file.
    const int64_t begin = layout_.offset(layer, expert) + first * layout_.bundle_bytes();
    const int64_t end = begin + count * layout_.bundle_bytes();
    const int64_t aligned_begin = begin / PackLayout::kAlignment * PackLayout::kAlignment;
    const int64_t aligned_end = RoundUp(end, PackLayout::kAlignment);
    const int64_t bytes = aligned_end - aligned_begin;
    if (bytes > bounce_bytes_) {
      std::free(bounce_);
      bounce_ = static_cast<std::byte*>(std::aligned_alloc(PackLayout::kAlignment, bytes));
      if (bounce_ == nullptr) return absl::ResourceExhaustedError("cannot allocate a read buffer");
      bounce_bytes_ = bytes;
    }
    for (int64_t done = 0; done < bytes;) {
      const ssize_t n = pread(fd_, bounce_ + done, bytes - done, aligned_begin + done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return absl::DataLossError(absl::StrCat("reading ", path_, " at ", aligned_begin + done,
                                                ": ",
                                                n < 0 ? std::strerror(errno) : "end of file"));
      }
      done += n;
    }
    std::memcpy(out, bounce_ + (begin - aligned_begin), end - begin);
    bytes_read_ += bytes;
    return absl::OkStatus();
  }
  int64_t bytes_read() const override { return bytes_read_; }

 private:
  const PackLayout layout_;
  const int fd_;
  const std::string path_;
  std::byte* bounce_ = nullptr;
  int64_t bounce_bytes_ = 0;
  int64_t bytes_read_ = 0;
};

// Reads and checks the header of the pack at `path`, and that the file is as long as it says.
absl::StatusOr<PackLayout> ReadLayout(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read expert pack ", path));
  std::string header(PackLayout::kAlignment, '\0');
  in.read(header.data(), PackLayout::kAlignment);
  if (in.gcount() != PackLayout::kAlignment) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is too short for an expert pack"));
  }
  header.back() = '\0';
  ASSIGN_OR_RETURN(PackLayout layout, ParseHeader(header.c_str(), path));
  in.seekg(0, std::ios::end);
  if (static_cast<int64_t>(in.tellg()) != layout.file_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds ", static_cast<int64_t>(in.tellg()), " bytes; its header says ",
                     layout.file_bytes()));
  }
  return layout;
}

}  // namespace

int64_t PackLayout::expert_stride() const {
  return RoundUp(intermediate * bundle_bytes(), kAlignment);
}

int64_t PackLayout::offset(int layer, int expert) const {
  return kAlignment + (int64_t{layer} * experts + expert) * expert_stride();
}

int64_t PackLayout::file_bytes() const { return offset(layers, 0); }

absl::Status WriteExpertPack(const engine::ModelWeights& weights, const std::string& path) {
  const model::ModelConfig& c = weights.config;
  if (c.HasDenseLayers()) {
    return absl::UnimplementedError(
        "expert packs of a model with dense MLP layers (decoder_sparse_step / mlp_only_layers) "
        "are not supported");
  }
  PackLayout layout{.layers = static_cast<int>(c.num_hidden_layers),
                    .experts = static_cast<int>(c.num_local_experts),
                    .hidden = static_cast<int>(c.hidden_size),
                    .intermediate = static_cast<int>(c.intermediate_size)};
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  const std::string header = Header(layout);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  std::vector<uint16_t> expert(layout.expert_stride() / 2);
  const int h = layout.hidden;
  for (int l = 0; l < layout.layers; ++l) {
    for (int e = 0; e < layout.experts; ++e) {
      if (!weights.HasExpert(l, e)) {
        return absl::InvalidArgumentError("an expert pack needs every expert's weights");
      }
      const engine::ExpertWeights& w = weights.layers[l].experts[e];
      std::fill(expert.begin(), expert.end(), 0);
      for (int i = 0; i < layout.intermediate; ++i) {
        uint16_t* bundle = expert.data() + static_cast<size_t>(i) * 3 * h;
        std::memcpy(bundle, w.gate.row(i), h * sizeof(uint16_t));
        std::memcpy(bundle + h, w.up.row(i), h * sizeof(uint16_t));
        for (int j = 0; j < h; ++j) bundle[2 * h + j] = w.down.row(j)[i];
      }
      out.write(reinterpret_cast<const char*>(expert.data()),
                static_cast<std::streamsize>(expert.size() * sizeof(uint16_t)));
    }
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ExpertBacking>> HostBacking(const std::string& pack_path) {
  ASSIGN_OR_RETURN(PackLayout layout, ReadLayout(pack_path));
  std::vector<std::byte> data(layout.file_bytes());
  std::ifstream in(pack_path, std::ios::binary);
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data.size()));
  if (in.gcount() != static_cast<std::streamsize>(data.size())) {
    return absl::DataLossError(absl::StrCat("cannot read all of ", pack_path));
  }
  return std::make_unique<HostPack>(layout, std::move(data));
}

absl::StatusOr<std::unique_ptr<ExpertBacking>> DirectFileBacking(const std::string& pack_path) {
  ASSIGN_OR_RETURN(PackLayout layout, ReadLayout(pack_path));
  const int fd = open(pack_path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == EINVAL) {
      return absl::FailedPreconditionError(
          absl::StrCat("the file system of ", pack_path, " does not support O_DIRECT"));
    }
    return absl::NotFoundError(absl::StrCat("cannot open ", pack_path, ": ", std::strerror(error)));
  }
  return std::make_unique<DirectFile>(layout, fd, pack_path);
}

absl::StatusOr<std::unique_ptr<ExpertCache>> ExpertCache::Create(ExpertBacking* backing,
                                                                 int64_t capacity_bytes) {
  const PackLayout& layout = backing->layout();
  const int64_t full = int64_t{3} * layout.intermediate * layout.hidden * 2;
  if (capacity_bytes < full) {
    return absl::InvalidArgumentError(absl::StrCat("an expert cache of ", capacity_bytes,
                                                   " bytes cannot hold one full expert (", full,
                                                   " bytes)"));
  }
  return std::unique_ptr<ExpertCache>(new ExpertCache(backing, capacity_bytes));
}

void ExpertCache::SetPriorityWeights(std::vector<std::vector<double>> weights) {
  weights_ = std::move(weights);
}

int ExpertCache::resident_width(int layer, int expert) const {
  auto it = entries_.find(int64_t{layer} * backing_->layout().experts + expert);
  return it == entries_.end() ? 0 : it->second.expert.width;
}

void ExpertCache::UnpinAll() {
  for (auto& [key, entry] : entries_) entry.pinned = false;
}

bool ExpertCache::MakeRoom(int64_t bytes) {
  const int experts = backing_->layout().experts;
  while (resident_bytes_ + bytes > capacity_) {
    auto victim = entries_.end();
    double lowest = 0;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.pinned) continue;
      const int layer = static_cast<int>(it->first / experts);
      const int expert = static_cast<int>(it->first % experts);
      const double weight = weights_.empty() ? 1.0 : weights_[layer][expert];
      const double priority = weight * static_cast<double>(it->second.uses);
      if (victim == entries_.end() || priority < lowest ||
          (priority == lowest && it->second.last_use < victim->second.last_use)) {
        victim = it;
        lowest = priority;
      }
    }
    if (victim == entries_.end()) return false;
    resident_bytes_ -= victim->second.expert.bytes();
    entries_.erase(victim);
    ++stats_.evictions;
  }
  return true;
}

absl::Status ExpertCache::Load(int layer, int expert, int from, int to, Entry* entry) {
  const absl::Time start = absl::Now();
  const PackLayout& layout = backing_->layout();
  const int h = layout.hidden;
  staging_.resize(static_cast<size_t>(to - from) * layout.bundle_bytes());
  RETURN_IF_ERROR(backing_->Read(layer, expert, from, to - from, staging_.data()));
  const auto* bundles = reinterpret_cast<const uint16_t*>(staging_.data());
  ResidentExpert& r = entry->expert;
  // gate and up grow by rows; down, (hidden, width), is rebuilt one row per hidden unit.
  for (engine::Bf16Matrix* m : {&r.gate, &r.up}) {
    m->rows = to;
    m->cols = h;
    m->data.resize(static_cast<size_t>(to) * h);
  }
  engine::Bf16Matrix down;
  down.rows = h;
  down.cols = to;
  down.data.resize(static_cast<size_t>(h) * to);
  for (int j = 0; j < h && from > 0; ++j) {
    std::memcpy(down.data.data() + static_cast<size_t>(j) * to, r.down.row(j),
                from * sizeof(uint16_t));
  }
  for (int i = from; i < to; ++i) {
    const uint16_t* bundle = bundles + static_cast<size_t>(i - from) * 3 * h;
    std::memcpy(r.gate.data.data() + static_cast<size_t>(i) * h, bundle, h * sizeof(uint16_t));
    std::memcpy(r.up.data.data() + static_cast<size_t>(i) * h, bundle + h, h * sizeof(uint16_t));
    for (int j = 0; j < h; ++j) down.data[static_cast<size_t>(j) * to + i] = bundle[2 * h + j];
  }
  r.down = std::move(down);
  resident_bytes_ += int64_t{3} * (to - from) * h * 2;
  r.width = to;
  stats_.bytes_loaded += (to - from) * layout.bundle_bytes();
  stats_.load_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

absl::StatusOr<const ResidentExpert*> ExpertCache::Acquire(int layer, int expert, int width) {
  const PackLayout& layout = backing_->layout();
  if (layer < 0 || layer >= layout.layers || expert < 0 || expert >= layout.experts || width < 1 ||
      width > layout.intermediate) {
    return absl::InvalidArgumentError(absl::StrCat("expert ", expert, " of layer ", layer,
                                                   " at width ", width, " is outside the pack"));
  }
  const int64_t key = int64_t{layer} * layout.experts + expert;
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.expert.width >= width) {
    ++stats_.hits;
    ++it->second.uses;
    it->second.last_use = ++tick_;
    it->second.pinned = true;
    return &it->second.expert;
  }
  const int from = it == entries_.end() ? 0 : it->second.expert.width;
  if (it != entries_.end()) it->second.pinned = true;  // not evicted to make its own room
  if (!MakeRoom(int64_t{3} * (width - from) * layout.hidden * 2)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the expert cache (", capacity_, " bytes) is full of experts this step uses; expert ",
        expert, " of layer ", layer, " at width ", width, " does not fit"));
  }
  Entry& entry = entries_[key];  // node_hash_map: references stay valid
  ++(from == 0 ? stats_.misses : stats_.widenings);
  ++entry.uses;
  entry.last_use = ++tick_;
  entry.pinned = true;
  RETURN_IF_ERROR(Load(layer, expert, from, width, &entry));
  return &entry.expert;
}

}  // namespace tandem::moe
