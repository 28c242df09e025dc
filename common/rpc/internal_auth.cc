#include "common/rpc/internal_auth.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace tandem::rpc {
namespace {

// Compares in time that depends on the lengths only, not on where the first difference is.
bool SameSecret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace

absl::Status InternalAuth::Check(const grpc::CallbackServerContext& context) const {
  if (secret_.empty()) return absl::OkStatus();
  const std::string expected = HeaderValue();
  auto [begin, end] = context.client_metadata().equal_range(kAuthorizationHeader);
  for (auto it = begin; it != end; ++it) {
    if (SameSecret(std::string_view(it->second.data(), it->second.size()), expected)) {
      return absl::OkStatus();
    }
  }
  return absl::UnauthenticatedError(
      "this internal API takes calls only with the cluster's shared secret "
      "(--internal_secret_file)");
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  std::ifstream in(path);
  std::string secret;
  if (!in || !std::getline(in, secret)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read the secret"));
  }
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  if (secret.size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": a secret needs at least 16 bytes"));
  }
  for (char c : secret) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": the secret must be printable ASCII without spaces"));
    }
  }
  return secret;
}

}  // namespace tandem::rpc
