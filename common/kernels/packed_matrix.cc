#include "common/kernels/packed_matrix.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "common/kernels/cpu/thread_pool.h"

namespace tandem::kernels {
namespace {

constexpr int kScaleBytes = kPanelRows * 2;  // one float16 per row of a panel

uint16_t Bf16At(const uint16_t* w, int64_t ld, const PanelLayout& layout, int r, int c) {
  return r < layout.rows && c < layout.cols ? w[r * ld + c] : 0;
}

// Panels [begin, end) of a matrix, on the kernels' threads when there are many.
template <typename Fn>
void ForPanels(const PanelLayout& layout, Fn&& fn) {
  cpu::DefaultThreadPool().ParallelFor(
      layout.panels(),
      std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, layout.panel_bytes())),
      [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) fn(static_cast<int>(p));
      });
}

// Sum of squared errors of w (n,) quantized with `scale` to [lo, hi]; the levels go to q.
double QuantizeGroup(const float* w, int n, float scale, int lo, int hi, int8_t* q) {
  double error = 0;
  for (int i = 0; i < n; ++i) {
    int level = 0;
    if (scale != 0.0f) {
      level = static_cast<int>(std::nearbyint(w[i] / scale));
      level = std::clamp(level, lo, hi);
    }
    q[i] = static_cast<int8_t>(level);
    const double diff = double{w[i]} - double{scale} * level;
    error += diff * diff;
  }
  return error;
}

float RoundToF16(float v) { return F16ToF32(F32ToF16(std::clamp(v, -65504.0f, 65504.0f))); }

}  // namespace

const char* WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kBf16:
      return "bf16";
    case WeightFormat::kInt8:
      return "int8";
    case WeightFormat::kInt4:
      return "int4";
  }
  return "?";
}

int WeightFormatBits(WeightFormat format) {
  switch (format) {
    case WeightFormat::kBf16:
      return 16;
    case WeightFormat::kInt8:
      return 8;
    case WeightFormat::kInt4:
      return 4;
  }
  return 0;
}

bool ValidGroup(int group) { return group == 32 || group == 64 || group == 128; }

int64_t PanelLayout::group_bytes() const {
  return int64_t{kPanelRows} * group * WeightFormatBits(format) / 8;
}

int64_t PanelLayout::scale_offset() const {
  if (format == WeightFormat::kBf16) return panel_bytes();
  return group_bytes() * groups();
}

int64_t PanelLayout::panel_bytes() const {
  if (format == WeightFormat::kBf16) return int64_t{kChunkBytes} * ((cols + 1) / 2);
  return (group_bytes() + kScaleBytes) * groups();
}

std::string PanelLayout::Check() const {
  if (rows <= 0 || cols <= 0) return "a packed matrix needs positive rows and columns";
  if (format == WeightFormat::kBf16) return "";
  if (!ValidGroup(group)) return "the quantization group must be 32, 64 or 128";
  if (cols % group != 0) return "the columns of a quantized matrix must be a multiple of its group";
  return "";
}

int64_t PackedMatrix::bytes_read() const {
  const int64_t panels = (rows + kPanelRows - 1) / kPanelRows;
  if (format == WeightFormat::kBf16) return panels * kChunkBytes * ((cols + 1) / 2);
  const int64_t group_bytes = int64_t{kPanelRows} * group * WeightFormatBits(format) / 8;
  return panels * (cols / group) * (group_bytes + kScaleBytes);
}

PackedMatrix View(const PanelLayout& layout, const std::byte* bytes, int rows, int cols) {
  return {.format = layout.format,
          .rows = rows,
          .cols = cols,
          .group = layout.group,
          .data = bytes,
          .panel_bytes = layout.panel_bytes(),
          .scale_offset = layout.scale_offset()};
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  const uint32_t bits =
      exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112) << 23) | (mant << 13);
  return std::bit_cast<float>(bits);
}

uint16_t F32ToF16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const float a = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (a < 6.103515625e-05f) {                // subnormal (or zero): a multiple of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  const uint32_t abs_bits = bits & 0x7fffffffu;
  const uint32_t exp = (abs_bits >> 23) - 127 + 15;
  const uint32_t mant = abs_bits & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent
  return sign | static_cast<uint16_t>(h);
}

float PackedElement(const PackedMatrix& w, int r, int c) {
  const std::byte* panel = w.data + (r / kPanelRows) * w.panel_bytes;
  const int i = r % kPanelRows;
  if (w.format == WeightFormat::kBf16) {
    uint16_t bits;
    std::memcpy(&bits, panel + (c / 2) * kChunkBytes + i * 4 + (c % 2) * 2, 2);
    return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
  }
  const int g = c / w.group;
  const int k = c % w.group;
  uint16_t scale_bits;
  std::memcpy(&scale_bits, panel + w.scale_offset + g * kScaleBytes + i * 2, 2);
  const float scale = F16ToF32(scale_bits);
  const int64_t group_bytes = int64_t{kPanelRows} * w.group * WeightFormatBits(w.format) / 8;
  const std::byte* values = panel + g * group_bytes;
  int q;
  if (w.format == WeightFormat::kInt8) {
    q = static_cast<int>(values[(k / 4) * kChunkBytes + i * 4 + k % 4]) - 128;
  } else {
    const int byte = static_cast<int>(values[(k / 8) * kChunkBytes + i * 4 + k % 4]);
    q = ((k % 8) < 4 ? byte & 0xf : byte >> 4) - 8;
  }
  return scale * static_cast<float>(q);
}

void PackBf16(const uint16_t* w, int64_t ld, const PanelLayout& layout, std::byte* out) {
  const int pairs = (layout.cols + 1) / 2;
  ForPanels(layout, [&](int p) {
    auto* panel = reinterpret_cast<uint16_t*>(out + p * layout.panel_bytes());
    for (int j = 0; j < pairs; ++j) {
      uint16_t* chunk = panel + j * (kChunkBytes / 2);
      for (int i = 0; i < kPanelRows; ++i) {
        const int r = p * kPanelRows + i;
        chunk[2 * i] = Bf16At(w, ld, layout, r, 2 * j);
        chunk[2 * i + 1] = Bf16At(w, ld, layout, r, 2 * j + 1);
      }
    }
  });
}

QuantizedRows QuantizeRows(const float* w, int64_t ld, int rows, int cols, WeightFormat format,
                           int group) {
  QuantizedRows out;
  out.format = format;
  out.rows = rows;
  out.cols = cols;
  out.group = group;
  const int groups = cols / group;
  out.q.resize(static_cast<size_t>(rows) * cols);
  out.scales.resize(static_cast<size_t>(rows) * groups);
  cpu::DefaultThreadPool().ParallelFor(rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<int8_t> trial(group);
    for (int64_t r = begin; r < end; ++r) {
      for (int g = 0; g < groups; ++g) {
        const float* values = w + r * ld + int64_t{g} * group;
        int8_t* q = out.q.data() + r * cols + int64_t{g} * group;
        float extreme = 0;  // the value of largest magnitude, with its sign
        for (int i = 0; i < group; ++i) {
          if (std::fabs(values[i]) > std::fabs(extreme)) extreme = values[i];
        }
        float scale = 0;
        if (format == WeightFormat::kInt8) {
          scale = RoundToF16(std::fabs(extreme) / 127.0f);
          QuantizeGroup(values, group, scale, -127, 127, q);
        } else if (extreme != 0.0f) {
          double best = INFINITY;
          auto consider = [&](float candidate) {
            candidate = RoundToF16(candidate);
            const double error = QuantizeGroup(values, group, candidate, -8, 7, trial.data());
            if (error < best) {
              best = error;
              scale = candidate;
              std::copy(trial.begin(), trial.end(), q);
            }
          };
          for (int step = 0; step <= 16; ++step) {
            const float s = 6.5f + 0.125f * static_cast<float>(step);
            consider(extreme / s);   // the extreme near +s (clipped to 7)
            consider(-extreme / s);  // the extreme near -s (the -8 level)
          }
          // The least-squares scale for the levels of the best candidate, if it does better.
          double wq = 0, qq = 0;
          for (int i = 0; i < group; ++i) {
            wq += double{values[i]} * q[i];
            qq += static_cast<double>(q[i]) * q[i];
          }
          if (qq > 0) consider(static_cast<float>(wq / qq));
        }
        out.scales[r * groups + g] = F32ToF16(scale);
        if (scale == 0.0f) std::fill(q, q + group, 0);
      }
    }
  });
  return out;
}

void PackQuantized(const QuantizedRows& q, const PanelLayout& layout, std::byte* out) {
  const int groups = layout.groups();
  const int64_t group_bytes = layout.group_bytes();
  const bool int4 = layout.format == WeightFormat::kInt4;
  const int values_per_chunk = int4 ? 8 : 4;
  ForPanels(layout, [&](int p) {
    std::byte* panel = out + p * layout.panel_bytes();
    for (int g = 0; g < groups; ++g) {
      auto* values = reinterpret_cast<uint8_t*>(panel + g * group_bytes);
      for (int chunk = 0; chunk < layout.group / values_per_chunk; ++chunk) {
        uint8_t* bytes = values + chunk * kChunkBytes;
        for (int i = 0; i < kPanelRows; ++i) {
          const int r = p * kPanelRows + i;
          for (int j = 0; j < 4; ++j) {
            const int c = g * layout.group + chunk * values_per_chunk + j;
            auto level = [&](int col) {
              return r < q.rows ? int{q.q[int64_t{r} * q.cols + col]} : 0;
            };
            bytes[i * 4 + j] =
                int4 ? static_cast<uint8_t>((level(c) + 8) | ((level(c + 4) + 8) << 4))
                     : static_cast<uint8_t>(level(c) + 128);
          }
        }
      }
      auto* scales = reinterpret_cast<uint16_t*>(panel + layout.scale_offset() + g * kScaleBytes);
      for (int i = 0; i < kPanelRows; ++i) {
        const int r = p * kPanelRows + i;
        scales[i] = r < q.rows ? q.scales[int64_t{r} * groups + g] : 0;
      }
    }
  });
}

void QuantizeActivations(const float* x, int cols, int group, int8_t* q, float* scales,
                         int32_t* sums) {
  for (int g = 0; g < cols / group; ++g) {
    const float* v = x + int64_t{g} * group;
    float amax = 0;
    for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < group; ++i) {
      const int level = std::clamp(static_cast<int>(std::nearbyint(v[i] * inv)), -127, 127);
      q[int64_t{g} * group + i] = static_cast<int8_t>(level);
      sum += level;
    }
    scales[g] = amax / 127.0f;
    sums[g] = sum;
  }
}

void PackNibbles(const int8_t* q, int64_t count, uint8_t* out) {
  for (int64_t i = 0; i + 1 < count; i += 2) {
    out[i / 2] = static_cast<uint8_t>((q[i] + 8) | ((q[i + 1] + 8) << 4));
  }
}

void UnpackNibbles(const uint8_t* packed, int64_t count, int8_t* q) {
  for (int64_t i = 0; i + 1 < count; i += 2) {
    q[i] = static_cast<int8_t>((packed[i / 2] & 0xf) - 8);
    q[i + 1] = static_cast<int8_t>((packed[i / 2] >> 4) - 8);
  }
}

}  // namespace tandem::kernels
