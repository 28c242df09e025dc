// Expert weights outside the engine's memory (docs/design.md, "Combination-aware mixed-width
// experts"): a backing tier holding every expert in a packed layout, and a resident cache bounded
// in bytes that holds experts at the widths decode asks for.
//
// Packed layout (an "expert pack", format v2): each expert is a run of bundles of neurons, in
// neuron order; a bundle is bundle_neurons() consecutive neurons (16 for bf16 experts, the
// quantization group — 32, 64 or 128 — for int8 / int4 ones), and holds exactly the bytes the
// engine's packed matrices (common/kernels/packed_matrix.h) keep for those neurons:
//   [gate panels of the bundle's rows] [up panels of its rows]
//   [for each 16-row panel of down (hidden rows): the bundle's columns of that panel — bf16
//    column pairs, or one quantization group's levels and then its 16 float16 scales]
// With neurons in importance order (tandem reorder), a width-k load is one contiguous read of the
// first ceil(k / bundle_neurons) bundles, quantized or not, and loading is copying: gate and up
// grow by whole panels, down's panels by the bundle's columns. A cached copy widens by reading
// only the missing bundles.
// On disk: a 4096-byte header ("tandem-expert-pack v2 layers L experts E hidden H intermediate I
// format bf16|int8|int4 group G"), then experts (layer-major) each padded to 4096 bytes, so that
// reads with O_DIRECT (which bypass the page cache) need no copy of the file's layout.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "common/engine/model_weights.h"
#include "common/kernels/packed_matrix.h"
#include "common/util/huge_pages.h"

namespace tandem::moe {

// Bytes [offset, offset + bytes) of a file.
struct ByteRange {
  int64_t offset = 0;
  int64_t bytes = 0;
};

// Where each expert's bundles lie in a pack.
struct PackLayout {
  static constexpr int64_t kAlignment = 4096;
  int layers = 0;
  int experts = 0;
  int hidden = 0;
  int intermediate = 0;
  kernels::WeightFormat format = kernels::WeightFormat::kBf16;
  int group = 0;  // int8 / int4: the quantization group

  // The pack of `config`'s experts: its format from its quantization config.
  static PackLayout For(const model::ModelConfig& config);

  int bundle_neurons() const;
  int bundles() const { return intermediate / bundle_neurons(); }
  // Bundles holding the first `width` neurons.
  int BundlesFor(int width) const;
  // The packed layouts of an expert's gate / up (width, hidden) and down (hidden, width).
  kernels::PanelLayout gate_layout(int width) const;
  kernels::PanelLayout down_layout(int width) const;
  int64_t gate_piece_bytes() const;  // one bundle's rows of gate (or up)
  int64_t down_piece_bytes() const;  // one bundle's columns of one panel of down
  int64_t bundle_bytes() const;
  int64_t expert_stride() const;                // bytes between experts, a multiple of kAlignment
  int64_t offset(int layer, int expert) const;  // of the expert's first bundle in the file
  // The bytes holding the first `width` neurons of (layer, expert): one contiguous prefix.
  ByteRange Prefix(int layer, int expert, int width) const {
    return {offset(layer, expert), int64_t{BundlesFor(width)} * bundle_bytes()};
  }
  int64_t file_bytes() const;
  // Empty when the sizes are positive, the group fits the format and the width is a whole
  // number of bundles; otherwise what is wrong.
  std::string Check() const;
};

// Writes every expert of `weights` (all resident) to `path` as a pack.
absl::Status WriteExpertPack(const engine::ModelWeights& weights, const std::string& path);

// A backing tier: reads bundles [first, first + count) of an expert into `out`
// (count * bundle_bytes bytes). Counts the bytes it read from where it keeps them (for a file,
// whole aligned blocks). Reads may come from any one thread at a time.
class ExpertBacking {
 public:
  virtual ~ExpertBacking() = default;
  virtual const PackLayout& layout() const = 0;
  virtual absl::Status Read(int layer, int expert, int first, int count, std::byte* out) = 0;
  virtual int64_t bytes_read() const = 0;
};

// The pack in host memory (the CPU analogue of pinned host memory feeding a GPU).
absl::StatusOr<std::unique_ptr<ExpertBacking>> HostBacking(const std::string& pack_path);
// The pack file read with O_DIRECT, bypassing the page cache: every read goes to the device.
// FAILED_PRECONDITION when the file system refuses O_DIRECT (tmpfs does).
absl::StatusOr<std::unique_ptr<ExpertBacking>> DirectFileBacking(const std::string& pack_path);

// One resident expert at `width` neurons (whole bundles, or the whole expert) in the engine's
// packed layout: gate and up (width, hidden), down (hidden, width) — the first `width` neurons
// of the full expert.
struct ResidentExpert {
  int width = 0;
  engine::WeightMatrix gate, up, down;
  int64_t bytes() const {
    return static_cast<int64_t>(gate.data.size() + up.data.size() + down.data.size());
  }
};

// Appends bundles [from, to) (laid out as in a pack, `bundles` pointing at bundle `from`) to
// `expert`, which holds the first `from` bundles: it then holds the first `to`.
void AppendBundles(const PackLayout& layout, const std::byte* bundles, int from, int to,
                   ResidentExpert* expert);

struct CacheStats {
  int64_t hits = 0;       // the expert was resident at the width asked for or wider
  int64_t misses = 0;     // not resident at all
  int64_t widenings = 0;  // resident, narrower: only the missing bundles were read
  int64_t evictions = 0;
  int64_t bytes_loaded = 0;  // bundle bytes brought in (the backing's bytes_read may be more)
  double load_seconds = 0;
};

// The resident cache over a backing, bounded in bytes (what ResidentExpert::bytes() counts).
// Replacement: the expert with the lowest priority goes first — priority is the number of
// times the expert was asked for, weighted by `weights` (a per-(layer, expert) importance,
// e.g. its calibration frequency or the tier of its pairs), ties going to the least recently
// used, so the choice is deterministic; experts in use by the current step (pinned since the
// last Unpin) are never evicted. Not thread-safe: one engine thread.
class ExpertCache {
 public:
  // INVALID_ARGUMENT when capacity cannot hold one full-width expert.
  static absl::StatusOr<std::unique_ptr<ExpertCache>> Create(ExpertBacking* backing,
                                                             int64_t capacity_bytes);

  // (layers, experts) weights of the replacement priority; default all 1.
  void SetPriorityWeights(std::vector<std::vector<double>> weights);

  // The expert at `width` neurons or more, loading or widening it as needed (evicting others),
  // and pinned until Unpin. RESOURCE_EXHAUSTED when pinned experts leave no room.
  absl::StatusOr<const ResidentExpert*> Acquire(int layer, int expert, int width);
  void UnpinAll();

  const CacheStats& stats() const { return stats_; }
  int64_t resident_bytes() const { return resident_bytes_; }
  int64_t capacity_bytes() const { return capacity_; }
  // The width (layer, expert) is resident at, 0 if not.
  int resident_width(int layer, int expert) const;

 private:
  struct Entry {
    ResidentExpert expert;
    int64_t uses = 0;
    int64_t last_use = 0;  // tick of the latest Acquire: ties go to the least recently used
    bool pinned = false;
  };
  ExpertCache(ExpertBacking* backing, int64_t capacity) : backing_(backing), capacity_(capacity) {}
  // Frees room for `bytes` more; false when only pinned experts are left.
  bool MakeRoom(int64_t bytes);
  // Reads bundles [from, to) of (layer, expert) into `entry`, which holds `from` already.
  absl::Status Load(int layer, int expert, int from, int to, Entry* entry);

  ExpertBacking* const backing_;
  const int64_t capacity_;
  int64_t resident_bytes_ = 0;
  int64_t tick_ = 0;
  std::vector<std::vector<double>> weights_;
  absl::node_hash_map<int64_t, Entry> entries_;  // key layer * experts + expert; stable
  std::vector<std::byte> staging_;               // bundles as read, before unpacking
  CacheStats stats_;
};

}  // namespace tandem::moe
