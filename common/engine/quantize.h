// Quantized checkpoints (tandem quantize; docs/quantization.md): a bf16 / f16 / f32 Hugging Face
// checkpoint written again with the chosen matrices as integer levels and float16 scales, one
// per `group_size` input columns per row (by default the largest of 128, 64 and 32 that divides
// every quantized matrix's input width: groups of 128, GPTQ's and AWQ's default, keep a prompt's
// products on AMX tiles above bf16's speed, docs/quantization.md), in a layout any reader can
// follow:
//   NAME.weight        I8 (rows, cols), levels in [-127, 127]          (8 bits)
//                      U8 (rows, cols / 2), two levels a byte, the even column in the low
//                      nibble, each stored as level + 8, levels in [-8, 7]   (4 bits)
//   NAME.weight_scale  F16 (rows, cols / group_size)
//   W[r][c] = scale[r][c / group_size] * level[r][c]
// and config.json's "quantization_config" saying so (common/model/config.h). Routers, the
// embedding, norms and biases stay as they were, and so does the lm_head unless asked for (at
// its own bits if `lm_head_bits` says so: "lm_head_bits" in the config). The
// checkpoint's other files are copied; its safetensors metadata is kept (a reordered checkpoint
// stays reordered), and the quantization and the source checkpoint's SHA-256 are added to it.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::engine {

struct QuantizeOptions {
  int bits = 4;        // 8 or 4
  int group_size = 0;  // 32, 64 or 128; 0: the largest of them that divides every width
  bool experts = true;
  bool attention = true;
  bool shared_expert = true;
  bool dense_mlp = true;
  bool lm_head = false;  // an untied model's output projection
  int lm_head_bits = 0;  // the lm_head's own bits, 8 or 4 (0: `bits`)
};

// Writes the quantized copy of `model_dir` to `out_dir`. INVALID_ARGUMENT for a checkpoint that
// is already quantized, options that do not fit the model (a group that does not divide a
// quantized matrix's width, or none of 128, 64 and 32 does), no module chosen, lm_head_bits
// without the lm_head, or `out_dir` the same as `model_dir`. Returns the group size written.
absl::StatusOr<int> QuantizeCheckpoint(const std::string& model_dir, const QuantizeOptions& options,
                                       const std::string& out_dir);

}  // namespace tandem::engine
