#include "services/common/engine_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, load_format, "auto",
          "How the weights are obtained: auto or safetensors (the checkpoint), or dummy: random "
          "weights at config.json's shape, for throughput benchmarks only (needs --routing; "
          "every instance of a cluster needs the same --seed).");
ABSL_FLAG(std::string, routing, "",
          "With --load_format dummy: how tokens are routed, uniform or zipf:S (a random router "
          "says nothing about how a trained one spreads tokens); docs/benchmarks.md.");
ABSL_FLAG(uint64_t, seed, 0,
          "With --load_format dummy: the seed of the weights and of the routing; the same on "
          "every instance of a cluster, so that prefill and decode run one model.");
ABSL_FLAG(int64_t, memory_bytes, 0,
          "The memory the engine may hold, weights and KV pool together: the pool gets what the "
          "weights leave (a pruned decoder, holding only its retained experts, gets more "
          "blocks), and --kv_blocks is not used. 0: the pool has --kv_blocks blocks.");

ABSL_FLAG(bool, kv_window_rings, true,
          "Sliding-window layers keep only their window's K/V, in a ring per sequence, where the "
          "model also has whole-context layers (docs/kv-cache.md \"Sliding windows\"); false "
          "pages them over the whole context like the others, except layers of another shape "
          "than the paged ones (Gemma 4's sliding layers), which keep rings either way. Prefill "
          "and decode must agree.");

namespace tandem::serving {

absl::StatusOr<EngineFlags> ReadEngineFlags() {
  EngineFlags flags;
  absl::StatusOr<engine::LoadFormat> format =
      engine::ParseLoadFormat(absl::GetFlag(FLAGS_load_format));
  if (!format.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--load_format: ", format.status().message()));
  }
  flags.load.format = *format;
  flags.load.routing = absl::GetFlag(FLAGS_routing);
  flags.load.seed = absl::GetFlag(FLAGS_seed);
  if (absl::Status s = flags.load.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--load_format, --routing: ", s.message()));
  }
  if (flags.load.format != engine::LoadFormat::kDummy && !flags.load.routing.empty()) {
    return absl::InvalidArgumentError(
        "--routing replaces the router, for random weights only: give --load_format dummy too");
  }
  flags.window_rings = absl::GetFlag(FLAGS_kv_window_rings);
  flags.memory_bytes = absl::GetFlag(FLAGS_memory_bytes);
  if (flags.memory_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory_bytes=", flags.memory_bytes, " must be >= 0"));
  }
  return flags;
}

}  // namespace tandem::serving
