// The single-process engine on the shipped tiny model, which tests of a cluster compare the
// cluster's greedy tokens with (tests/fault, tests/netns). Header-only: its users link
// tandem_engine themselves.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "common/engine/generator.h"
#include "common/util/status.h"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::testing {

class GreedyReference {
 public:
  // models/tiny-moe under SourceDir().
  static absl::StatusOr<std::unique_ptr<GreedyReference>> Load() {
    ASSIGN_OR_RETURN(std::unique_ptr<engine::Generator> generator,
                     engine::Generator::Load(*OpenModelDir(SourceDir() + "/models/tiny-moe")));
    return std::unique_ptr<GreedyReference>(new GreedyReference(std::move(generator)));
  }

  // For a suite's SetUpTestSuite: loaded, or null with the error as a test failure.
  static GreedyReference* LoadOrFail() {
    absl::StatusOr<std::unique_ptr<GreedyReference>> reference = Load();
    if (!reference.ok()) {
      ADD_FAILURE() << "cannot load the reference engine: " << reference.status();
      return nullptr;
    }
    return reference->release();
  }

  // The greedy tokens of `prompt` (max_tokens of them: end of sequence ignored); empty, with
  // the error as a test failure, when generation fails.
  std::vector<int32_t> Tokens(const std::string& prompt, int max_tokens) const {
    engine::SamplingParams params;
    params.temperature = 0;
    params.max_tokens = max_tokens;
    params.ignore_eos = true;
    auto result = generator_->Generate(prompt, params);
    if (!result.ok()) {
      ADD_FAILURE() << "the reference engine failed: " << result.status();
      return {};
    }
    return result->output_ids;
  }

 private:
  explicit GreedyReference(std::unique_ptr<engine::Generator> generator)
      : generator_(std::move(generator)) {}
  std::unique_ptr<engine::Generator> generator_;
};

}  // namespace tandem::testing
