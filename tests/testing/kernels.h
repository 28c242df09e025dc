// Kernel levels in tests. The PyTorch references (tests/golden) compute in float32, and so does
// the exact kernel level (common/kernels/cpu/kernels.h); the default level rounds activations
// (bf16, int8) and agrees with them only to that rounding. Tests that compare with a reference
// token for token or to float32 rounding run the exact level, in their own process and in the
// services they start; tests of the default level bound its distance from the reference
// separately (forward_test, perplexity_test).
#pragma once

#include <cstdlib>

#include "common/kernels/cpu/kernels.h"

namespace tandem::testing {

// Services started from now on keep their KV cache in float32, as an in-process engine's
// KvCacheConfig does by default (their --kv_dtype through the environment; the services'
// default, bf16, rounds keys and values as the default level rounds activations).
inline void Float32KvInChildren() {
  for (const char* service :
       {"TANDEM_PREFILL_KV_DTYPE", "TANDEM_DECODE_KV_DTYPE", "TANDEM_SERVE_KV_DTYPE"}) {
    setenv(service, "f32", /*overwrite=*/1);
  }
}

// Processes started from now on run the exact level (TANDEM_KERNELS=exact) with a float32 KV
// cache.
inline void ExactKernelsInChildren() {
  setenv("TANDEM_KERNELS", "exact", /*overwrite=*/1);
  Float32KvInChildren();
}

// This process and those it starts run the exact level.
inline void UseExactKernels() {
  ExactKernelsInChildren();
  kernels::cpu::SetKernelIsa("exact");
}

}  // namespace tandem::testing
