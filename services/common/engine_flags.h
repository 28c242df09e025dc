// The flags every service that runs an engine shares (tandem-prefill, tandem-decode,
// tandem-serve): how its weights are obtained and how much memory the engine may hold.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/engine/generator.h"

namespace tandem::serving {

// Source path fragment of these flags, for config::ProgramInfo::flag_sources.
inline constexpr char kEngineFlagsSource[] = "services/common/engine_flags.cc";

struct EngineFlags {
  engine::LoadOptions load;  // --load_format, --routing, --seed
  int64_t memory_bytes = 0;  // --memory_bytes; 0: the KV pool is sized by --kv_blocks
  bool window_rings = true;  // --kv_window_rings
};

// --load_format, --routing, --seed, --memory_bytes and --kv_window_rings. INVALID_ARGUMENT naming
// the flag: an unknown format, dummy weights without a routing, a routing for a real checkpoint (it
// would replace the trained router), a negative memory bound.
absl::StatusOr<EngineFlags> ReadEngineFlags();

}  // namespace tandem::serving
