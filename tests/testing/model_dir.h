// A model directory a test reads (the shipped models, or a copy it made): opened, or the test
// binary stops saying why — every case after it would fail for the same reason.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/model/model_dir.h"

namespace tandem::testing {

inline std::unique_ptr<model::ModelDir> OpenModelDir(const std::string& path) {
  absl::StatusOr<std::unique_ptr<model::ModelDir>> dir = model::ModelDir::Open(path);
  if (!dir.ok()) {
    std::fprintf(stderr, "cannot open the model directory %s: %s\n", path.c_str(),
                 std::string(dir.status().message()).c_str());
    std::abort();
  }
  return *std::move(dir);
}

}  // namespace tandem::testing
