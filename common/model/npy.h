// NumPy .npy arrays (format versions 1.0, 2.0 and 3.0), the format of Tandem's golden
// reference data, which is written by numpy's np.save. Only little-endian '<f4', '<f8', '<i4'
// and '<i8' in C order are accepted; anything else, and any malformed or truncated file, is an
// INVALID_ARGUMENT, never a crash. The writer produces what np.save would for the same array.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem::model {

struct NpyArray {
  std::string dtype;            // numpy descr: "<f4", "<f8", "<i4" or "<i8"
  std::vector<int64_t> shape;   // C order; empty for a 0-d (scalar) array
  std::vector<std::byte> data;  // num_elements() little-endian elements

  int64_t num_elements() const;  // product(shape); 1 for a scalar

  // The elements converted to the requested type. Integers convert to floats freely (large
  // int64 values round); floats convert to integers only when every value is integral and in
  // range; integers narrow only when in range. Otherwise INVALID_ARGUMENT.
  absl::StatusOr<std::vector<float>> AsFloat32() const;
  absl::StatusOr<std::vector<double>> AsFloat64() const;
  absl::StatusOr<std::vector<int32_t>> AsInt32() const;
  absl::StatusOr<std::vector<int64_t>> AsInt64() const;
};

// Builds an array of the matching dtype; INVALID_ARGUMENT when product(shape) != values.size()
// or a dimension is negative.
absl::StatusOr<NpyArray> MakeNpy(std::vector<int64_t> shape, absl::Span<const float> values);
absl::StatusOr<NpyArray> MakeNpy(std::vector<int64_t> shape, absl::Span<const double> values);
absl::StatusOr<NpyArray> MakeNpy(std::vector<int64_t> shape, absl::Span<const int32_t> values);
absl::StatusOr<NpyArray> MakeNpy(std::vector<int64_t> shape, absl::Span<const int64_t> values);

// Parses the bytes of a .npy file.
absl::StatusOr<NpyArray> ParseNpy(std::string_view bytes);
// Reads a .npy file; NOT_FOUND when it does not exist.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// The bytes of a .npy file holding `array` (version 1.0, or 2.0 when the header needs it).
absl::StatusOr<std::string> SerializeNpy(const NpyArray& array);
absl::Status WriteNpy(const std::string& path, const NpyArray& array);

}  // namespace tandem::model
