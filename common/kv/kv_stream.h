// A sequence's KV cache as one byte stream, laid out the same on both sides of a transfer
// whatever blocks and state slot each side holds it in: for each (attention) layer, K then V
// (K alone where the layers keep keys only: latent attention), for each of the sequence's blocks
// in order, that block's (block_size, num_kv_heads, head_dim)
// values; then, where the pool keeps state, the sequence's state slot: a hybrid model's Gated
// DeltaNet states whole, and of each window ring (KvCacheConfig::rings) only the blocks that can
// hold positions, the first min(ring blocks, the stream's blocks) of its K and of its V (a
// sequence of n positions has written ring block b % ring_blocks for each b < ceil(n / block
// size)). Prefill reads its blocks and slot into the stream; decode writes the stream into the
// blocks and slot it reserved.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <string_view>
#include "absl/status/statusor.h"

#include "absl/types/span.h"
#include "common/engine/kv_cache.h"

namespace tandem::kv {

class KvStream {
 public:
  // The stream of `blocks` (and state slot `state_slot`) of `pool` (which must outlive it).
  // INVALID_ARGUMENT for a block id outside the pool, no blocks, or a state slot missing where
  // the pool keeps state (or given where it keeps none).
  static absl::StatusOr<KvStream> Of(engine::KvBlockPool* pool, std::vector<int32_t> blocks,
                                     int32_t state_slot = -1);
  // Bytes in a stream of `blocks` blocks of `config`'s geometry, its state included.
  static uint64_t BytesFor(const engine::KvCacheConfig& config, int blocks);

  uint64_t size() const { return size_; }

  // Copies the stream's bytes [offset, offset + out.size()) out of the pool, or `data` into
  // the pool at `offset`. OUT_OF_RANGE for a range past the stream's end.
  absl::Status Read(uint64_t offset, absl::Span<char> out) const;
  absl::Status Write(uint64_t offset, std::string_view data) const;

 private:
  KvStream(engine::KvBlockPool* pool, std::vector<int32_t> blocks, int32_t state_slot);
  // The pool bytes of the piece holding stream byte `offset`, how far into it that is, and the
  // piece's length (a block of one layer's K or V, or the state slot).
  char* Piece(uint64_t offset, uint64_t* within, uint64_t* piece_bytes) const;
  // The state slot's byte ranges the stream carries, in stream order: (offset in the slot,
  // length).
  static std::vector<std::pair<uint64_t, uint64_t>> StatePieces(const engine::KvCacheConfig& config,
                                                                int blocks, uint64_t block_bytes);
  absl::Status CheckRange(uint64_t offset, uint64_t length) const;

  engine::KvBlockPool* pool_;
  std::vector<int32_t> blocks_;
  int32_t state_slot_;     // -1: none
  uint64_t piece_bytes_;   // one block of one layer's K or V
  uint64_t blocks_bytes_;  // the K/V part; the state follows
  std::vector<std::pair<uint64_t, uint64_t>> state_pieces_;
  uint64_t size_;
};

}  // namespace tandem::kv
