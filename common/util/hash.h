// Small deterministic hashes for seeded, reproducible pseudo-randomness.
#pragma once

#include <cstdint>

namespace tandem::util {

// SplitMix64's finaliser: a well-mixed 64-bit hash of `x` (and the step of a SplitMix64
// generator when called on a counter).
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace tandem::util
