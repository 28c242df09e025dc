// A sequence's KV cache as one byte stream, laid out the same on both sides of a transfer
// whatever blocks each side holds it in: for each layer, K then V, for each of the sequence's
// blocks in order, that block's (block_size, num_kv_heads, head_dim) values. Prefill reads its
// blocks into the stream; decode writes the stream into the blocks it reserved.
#pragma once

#include <cstdint>
#include <vector>

#include <string_view>
#include "absl/status/statusor.h"

#include "absl/types/span.h"
#include "common/engine/kv_cache.h"

namespace tandem::kv {

class KvStream {
 public:
  // The stream of `blocks` of `pool` (which must outlive it). INVALID_ARGUMENT for a block id
  // outside the pool or no blocks.
  static absl::StatusOr<KvStream> Of(engine::KvBlockPool* pool, std::vector<int32_t> blocks);
  // Bytes in a stream of `blocks` blocks of `config`'s geometry.
  static uint64_t BytesFor(const engine::KvCacheConfig& config, int blocks);

  uint64_t size() const { return size_; }

  // Copies the stream's bytes [offset, offset + out.size()) out of the pool, or `data` into
  // the pool at `offset`. OUT_OF_RANGE for a range past the stream's end.
  absl::Status Read(uint64_t offset, absl::Span<char> out) const;
  absl::Status Write(uint64_t offset, std::string_view data) const;

 private:
  KvStream(engine::KvBlockPool* pool, std::vector<int32_t> blocks);
  // The pool bytes of the piece holding stream byte `offset` and how far into it that is.
  char* Piece(uint64_t offset, uint64_t* within) const;
  absl::Status CheckRange(uint64_t offset, uint64_t length) const;

  engine::KvBlockPool* pool_;
  std::vector<int32_t> blocks_;
  uint64_t piece_bytes_;  // one block of one layer's K or V
  uint64_t size_;
};

}  // namespace tandem::kv
