#include "common/kv/kv_stream.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::kv {

absl::StatusOr<KvStream> KvStream::Of(engine::KvBlockPool* pool, std::vector<int32_t> blocks,
                                      int32_t state_slot) {
  if (blocks.empty()) return absl::InvalidArgumentError("a KV stream needs at least one block");
  const int slots = pool->config().num_state_slots;
  if ((slots > 0) != (state_slot >= 0) || state_slot >= slots) {
    return absl::InvalidArgumentError(
        slots > 0 ? absl::StrCat("the pool keeps recurrent state: the stream needs the "
                                 "sequence's state slot in [0, ",
                                 slots, "), got ", state_slot)
                  : absl::StrCat("the pool keeps no recurrent state, got state slot ", state_slot));
  }
  for (int32_t b : blocks) {
    if (b < 0 || b >= pool->num_total()) {
      return absl::InvalidArgumentError(
          absl::StrCat("block ", b, " is outside the pool's ", pool->num_total(), " blocks"));
    }
  }
  return KvStream(pool, std::move(blocks), state_slot);
}

std::vector<std::pair<uint64_t, uint64_t>> KvStream::StatePieces(
    const engine::KvCacheConfig& config, int blocks, uint64_t block_bytes) {
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  if (config.state_bytes <= 0) return pieces;
  // The recurrent states before the first ring (or the whole slot), then each ring's live
  // blocks of K and of V.
  const uint64_t fixed = config.rings.empty() ? static_cast<uint64_t>(config.state_bytes)
                                              : static_cast<uint64_t>(config.rings[0].offset);
  if (fixed > 0) pieces.emplace_back(0, fixed);
  for (const engine::KvCacheConfig::Ring& ring : config.rings) {
    const uint64_t live = static_cast<uint64_t>(std::min(ring.blocks, std::max(blocks, 0)));
    const uint64_t k = static_cast<uint64_t>(ring.offset);
    const uint64_t ring_block = static_cast<uint64_t>(ring.block_bytes);
    pieces.emplace_back(k, live * ring_block);
    pieces.emplace_back(k + static_cast<uint64_t>(ring.blocks) * ring_block, live * ring_block);
  }
  return pieces;
}

uint64_t KvStream::BytesFor(const engine::KvCacheConfig& config, int blocks) {
  const uint64_t piece =
      kernels::KvBlockBytes(config.dtype, config.block_size, config.num_kv_heads, config.head_dim);
  uint64_t state = 0;
  for (const auto& [offset, length] : StatePieces(config, blocks, piece)) state += length;
  return piece * static_cast<uint64_t>(config.pools_per_layer()) *
             static_cast<uint64_t>(config.num_layers) * static_cast<uint64_t>(blocks) +
         state;
}

KvStream::KvStream(engine::KvBlockPool* pool, std::vector<int32_t> blocks, int32_t state_slot)
    : pool_(pool),
      blocks_(std::move(blocks)),
      state_slot_(state_slot),
      piece_bytes_(pool->block_bytes()),
      blocks_bytes_(piece_bytes_ * static_cast<uint64_t>(pool->config().pools_per_layer()) *
                    static_cast<uint64_t>(pool->config().num_layers) * blocks_.size()),
      state_pieces_(
          StatePieces(pool->config(), static_cast<int>(blocks_.size()), pool->block_bytes())),
      size_(BytesFor(pool->config(), static_cast<int>(blocks_.size()))) {}

char* KvStream::Piece(uint64_t offset, uint64_t* within, uint64_t* piece_bytes) const {
  if (offset >= blocks_bytes_) {  // the state slot's pieces, in order
    uint64_t at = offset - blocks_bytes_;
    for (const auto& [slot_offset, length] : state_pieces_) {
      if (at < length) {
        *within = at;
        *piece_bytes = length;
        return reinterpret_cast<char*>(pool_->state(state_slot_)) + slot_offset;
      }
      at -= length;
    }
  }
  *piece_bytes = piece_bytes_;
  const uint64_t piece = offset / piece_bytes_;
  *within = offset % piece_bytes_;
  const uint64_t n = blocks_.size();
  const uint64_t pools = static_cast<uint64_t>(pool_->config().pools_per_layer());
  const int layer = static_cast<int>(piece / (pools * n));
  const bool value = pools == 2 && (piece / n) % 2 == 1;
  const int32_t block = blocks_[piece % n];
  return reinterpret_cast<char*>(value ? pool_->v_block(layer, block)
                                       : pool_->k_block(layer, block));
}

absl::Status KvStream::CheckRange(uint64_t offset, uint64_t length) const {
  if (offset > size_ || length > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", +", length,
                                              ") are outside the KV stream of ", size_, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status KvStream::Read(uint64_t offset, absl::Span<char> out) const {
  if (absl::Status s = CheckRange(offset, out.size()); !s.ok()) return s;
  size_t done = 0;
  while (done < out.size()) {
    uint64_t within = 0, piece_bytes = 0;
    const char* piece = Piece(offset + done, &within, &piece_bytes);
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(piece_bytes - within, out.size() - done));
    std::memcpy(out.data() + done, piece + within, n);
    done += n;
  }
  return absl::OkStatus();
}

absl::Status KvStream::Write(uint64_t offset, std::string_view data) const {
  if (absl::Status s = CheckRange(offset, data.size()); !s.ok()) return s;
  size_t done = 0;
  while (done < data.size()) {
    uint64_t within = 0, piece_bytes = 0;
    char* piece = Piece(offset + done, &within, &piece_bytes);
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(piece_bytes - within, data.size() - done));
    std::memcpy(piece + within, data.data() + done, n);
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace tandem::kv
