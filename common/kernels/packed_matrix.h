// Weight matrices in the layout the matrix products read ("panels"), in bf16, int8 or int4, and
// the group-wise quantization that makes the integer formats. Backend-neutral: every level of
// the CPU backend reads the same bytes, and a width-k prefix of the columns is read through the
// same panels (an expert's down projection run at width k).
//
// W (rows, cols) is a linear layer's weight, one row per output feature (Hugging Face's
// (out_features, in_features)). Rows go in panels of kPanelRows = 16, the last padded with zero
// rows. Within a panel the values are interleaved so that one 64-byte chunk holds a few
// consecutive columns of all 16 rows: the operand of one dot-product instruction (vdpbf16ps,
// vpdpbusd) against a broadcast activation, and one row of an AMX B tile.
//
//   bf16  per panel, for each column pair (2j, 2j+1): 16 rows x 2 values, row-major (64 bytes);
//         an odd column count is padded with a zero column.
//   int8  per panel, for each group of `group` columns: group/4 chunks of 16 rows x 4 values
//         (64 bytes), each value stored as q + 128 (a byte), q in [-127, 127]; after every
//         group's values, the panel's scales: per group 16 float16 (32 bytes).
//         W[r][c] = scale[r][c / group] * q[r][c].
//   int4  as int8, with group/8 chunks per group: chunk j holds columns 8j..8j+3 in its low
//         nibbles and 8j+4..8j+7 in its high nibbles, each as q + 8, q in [-8, 7].
//
// A quantized matrix's columns are a multiple of its group (32, 64 or 128), and a prefix of
// its columns must be too; a bf16 prefix may have any length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::kernels {

inline constexpr int kPanelRows = 16;
inline constexpr int kChunkBytes = 64;

enum class WeightFormat : uint8_t { kBf16, kInt8, kInt4 };

// "bf16", "int8", "int4".
const char* WeightFormatName(WeightFormat format);
// Bits per stored value (16, 8, 4).
int WeightFormatBits(WeightFormat format);
// Whether `group` is a supported quantization group (32, 64, 128).
bool ValidGroup(int group);

// The byte layout of one packed matrix.
struct PanelLayout {
  WeightFormat format = WeightFormat::kBf16;
  int rows = 0;
  int cols = 0;
  int group = 0;  // int8/int4 only

  int panels() const { return (rows + kPanelRows - 1) / kPanelRows; }
  int groups() const { return group > 0 ? cols / group : 0; }
  // Bytes of one group's values in a panel (int8/int4).
  int64_t group_bytes() const;
  // Bytes from a panel's start to its scales (int8/int4; for bf16 the whole panel).
  int64_t scale_offset() const;
  int64_t panel_bytes() const;
  int64_t bytes() const { return panel_bytes() * panels(); }
  // Empty when the layout is valid (positive sizes; a quantized format's group supported and
  // dividing cols); otherwise what is wrong.
  std::string Check() const;
};

// A read-only view of a packed matrix for the matrix products: the first `rows` rows and
// `cols` columns of a layout whose panels are `panel_bytes` apart (its own, or a wider
// matrix's: a column prefix).
struct PackedMatrix {
  WeightFormat format = WeightFormat::kBf16;
  int rows = 0;
  int cols = 0;
  int group = 0;
  const std::byte* data = nullptr;  // panel 0
  int64_t panel_bytes = 0;
  int64_t scale_offset = 0;  // int8/int4: from a panel's start to its scales

  // Bytes a product over this view reads: the rows' panels (whole) over the columns read.
  int64_t bytes_read() const;
};

// The view of `bytes` (laid out as `layout`) over its first `rows` rows and `cols` columns.
PackedMatrix View(const PanelLayout& layout, const std::byte* bytes, int rows, int cols);
inline PackedMatrix View(const PanelLayout& layout, const std::byte* bytes) {
  return View(layout, bytes, layout.rows, layout.cols);
}

// float16 <-> float32 (round to nearest even; overflow to infinity).
float F16ToF32(uint16_t bits);
uint16_t F32ToF16(float value);

// W[r][c] as a float (dequantized).
float PackedElement(const PackedMatrix& w, int r, int c);

// Packs a row-major bf16 matrix (rows, cols), rows `ld` elements apart, into `out`
// (layout.bytes() bytes, layout.format kBf16).
void PackBf16(const uint16_t* w, int64_t ld, const PanelLayout& layout, std::byte* out);

// A group-wise symmetric quantization of a row-major matrix, as stored in a checkpoint:
// q (rows, cols) in the format's range and scales (rows, cols / group) as float16 bits.
struct QuantizedRows {
  WeightFormat format = WeightFormat::kInt8;
  int rows = 0;
  int cols = 0;
  int group = 0;
  std::vector<int8_t> q;         // (rows, cols)
  std::vector<uint16_t> scales;  // (rows, cols / group) float16
};

// Quantizes w (rows, cols), rows `ld` apart, to `format` with one scale per `group` columns.
// int8: scale = max|w| / 127 (rounded to float16), q = round(w / scale). int4: the scale with
// the least squared error among max|w| / s for s on a grid over [6.5, 8.5] in both signs (the
// extreme value mapped to -8 or to 7) and the least-squares scale for the levels chosen; q in
// [-8, 7]. Every q is computed against the float16-rounded scale.
QuantizedRows QuantizeRows(const float* w, int64_t ld, int rows, int cols, WeightFormat format,
                           int group);

// Packs quantized rows into `out` (layout.bytes() bytes; layout matches q's shape and format).
void PackQuantized(const QuantizedRows& q, const PanelLayout& layout, std::byte* out);

// How the integer kernels quantize activations, per row and per `group` columns (the weight's
// group), symmetrically: scale = max|x| / 127 and q = round(x * (127 / max|x|)) to nearest even;
// all zero when max|x| is 0. Fills q (cols,), scales (cols / group,) and sums (cols / group,),
// the sum of each group's q (the fast kernels subtract the weights' offset with it). Every
// level computes exactly these values.
void QuantizeActivations(const float* x, int cols, int group, int8_t* q, float* scales,
                         int32_t* sums);

// int4 values as a checkpoint stores them: byte i of a row holds q[2i] + 8 in its low nibble and
// q[2i + 1] + 8 in its high nibble. `cols` is even.
void PackNibbles(const int8_t* q, int64_t count, uint8_t* out);
void UnpackNibbles(const uint8_t* packed, int64_t count, int8_t* q);

}  // namespace tandem::kernels
