#include "common/kernels/kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/kernels.h"

namespace tandem::kernels {

size_t Int8ScalesOffset(int block_size, int num_kv_heads, int head_dim) {
  return (static_cast<size_t>(block_size) * num_kv_heads * head_dim + 3) / 4 * 4;
}

const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kBf16:
      return "bf16";
    case KvDtype::kInt8:
      return "int8";
  }
  return "unknown";
}

absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name) {
  if (name == "f32" || name == "float32") return KvDtype::kF32;
  if (name == "bf16") return KvDtype::kBf16;
  if (name == "int8") return KvDtype::kInt8;
  return absl::InvalidArgumentError(absl::StrCat("unknown KV cache dtype \"", std::string(name),
                                                 "\"; expected f32, bf16 or int8"));
}

size_t KvValueBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return 4;
    case KvDtype::kBf16:
      return 2;
    case KvDtype::kInt8:
      return 1;
  }
  return 4;
}

size_t KvBlockBytes(KvDtype dtype, int block_size, int num_kv_heads, int head_dim) {
  const size_t slots = static_cast<size_t>(block_size) * num_kv_heads;
  if (dtype != KvDtype::kInt8) return slots * head_dim * KvValueBytes(dtype);
  return Int8ScalesOffset(block_size, num_kv_heads, head_dim) + slots * sizeof(float);
}

void StoreKvToken(const float* x, KvDtype dtype, int block_size, int num_kv_heads, int head_dim,
                  int offset, std::byte* block) {
  const size_t row = static_cast<size_t>(num_kv_heads) * head_dim;
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(block + offset * row * sizeof(float), x, row * sizeof(float));
      return;
    case KvDtype::kBf16: {
      auto* out = reinterpret_cast<uint16_t*>(block) + offset * row;
      for (size_t i = 0; i < row; ++i) out[i] = cpu::F32ToBf16(x[i]);
      return;
    }
    case KvDtype::kInt8: {
      auto* out = reinterpret_cast<int8_t*>(block) + offset * row;
      float* scales =
          reinterpret_cast<float*>(block + Int8ScalesOffset(block_size, num_kv_heads, head_dim)) +
          static_cast<size_t>(offset) * num_kv_heads;
      for (int h = 0; h < num_kv_heads; ++h) {
        const float* xh = x + static_cast<size_t>(h) * head_dim;
        int8_t* qh = out + static_cast<size_t>(h) * head_dim;
        float amax = 0;
        for (int i = 0; i < head_dim; ++i) amax = std::max(amax, std::fabs(xh[i]));
        for (int i = 0; i < head_dim; ++i) amax = std::isnan(xh[i]) ? xh[i] : amax;
        if (!std::isfinite(amax)) {  // a NaN or infinity: the head reads back as NaN
          std::memset(qh, 0, head_dim);
          scales[h] = NAN;
          continue;
        }
        const float scale = amax / 127.0f;
        const float inverse = scale > 0 ? 1.0f / scale : 0.0f;
        for (int i = 0; i < head_dim; ++i) {
          qh[i] = static_cast<int8_t>(std::clamp(std::nearbyint(xh[i] * inverse), -127.0f, 127.0f));
        }
        scales[h] = scale;
      }
      return;
    }
  }
}

void LoadKvRow(const PagedKv& kv, bool value, int position, int kv_head, float* out) {
  const std::byte* block =
      (value ? kv.v : kv.k) +
      static_cast<size_t>(kv.block_table[position / kv.block_size]) * kv.block_bytes;
  const int offset = position % kv.block_size;
  const size_t row = static_cast<size_t>(kv.num_kv_heads) * kv.head_dim;
  const size_t first = offset * row + static_cast<size_t>(kv_head) * kv.head_dim;
  switch (kv.dtype) {
    case KvDtype::kF32:
      std::memcpy(out, reinterpret_cast<const float*>(block) + first, kv.head_dim * sizeof(float));
      return;
    case KvDtype::kBf16: {
      const auto* in = reinterpret_cast<const uint16_t*>(block) + first;
      for (int i = 0; i < kv.head_dim; ++i) {
        out[i] = cpu::Bf16ToF32(in[i]);
      }
      return;
    }
    case KvDtype::kInt8: {
      const auto* in = reinterpret_cast<const int8_t*>(block) + first;
      const float scale = reinterpret_cast<const float*>(
          block +
          Int8ScalesOffset(kv.block_size, kv.num_kv_heads,
                           kv.head_dim))[static_cast<size_t>(offset) * kv.num_kv_heads + kv_head];
      for (int i = 0; i < kv.head_dim; ++i) out[i] = in[i] * scale;
      return;
    }
  }
}

}  // namespace tandem::kernels
