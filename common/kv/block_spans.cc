#include "common/kv/block_spans.h"

#include "absl/strings/str_cat.h"

namespace tandem::kv {

absl::StatusOr<std::vector<CopySpan>> KvBlockCopySpans(const engine::KvBlockPool& src,
                                                       absl::Span<const int32_t> src_blocks,
                                                       const engine::KvBlockPool& dst,
                                                       absl::Span<const int32_t> dst_blocks) {
  return KvBlockCopySpans(src, src_blocks, dst.config(), dst_blocks);
}

absl::StatusOr<std::vector<CopySpan>> KvBlockCopySpans(const engine::KvBlockPool& src,
                                                       absl::Span<const int32_t> src_blocks,
                                                       const engine::KvCacheConfig& b,
                                                       absl::Span<const int32_t> dst_blocks) {
  const engine::KvCacheConfig& a = src.config();
  const struct {
    const char* name;
    int src, dst;
  } fields[] = {{"num_layers", a.num_layers, b.num_layers},
                {"num_kv_heads", a.num_kv_heads, b.num_kv_heads},
                {"head_dim", a.head_dim, b.head_dim},
                {"block_size", a.block_size, b.block_size}};
  for (const auto& f : fields) {
    if (f.src != f.dst) {
      return absl::InvalidArgumentError(absl::StrCat("KV pools differ in ", f.name, ": ", f.src,
                                                     " in the source, ", f.dst, " here"));
    }
  }
  if (src_blocks.size() != dst_blocks.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("copying ", src_blocks.size(), " blocks into ", dst_blocks.size()));
  }
  for (size_t i = 0; i < src_blocks.size(); ++i) {
    if (src_blocks[i] < 0 || src_blocks[i] >= a.num_blocks || dst_blocks[i] < 0 ||
        dst_blocks[i] >= b.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("block pair ", i, " (", src_blocks[i], " -> ",
                                                     dst_blocks[i], ") is out of range"));
    }
  }
  const uint64_t block_bytes = src.block_floats() * sizeof(float);
  const uint64_t dst_stride = engine::KvBlockPool::PoolStrideFloats(b);
  std::vector<CopySpan> spans;
  for (int layer = 0; layer < a.num_layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      const uint64_t src_pool =
          static_cast<uint64_t>((kv == 0 ? src.k_pool(layer) : src.v_pool(layer)) - src.data()) *
          sizeof(float);
      const uint64_t dst_pool =
          (2 * static_cast<uint64_t>(layer) + kv) * dst_stride * sizeof(float);
      for (size_t i = 0; i < src_blocks.size(); ++i) {
        const CopySpan span{src_pool + static_cast<uint64_t>(src_blocks[i]) * block_bytes,
                            dst_pool + static_cast<uint64_t>(dst_blocks[i]) * block_bytes,
                            block_bytes};
        if (!spans.empty() && spans.back().src_offset + spans.back().length == span.src_offset &&
            spans.back().dst_offset + spans.back().length == span.dst_offset) {
          spans.back().length += block_bytes;
        } else {
          spans.push_back(span);
        }
      }
    }
  }
  return spans;
}

}  // namespace tandem::kv
