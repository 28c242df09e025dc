// An expert pack (tandem pack; tandem-decode --expert_pack) as decode opens one:
// moe::HostBacking (the 4096-byte header parsed, the file's length checked against it), then
// every expert read back, and an expert cache over it loading, widening and evicting experts,
// their weights compared with the file's bundles.
#include <cstring>
#include <vector>

#include "common/moe/expert_store.h"
#include "tests/fuzz/fuzz_util.h"

namespace tandem::moe {
namespace {

uint16_t Bf16At(const uint8_t* data, int64_t offset) {
  uint16_t v;
  std::memcpy(&v, data + offset, sizeof(v));
  return v;
}

// The resident expert holds the first `width` bundles of (layer, expert) in the engine's layout.
void CheckResident(const ResidentExpert& r, const PackLayout& layout, int layer, int expert,
                   const uint8_t* data) {
  const int h = layout.hidden;
  FUZZ_CHECK(r.gate.rows == r.width && r.up.rows == r.width && r.down.cols == r.width);
  for (int i = 0; i < r.width; ++i) {
    const int64_t bundle = layout.offset(layer, expert) + i * layout.bundle_bytes();
    for (int j = 0; j < h; ++j) {
      FUZZ_CHECK(r.gate.data[static_cast<size_t>(i) * h + j] == Bf16At(data, bundle + 2 * j));
      FUZZ_CHECK(r.up.data[static_cast<size_t>(i) * h + j] == Bf16At(data, bundle + 2 * (h + j)));
      FUZZ_CHECK(r.down.data[static_cast<size_t>(j) * r.width + i] ==
                 Bf16At(data, bundle + 2 * (2 * h + j)));
    }
  }
}

void CheckPack(ExpertBacking& backing, const uint8_t* data, size_t size) {
  const PackLayout layout = backing.layout();
  FUZZ_CHECK(layout.layers >= 1 && layout.experts >= 1 && layout.hidden >= 1 &&
             layout.intermediate >= 1);
  FUZZ_CHECK(layout.file_bytes() == static_cast<int64_t>(size));
  std::vector<std::byte> expert(layout.intermediate * layout.bundle_bytes());
  for (int l = 0; l < layout.layers; ++l) {
    for (int e = 0; e < layout.experts; ++e) {
      FUZZ_CHECK(backing.Read(l, e, 0, layout.intermediate, expert.data()).ok());
      FUZZ_CHECK(layout.offset(l, e) + static_cast<int64_t>(expert.size()) <=
                 static_cast<int64_t>(size));
      FUZZ_CHECK(std::memcmp(expert.data(), data + layout.offset(l, e), expert.size()) == 0);
    }
  }
  FUZZ_CHECK(!backing.Read(layout.layers, 0, 0, 1, expert.data()).ok());
  FUZZ_CHECK(!backing.Read(0, 0, 1, layout.intermediate, expert.data()).ok());

  const int64_t full = 3 * int64_t{layout.intermediate} * layout.hidden * 2;
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
