// The gRPC form of an output constraint (tandem.v1.StructuredOutput) and the engine's.
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "common/structured/constraint.h"
#include "tandem/v1/gateway.pb.h"

namespace tandem::serving {

// The constraint `proto` states; nullopt when it states none. INVALID_ARGUMENT for an empty
// json_schema or regex, or json_object false.
absl::StatusOr<std::optional<structured::OutputConstraint>> ConstraintFromProto(
    const tandem::v1::StructuredOutput& proto);

// ConstraintFromProto, then compiled once to check it (what the gateway does before anything
// runs). INVALID_ARGUMENT naming what is wrong.
absl::Status CheckConstraint(const tandem::v1::StructuredOutput& proto);

}  // namespace tandem::serving
