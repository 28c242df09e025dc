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
#include "common/util/clock.h"
#include "common/util/huge_pages.h"
#include "common/util/status.h"

namespace tandem::moe {
namespace {

constexpr char kMagic[] = "tandem-expert-pack v2";
constexpr char kMagicV1[] = "tandem-expert-pack v1";

int64_t RoundUp(int64_t bytes, int64_t to) { return (bytes + to - 1) / to * to; }

// Whether the offsets of `layout` fit in int64_t, so that a header with huge sizes is refused
// instead of overflowing them. Sizes are at most 2^24 each (checked first), so the bundle
// arithmetic below stays far from overflow.
bool OffsetsFit(const PackLayout& layout) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max() - PackLayout::kAlignment;
  constexpr int kMaxSize = 1 << 24;
  if (layout.hidden > kMaxSize || layout.intermediate > kMaxSize || layout.layers > kMaxSize ||
      layout.experts > kMaxSize) {
    return false;
  }
  int64_t expert_bytes, experts, experts_bytes;
  return !__builtin_mul_overflow(int64_t{layout.bundles()}, layout.bundle_bytes(), &expert_bytes) &&
         expert_bytes <= kMax &&
         !__builtin_mul_overflow(int64_t{layout.layers}, int64_t{layout.experts}, &experts) &&
         !__builtin_mul_overflow(experts, RoundUp(expert_bytes, PackLayout::kAlignment),
                                 &experts_bytes) &&
         experts_bytes <= kMax;
}

std::string Header(const PackLayout& layout) {
  std::string header =
      absl::StrCat(kMagic, " layers ", layout.layers, " experts ", layout.experts, " hidden ",
                   layout.hidden, " intermediate ", layout.intermediate, " format ",
                   kernels::WeightFormatName(layout.format), " group ", layout.group, "\n");
  header.resize(PackLayout::kAlignment, '\0');
  return header;
}

absl::StatusOr<PackLayout> ParseHeader(const char* header, const std::string& path) {
  // "tandem-expert-pack v2 layers L experts E hidden H intermediate I format F group G\n", each
  // size a positive int (absl::SimpleAtoi refuses what would overflow one, where sscanf's %d is
  // undefined), F bf16 / int8 / int4, G 0 for bf16 and the quantization group otherwise.
  const std::vector<absl::string_view> words =
      absl::StrSplit(header, absl::ByAnyChar(" \n"), absl::SkipEmpty());
  if (words.size() >= 2 && absl::StrCat(words[0], " ", words[1]) == kMagicV1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     " is an expert pack of format v1 (bf16 neuron by neuron); write it again with "
                     "tandem pack"));
  }
  PackLayout layout;
  const std::pair<const char*, int*> fields[] = {{"layers", &layout.layers},
                                                 {"experts", &layout.experts},
                                                 {"hidden", &layout.hidden},
                                                 {"intermediate", &layout.intermediate},
                                                 {"group", &layout.group}};
  // The format sits between intermediate and group.
  bool ok = words.size() == 2 + 2 * std::size(fields) + 2 &&
            absl::StrCat(words[0], " ", words[1]) == kMagic;
  for (size_t i = 0, w = 2; ok && i < std::size(fields); ++i, w += 2) {
    if (i == 4) {
      ok = words[w] == "format";
      if (words[w + 1] == "bf16") {
        layout.format = kernels::WeightFormat::kBf16;
      } else if (words[w + 1] == "int8") {
        layout.format = kernels::WeightFormat::kInt8;
      } else if (words[w + 1] == "int4") {
        layout.format = kernels::WeightFormat::kInt4;
      } else {
        ok = false;
      }
      w += 2;
      if (!ok) break;
    }
    ok = words[w] == fields[i].first && absl::SimpleAtoi(words[w + 1], fields[i].second) &&
         *fields[i].second >= (i == 4 ? 0 : 1);
  }
  if (!ok) return absl::InvalidArgumentError(absl::StrCat(path, " is not a ", kMagic, " file"));
  if (const std::string problem = layout.Check(); !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem));
  }
  if (!OffsetsFit(layout)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": its header's sizes make a pack too large to address"));
  }
  return layout;
}

absl::Status CheckRead(const PackLayout& layout, int layer, int expert, int first, int count) {
  if (layer < 0 || layer >= layout.layers || expert < 0 || expert >= layout.experts || first < 0 ||
      count < 0 || count > layout.bundles() - first) {
    return absl::InvalidArgumentError(absl::StrCat("bundles [", first, ", ", int64_t{first} + count,
                                                   ") of expert ", expert, " of layer ", layer,
                                                   " are outside the pack"));
  }
  return absl::OkStatus();
}

// The pack in huge pages, as the weights are: each cache miss copies an expert out of it, and
// from 4 KiB pages that copy ran 1.07x (2 MB) and 1.09x (7 MB) slower, medians of five rounds on
// an Intel Xeon with AMX (tandem_kernels_bench's ExpertCopy).
using PackBytes = std::vector<std::byte, util::HugePageAllocator<std::byte>>;

class HostPack : public ExpertBacking {
 public:
  HostPack(PackLayout layout, PackBytes data) : layout_(layout), data_(std::move(data)) {}
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
  PackBytes data_;
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

PackLayout PackLayout::For(const model::ModelConfig& c) {
  PackLayout layout{.layers = static_cast<int>(c.num_hidden_layers),
                    .experts = static_cast<int>(c.num_local_experts),
                    .hidden = static_cast<int>(c.hidden_size),
                    .intermediate = static_cast<int>(c.intermediate_size)};
  if (c.quantization.experts) {
    layout.format =
        c.quantization.bits == 8 ? kernels::WeightFormat::kInt8 : kernels::WeightFormat::kInt4;
    layout.group = c.quantization.group_size;
  }
  return layout;
}

int PackLayout::bundle_neurons() const {
  return format == kernels::WeightFormat::kBf16 ? kernels::kPanelRows : group;
}

int PackLayout::BundlesFor(int width) const {
  return (width + bundle_neurons() - 1) / bundle_neurons();
}

kernels::PanelLayout PackLayout::gate_layout(int width) const {
  return {format, width, hidden, group};
}

kernels::PanelLayout PackLayout::down_layout(int width) const {
  return {format, hidden, width, group};
}

int64_t PackLayout::gate_piece_bytes() const {
  return gate_layout(intermediate).panel_bytes() * (bundle_neurons() / kernels::kPanelRows);
}

int64_t PackLayout::down_piece_bytes() const { return down_layout(bundle_neurons()).panel_bytes(); }

int64_t PackLayout::bundle_bytes() const {
  const int64_t down_panels = (hidden + kernels::kPanelRows - 1) / kernels::kPanelRows;
  return 2 * gate_piece_bytes() + down_panels * down_piece_bytes();
}

std::string PackLayout::Check() const {
  if (layers < 1 || experts < 1 || hidden < 1 || intermediate < 1) {
    return "an expert pack needs positive sizes";
  }
  if (format == kernels::WeightFormat::kBf16 ? group != 0 : !kernels::ValidGroup(group)) {
    return "the pack's group does not fit its format (0 for bf16; 32, 64 or 128 otherwise)";
  }
  if (intermediate % bundle_neurons() != 0) {
    return absl::StrCat("the expert width ", intermediate, " is not a whole number of ",
                        bundle_neurons(), "-neuron bundles");
  }
  if (format != kernels::WeightFormat::kBf16 && hidden % group != 0) {
    return absl::StrCat("the hidden size ", hidden, " is not a multiple of the group ", group);
  }
  return "";
}

int64_t PackLayout::expert_stride() const {
  return RoundUp(int64_t{bundles()} * bundle_bytes(), kAlignment);
}

int64_t PackLayout::offset(int layer, int expert) const {
  return kAlignment + (int64_t{layer} * experts + expert) * expert_stride();
}

int64_t PackLayout::file_bytes() const { return offset(layers, 0); }

namespace {

// Bundles [first, first + count) of a resident expert (at least that wide) into `out`.
void CopyBundles(const PackLayout& layout, const engine::WeightMatrix& gate,
                 const engine::WeightMatrix& up, const engine::WeightMatrix& down, int first,
                 int count, std::byte* out) {
  const int64_t gate_piece = layout.gate_piece_bytes();
  const int64_t down_piece = layout.down_piece_bytes();
  const int down_panels = down.layout.panels();
  const bool bf16 = layout.format == kernels::WeightFormat::kBf16;
  // Bytes of one bundle's values within a panel of down (bf16: all of its piece).
  const int64_t down_values = bf16 ? down_piece : down.layout.group_bytes();
  for (int b = first; b < first + count; ++b) {
    std::memcpy(out, gate.data.data() + b * gate_piece, gate_piece);
    std::memcpy(out + gate_piece, up.data.data() + b * gate_piece, gate_piece);
    std::byte* pieces = out + 2 * gate_piece;
    for (int p = 0; p < down_panels; ++p) {
      const std::byte* panel = down.data.data() + p * down.layout.panel_bytes();
      std::memcpy(pieces, panel + b * down_values, down_values);
      if (!bf16) {
        std::memcpy(pieces + down_values, panel + down.layout.scale_offset() + b * 32,
                    down_piece - down_values);
      }
      pieces += down_piece;
    }
    out += layout.bundle_bytes();
  }
}

}  // namespace

void AppendBundles(const PackLayout& layout, const std::byte* bundles, int from, int to,
                   ResidentExpert* r) {
  const int old_width = from * layout.bundle_neurons();
  const int width = std::min(layout.intermediate, to * layout.bundle_neurons());
  const int64_t gate_piece = layout.gate_piece_bytes();
  const int64_t down_piece = layout.down_piece_bytes();
  const bool bf16 = layout.format == kernels::WeightFormat::kBf16;
  // gate and up grow by whole panels.
  for (engine::WeightMatrix* m : {&r->gate, &r->up}) {
    m->layout = layout.gate_layout(width);
    m->data.resize(m->layout.bytes());
  }
  for (int b = from; b < to; ++b) {
    const std::byte* bundle = bundles + (b - from) * layout.bundle_bytes();
    std::memcpy(r->gate.data.data() + b * gate_piece, bundle, gate_piece);
    std::memcpy(r->up.data.data() + b * gate_piece, bundle + gate_piece, gate_piece);
  }
  // down's panels grow by the bundles' columns: rebuilt, the old columns first.
  engine::WeightMatrix down;
  down.layout = layout.down_layout(width);
  down.data.resize(down.layout.bytes());
  const kernels::PanelLayout old = layout.down_layout(std::max(old_width, 1));
  const int64_t down_values = bf16 ? down_piece : down.layout.group_bytes();
  for (int p = 0; p < down.layout.panels(); ++p) {
    std::byte* panel = down.data.data() + p * down.layout.panel_bytes();
    if (from > 0) {
      const std::byte* old_panel = r->down.data.data() + p * old.panel_bytes();
      std::memcpy(panel, old_panel, from * down_values);
      if (!bf16) {
        std::memcpy(panel + down.layout.scale_offset(), old_panel + old.scale_offset(),
                    from * (down_piece - down_values));
      }
    }
    for (int b = from; b < to; ++b) {
      const std::byte* piece =
          bundles + (b - from) * layout.bundle_bytes() + 2 * gate_piece + p * down_piece;
      std::memcpy(panel + b * down_values, piece, down_values);
      if (!bf16) {
        std::memcpy(panel + down.layout.scale_offset() + b * (down_piece - down_values),
                    piece + down_values, down_piece - down_values);
      }
    }
  }
  r->down = std::move(down);
  r->width = width;
}

absl::Status WriteExpertPack(const engine::ModelWeights& weights, const std::string& path) {
  const model::ModelConfig& c = weights.config;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.IsSparseLayer(l)) {
      return absl::UnimplementedError(
          "expert packs of a model with dense MLP layers (decoder_sparse_step / mlp_only_layers) "
          "are not supported");
    }
  }
  const PackLayout layout = PackLayout::For(c);
  if (const std::string problem = layout.Check(); !problem.empty()) {
    return absl::UnimplementedError(
        absl::StrCat("this model's experts cannot be packed: ", problem));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  const std::string header = Header(layout);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  std::vector<std::byte> expert(layout.expert_stride());
  for (int l = 0; l < layout.layers; ++l) {
    for (int e = 0; e < layout.experts; ++e) {
      if (!weights.HasExpert(l, e)) {
        return absl::InvalidArgumentError("an expert pack needs every expert's weights");
      }
      const engine::ExpertWeights& w = weights.layers[l].moe.experts[e];
      std::fill(expert.begin(), expert.end(), std::byte{0});
      CopyBundles(layout, w.gate, w.up, w.down, 0, layout.bundles(), expert.data());
      out.write(reinterpret_cast<const char*>(expert.data()),
                static_cast<std::streamsize>(expert.size()));
    }
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ExpertBacking>> HostBacking(const std::string& pack_path) {
  ASSIGN_OR_RETURN(PackLayout layout, ReadLayout(pack_path));
  PackBytes data(layout.file_bytes());
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
  const int64_t full = int64_t{layout.bundles()} * layout.bundle_bytes();
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
  const util::Instant start = util::Instant::Now();
  const PackLayout& layout = backing_->layout();
  staging_.resize(static_cast<size_t>(to - from) * layout.bundle_bytes());
  RETURN_IF_ERROR(backing_->Read(layer, expert, from, to - from, staging_.data()));
  const int64_t before = entry->expert.bytes();
  AppendBundles(layout, staging_.data(), from, to, &entry->expert);
  resident_bytes_ += entry->expert.bytes() - before;
  stats_.bytes_loaded += (to - from) * layout.bundle_bytes();
  stats_.load_seconds += absl::ToDoubleSeconds(util::Since(start));
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
  const int from = it == entries_.end() ? 0 : layout.BundlesFor(it->second.expert.width);
  const int to = layout.BundlesFor(width);
  if (it != entries_.end()) it->second.pinned = true;  // not evicted to make its own room
  if (!MakeRoom(int64_t{to - from} * layout.bundle_bytes())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the expert cache (", capacity_, " bytes) is full of experts this step uses; expert ",
        expert, " of layer ", layer, " at width ", width, " does not fit"));
  }
  Entry& entry = entries_[key];  // node_hash_map: references stay valid
  ++(from == 0 ? stats_.misses : stats_.widenings);
  ++entry.uses;
  entry.last_use = ++tick_;
  entry.pinned = true;
  RETURN_IF_ERROR(Load(layer, expert, from, to, &entry));
  return &entry.expert;
}

}  // namespace tandem::moe
