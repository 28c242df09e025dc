// The internal APIs' shared secret (prefill's and decode's gRPC services): every call must
// carry "authorization: Bearer <secret>", which the gateway adds. With mutual TLS it is a
// second factor; without TLS it is what keeps anyone who can reach the port from calling in
// (docs/security.md: it is then readable on the wire).
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::rpc {

inline constexpr char kAuthorizationHeader[] = "authorization";

class InternalAuth {
 public:
  // An empty secret checks nothing.
  explicit InternalAuth(std::string secret = "") : secret_(std::move(secret)) {}
  bool enabled() const { return !secret_.empty(); }
  // OK, or UNAUTHENTICATED when the call does not carry the secret.
  absl::Status Check(const grpc::CallbackServerContext& context) const;
  // The metadata a client adds to its calls.
  std::string HeaderValue() const { return "Bearer " + secret_; }

 private:
  std::string secret_;
};

// Reads a secret from `path` (its first line, without the line end). INVALID_ARGUMENT when it
// cannot be read or is shorter than 16 bytes.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

}  // namespace tandem::rpc
