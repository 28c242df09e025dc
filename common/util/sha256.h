// SHA-256 of a file, for provenance records (which calibration text a pruning plan came from).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::util {

// Lower-case hex digest of the bytes of `path`; NOT_FOUND naming the path if it cannot be read.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

// Lower-case hex digest of `bytes`.
std::string Sha256Hex(absl::string_view bytes);

}  // namespace tandem::util
