// absl::Status <-> grpc::Status, used only at the RPC edge. Canonical codes map one to one.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace tandem::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace tandem::rpc
