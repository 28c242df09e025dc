#include "common/util/file.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace tandem::util {

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (status.type() == std::filesystem::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  if (error) return absl::NotFoundError(absl::StrCat(path, ": ", error.message()));
  if (status.type() != std::filesystem::file_type::regular) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  const uintmax_t size = std::filesystem::file_size(path, error);
  if (!error && size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " has ", size, " bytes, more than the ", max_bytes, " allowed"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string text;
  text.resize(static_cast<size_t>(error ? 0 : size));
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  text.resize(static_cast<size_t>(in.gcount()));
  // A file that grew since its size was taken (or whose size is unknown): the rest, bounded.
  char buffer[65536];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > max_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is larger than the ", max_bytes, " bytes allowed"));
    }
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return text;
}

}  // namespace tandem::util
