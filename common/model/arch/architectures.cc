// The architecture table: one entry per model_type, each defined in its own file here.
#include "common/model/config.h"

namespace tandem::model {

const ArchitectureSpec& DeepseekArchitecture();    // deepseek.cc
const ArchitectureSpec& DeepseekV2Architecture();  // deepseek_v2.cc
const ArchitectureSpec& DeepseekV3Architecture();  // deepseek_v3.cc
const ArchitectureSpec& Gemma4Architecture();      // gemma4.cc
const ArchitectureSpec& Gemma4TextArchitecture();
const ArchitectureSpec& GptOssArchitecture();     // gpt_oss.cc
const ArchitectureSpec& Qwen2MoeArchitecture();   // qwen2_moe.cc
const ArchitectureSpec& Qwen35MoeArchitecture();  // qwen3_5_moe.cc
const ArchitectureSpec& Qwen35MoeTextArchitecture();
const ArchitectureSpec& Qwen3MoeArchitecture();  // qwen3_moe.cc

const std::vector<const ArchitectureSpec*>& Architectures() {
  static const std::vector<const ArchitectureSpec*> kAll = {
      &MixtralArchitecture(),    &Qwen2MoeArchitecture(),   &Qwen3MoeArchitecture(),
      &DeepseekArchitecture(),   &Qwen35MoeArchitecture(),  &Qwen35MoeTextArchitecture(),
      &DeepseekV2Architecture(), &DeepseekV3Architecture(), &GptOssArchitecture(),
      &Gemma4Architecture(),     &Gemma4TextArchitecture()};
  return kAll;
}

}  // namespace tandem::model
