// tandem quantize --model DIR --bits 8|4 --out DIR2 [--group_size G] [--modules M,...]
//                  [--lm_head_bits 8|4]
//   DIR's checkpoint with the chosen matrices as integer levels and float16 scales
//   (common/engine/quantize.h, docs/quantization.md).
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/engine/quantize.h"
#include "common/util/clock.h"
#include "tools/cli/commands.h"

ABSL_FLAG(int, bits, 4, "quantize: bits per weight, 8 or 4.");
ABSL_FLAG(int, group_size, 0,
          "quantize: input columns per float16 scale, 32, 64 or 128; each quantized matrix's "
          "width must be a multiple. 0: the largest of them that divides every width (128 keeps "
          "prompts on AMX faster than bf16; 32 is llama.cpp's Q4_0 / Q8_0 block).");
ABSL_FLAG(std::string, modules, "experts,attention,shared_expert,dense_mlp",
          "quantize: which matrices, comma-separated: experts (routed experts), attention (q, "
          "k, v, o), shared_expert, dense_mlp, lm_head (an untied output projection). Routers, "
          "the embedding and norms never.");

ABSL_FLAG(int, lm_head_bits, 0,
          "quantize: the lm_head's own bits, 8 or 4, when --modules names it (0: --bits); "
          "llama.cpp keeps a 4-bit model's output matrix at 6 bits.");

namespace tandem::cli {

int Quantize() {
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (model.empty() || out.empty()) {
    return Report(absl::InvalidArgumentError("quantize needs --model DIR and --out DIR"));
  }
  engine::QuantizeOptions options{.bits = absl::GetFlag(FLAGS_bits),
                                  .group_size = absl::GetFlag(FLAGS_group_size),
                                  .experts = false,
                                  .attention = false,
                                  .shared_expert = false,
                                  .dense_mlp = false,
                                  .lm_head = false,
                                  .lm_head_bits = absl::GetFlag(FLAGS_lm_head_bits)};
  for (absl::string_view module :
       absl::StrSplit(absl::GetFlag(FLAGS_modules), ',', absl::SkipWhitespace())) {
    if (module == "experts") {
      options.experts = true;
    } else if (module == "attention") {
      options.attention = true;
    } else if (module == "shared_expert") {
      options.shared_expert = true;
    } else if (module == "dense_mlp") {
      options.dense_mlp = true;
    } else if (module == "lm_head") {
      options.lm_head = true;
    } else {
      return Report(absl::InvalidArgumentError(
          absl::StrCat("--modules: unknown module \"", module,
                       "\" (known: experts, attention, shared_expert, dense_mlp, lm_head)")));
    }
  }
  const util::Instant start = util::Instant::Now();
  absl::StatusOr<int> group_size = engine::QuantizeCheckpoint(model, options, out);
  if (!group_size.ok()) return Report(group_size.status());
  std::cout << "int" << options.bits << " in groups of " << *group_size << " ("
            << absl::GetFlag(FLAGS_modules) << "); checkpoint in " << out << " ("
            << absl::ToDoubleSeconds(util::Since(start)) << " s)" << std::endl;
  return 0;
}

}  // namespace tandem::cli
