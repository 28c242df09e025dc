// The `tandem` commands kept in files of their own, and what they share with main.cc.
#pragma once

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, text);
ABSL_DECLARE_FLAG(std::string, plan);
ABSL_DECLARE_FLAG(std::string, overlay);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(int, max_tokens);
ABSL_DECLARE_FLAG(std::string, stats);
ABSL_DECLARE_FLAG(std::string, endpoint);
ABSL_DECLARE_FLAG(int64_t, seed);
ABSL_DECLARE_FLAG(double, timeout_s);

namespace tandem::cli {

// Prints `status` to stderr; the exit code (2 for INVALID_ARGUMENT, else 1).
int Report(const absl::Status& status);

// tandem eval (eval.cc).
int Eval();
// tandem reorder, tandem tier and tandem pack (mixed_width.cc).
int Reorder();
int Tier();
int Pack();
// tandem quantize (quantize.cc).
int Quantize();
// tandem bench serve (bench_serve.cc).
int BenchServe();

}  // namespace tandem::cli
