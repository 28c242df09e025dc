// Reading a whole file, bounded: every loader of small files (configs, tokenizers, templates)
// reads through this.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace tandem::util {

// The bytes of `path`. NOT_FOUND when it does not exist, INVALID_ARGUMENT when it is not a
// regular file or is larger than `max_bytes`, DATA_LOSS on a read error; messages name the
// path.
absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes = size_t{1} << 30);

}  // namespace tandem::util
