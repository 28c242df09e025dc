// A backend that times every op of another, for tandem_engine_bench's per-op timeline of a
// decode step: each call runs the inner table's op and adds its wall time (and, for the
// products, the weight bytes they read) to that op's totals. Ops the engine calls from its
// worker threads (attention's items, the DeltaNet's convolution slices and heads) add each
// thread's time, so theirs is thread time, not step time; the table says which those are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/kernels/backend.h"

namespace tandem::bench {

struct OpTime {
  std::string name;
  int64_t calls = 0;
  double seconds = 0;
  int64_t bytes = 0;        // weight bytes read (linear, linear_f32)
  bool in_workers = false;  // called from the engine's worker threads (thread time)
};

// The timing table over `inner`; one inner table at a time (a second call re-targets it).
const kernels::Backend& TimedBackend(const kernels::Backend& inner);
// The totals since the last reset, of the ops called at least once, in table order.
std::vector<OpTime> OpTimes();
void ResetOpTimes();

}  // namespace tandem::bench
