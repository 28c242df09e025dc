// How the KV cache stores keys and values, as the attention kernels read them: the element type
// (float32, bf16, or int8 with a float32 scale per token and KV head) and the byte layout of one
// block of one layer's K or V pool.
//
// A block of `block_size` tokens, (block_size, num_kv_heads, head_dim) values, row-major:
//   f32   float32 values                                        4 bytes a value
//   bf16  bfloat16 values (round to nearest even)               2 bytes a value
//   int8  int8 values, padded to a multiple of 4 bytes, then float32 scales (block_size,
//         num_kv_heads): value = q * scale, with scale = max|x| / 127 over the token's head
//         (symmetric; 0 for an all-zero head; NaN when the head holds a NaN or an infinity)
// An int8 scale covers one token's head rather than a whole block: tokens are appended one at a
// time, so a block-wide scale would have to be chosen before its values are known (or the block
// requantised as it fills); per-token scales cost 4 bytes per head_dim bytes (6% at 64) and
// never requantise. Layout and rationale: docs/kv-cache.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::kernels {

enum class KvDtype : uint8_t { kF32, kBf16, kInt8 };

// "f32", "bf16", "int8".
const char* KvDtypeName(KvDtype dtype);
// The dtype a flag names (the names above, and "float32" for f32); INVALID_ARGUMENT otherwise.
absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name);

// Bytes of one stored value (4, 2, 1).
size_t KvValueBytes(KvDtype dtype);
// Bytes of one block of one pool (values, then int8's scales). No overflow check: callers size
// pools with KvBlockPool::BytesFor, which checks.
size_t KvBlockBytes(KvDtype dtype, int block_size, int num_kv_heads, int head_dim);
// Where an int8 block's scales start (bytes from the block's start; a multiple of 4). Pools
// start on 64 bytes and every block size is a multiple of 4, so the scales are float-aligned.
size_t Int8ScalesOffset(int block_size, int num_kv_heads, int head_dim);

// One layer's paged K and V. Block b of the K pool starts at k + b * block_bytes (the same for
// V); position p of a sequence lives in block block_table[p / block_size] at offset
// p % block_size. PagedKv is how the attention kernels read it, PagedKvOut how a step writes it
// (Backend::kv_store).
template <class Byte>
struct BasicPagedKv {
  Byte* k = nullptr;
  Byte* v = nullptr;
  KvDtype dtype = KvDtype::kF32;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  size_t block_bytes = 0;
  const int32_t* block_table = nullptr;
};
using PagedKv = BasicPagedKv<const std::byte>;
using PagedKvOut = BasicPagedKv<std::byte>;

// Stores one token's (num_kv_heads, head_dim) float32 row `x` at `offset` of `block` (one block
// of one pool, KvBlockBytes long), converted to `dtype`.
void StoreKvToken(const float* x, KvDtype dtype, int block_size, int num_kv_heads, int head_dim,
                  int offset, std::byte* block);
// Reads back (dequantises) the (head_dim,) row of KV head `kv_head` at `position` of `kv`'s K
// (value = false) or V pool, as float32: what every kernel computes with.
void LoadKvRow(const PagedKv& kv, bool value, int position, int kv_head, float* out);

}  // namespace tandem::kernels
