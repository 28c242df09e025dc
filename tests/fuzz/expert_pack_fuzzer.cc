// An expert pack (tandem pack; tandem-decode --expert_pack) as decode opens one:
// moe::HostBacking (the 4096-byte header parsed, the file's length checked against it), then
// every expert read back, and an expert cache over it loading, widening and evicting experts,
// their packed bytes compared with the file's bundles (bf16, int8 or int4).
#include <cstring>
#include <vector>

#include "common/moe/expert_store.h"
#include "tests/fuzz/fuzz_util.h"

namespace tandem::moe {
namespace {

// The resident expert holds the first width / bundle_neurons bundles of (layer, expert), each
// byte where a pack puts it: gate and up panels whole, down's panels piece by piece.
void CheckResident(const ResidentExpert& r, const PackLayout& layout, int layer, int expert,
                   const uint8_t* data) {
  FUZZ_CHECK(r.gate.rows() == r.width && r.up.rows() == r.width && r.down.cols() == r.width);
  FUZZ_CHECK(r.width % layout.bundle_neurons() == 0);
  const int bundles = r.width / layout.bundle_neurons();
  const int64_t gate_piece = layout.gate_piece_bytes();
  const int64_t down_piece = layout.down_piece_bytes();
  const bool bf16 = layout.format == kernels::WeightFormat::kBf16;
  const int64_t down_values = bf16 ? down_piece : r.down.layout.group_bytes();
  for (int b = 0; b < bundles; ++b) {
    const uint8_t* bundle = data + layout.offset(layer, expert) + b * layout.bundle_bytes();
    FUZZ_CHECK(std::memcmp(r.gate.data.data() + b * gate_piece, bundle, gate_piece) == 0);
    FUZZ_CHECK(std::memcmp(r.up.data.data() + b * gate_piece, bundle + gate_piece, gate_piece) ==
               0);
    for (int p = 0; p < r.down.layout.panels(); ++p) {
      const uint8_t* piece = bundle + 2 * gate_piece + p * down_piece;
      const std::byte* panel = r.down.data.data() + p * r.down.layout.panel_bytes();
      FUZZ_CHECK(std::memcmp(panel + b * down_values, piece, down_values) == 0);
      if (!bf16) {
        FUZZ_CHECK(
            std::memcmp(panel + r.down.layout.scale_offset() + b * (down_piece - down_values),
                        piece + down_values, down_piece - down_values) == 0);
      }
    }
  }
}

void CheckPack(ExpertBacking& backing, const uint8_t* data, size_t size) {
  const PackLayout layout = backing.layout();
  FUZZ_CHECK(layout.layers >= 1 && layout.experts >= 1 && layout.hidden >= 1 &&
             layout.intermediate >= 1);
  FUZZ_CHECK(layout.file_bytes() == static_cast<int64_t>(size));
  std::vector<std::byte> expert(layout.bundles() * layout.bundle_bytes());
  for (int l = 0; l < layout.layers; ++l) {
    for (int e = 0; e < layout.experts; ++e) {
      FUZZ_CHECK(backing.Read(l, e, 0, layout.bundles(), expert.data()).ok());
      FUZZ_CHECK(layout.offset(l, e) + static_cast<int64_t>(expert.size()) <=
                 static_cast<int64_t>(size));
      FUZZ_CHECK(std::memcmp(expert.data(), data + layout.offset(l, e), expert.size()) == 0);
    }
  }
  FUZZ_CHECK(!backing.Read(layout.layers, 0, 0, 1, expert.data()).ok());
  FUZZ_CHECK(!backing.Read(0, 0, 1, layout.bundles(), expert.data()).ok());

  const int64_t full = int64_t{layout.bundles()} * layout.bundle_bytes();
  FUZZ_CHECK(!ExpertCache::Create(&backing, full - 1).ok());
  absl::StatusOr<std::unique_ptr<ExpertCache>> cache = ExpertCache::Create(&backing, full);
  FUZZ_CHECK(cache.ok());
  const int last_layer = layout.layers - 1, last_expert = layout.experts - 1;
  absl::StatusOr<const ResidentExpert*> narrow = (*cache)->Acquire(0, 0, 1);
  FUZZ_CHECK(narrow.ok());
  CheckResident(**narrow, layout, 0, 0, data);
  absl::StatusOr<const ResidentExpert*> wide = (*cache)->Acquire(0, 0, layout.intermediate);
  FUZZ_CHECK(wide.ok());
  CheckResident(**wide, layout, 0, 0, data);
  if (last_layer != 0 || last_expert != 0) {
    // A full cache of pinned experts has no room; unpinned, the old one is evicted.
    FUZZ_CHECK(!(*cache)->Acquire(last_layer, last_expert, layout.intermediate).ok());
    (*cache)->UnpinAll();
    absl::StatusOr<const ResidentExpert*> other =
        (*cache)->Acquire(last_layer, last_expert, layout.intermediate);
    FUZZ_CHECK(other.ok());
    CheckResident(**other, layout, last_layer, last_expert, data);
    FUZZ_CHECK((*cache)->resident_width(0, 0) == 0);
  }
  FUZZ_CHECK((*cache)->resident_bytes() <= (*cache)->capacity_bytes());
  FUZZ_CHECK(!(*cache)->Acquire(0, 0, layout.intermediate + 1).ok());
}

}  // namespace
}  // namespace tandem::moe

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::MemFile* file = new tandem::fuzz::MemFile();
  absl::StatusOr<std::unique_ptr<tandem::moe::ExpertBacking>> backing =
      tandem::moe::HostBacking(file->Write(data, size));
  if (backing.ok()) {
    tandem::moe::CheckPack(**backing, data, size);
  } else {
    FUZZ_CHECK(backing.status().code() == absl::StatusCode::kInvalidArgument);
  }
  return 0;
}
