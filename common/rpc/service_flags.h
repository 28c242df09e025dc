// Flags every Tandem service has (host, ports, port file, drain, log level), defined once
// here; a service's own flags live in its main.cc.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/config/config.h"
#include "common/rpc/service_runner.h"

namespace tandem::rpc {

// Source path fragment of the shared flags, for config::ProgramInfo::flag_sources.
inline constexpr char kServiceFlagsSource[] = "common/rpc/service_flags.cc";

// Reads the shared flags (after config::ParseFlags) into options, applies --log_level, and
// checks the values.
absl::StatusOr<ServiceOptions> ServiceOptionsFromFlags(const std::string& name);

// ParseFlags + ServiceOptionsFromFlags + BlockShutdownSignals for a service's main(); prints
// the error and exits with status 2 on bad configuration.
ServiceOptions InitService(int argc, char** argv, const config::ProgramInfo& program);

}  // namespace tandem::rpc
