#include "common/engine/model_weights.h"

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/kernels.h"
#include "common/kernels/cpu/thread_pool.h"
#include "common/util/hash.h"
#include "common/util/status.h"

namespace tandem::engine {
namespace {

using kernels::cpu::Bf16ToF32;
using kernels::cpu::F32ToBf16;
using model::DType;
using model::TensorKind;

float HalfToF32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  const uint32_t bits =
      exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112) << 23) | (mant << 13);
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

// Element i of a tensor as float32; `data` may be unaligned, so it is read with memcpy.
float ElementAsF32(const model::TensorView& view, int64_t i) {
  switch (view.dtype) {
    case DType::kBF16: {
      uint16_t bits;
      std::memcpy(&bits, view.data + i * 2, 2);
      return Bf16ToF32(bits);
    }
    case DType::kF16: {
      uint16_t bits;
      std::memcpy(&bits, view.data + i * 2, 2);
      return HalfToF32(bits);
    }
    case DType::kF32: {
      float v;
      std::memcpy(&v, view.data + i * 4, 4);
      return v;
    }
  }
  return 0.0f;
}

absl::StatusOr<model::TensorView> Get(const model::SafetensorsModel& checkpoint,
                                      const model::ModelConfig& config, TensorKind kind,
                                      int layer = -1, int expert = -1) {
  return checkpoint.Get(model::TensorName(*config.arch, kind, layer, expert));
}

absl::StatusOr<Bf16Matrix> LoadMatrix(const model::SafetensorsModel& checkpoint,
                                      const model::ModelConfig& config, TensorKind kind,
                                      int layer = -1, int expert = -1) {
  ASSIGN_OR_RETURN(model::TensorView view, Get(checkpoint, config, kind, layer, expert));
  return MatrixFromTensor(view);
}

absl::StatusOr<std::vector<float>> LoadVector(const model::SafetensorsModel& checkpoint,
                                              const model::ModelConfig& config, TensorKind kind,
                                              int layer = -1) {
  ASSIGN_OR_RETURN(model::TensorView view, Get(checkpoint, config, kind, layer));
  return VectorFromTensor(view);
}

using util::SplitMix64;

// Weights uniform in [-a, a], a = 0.02 * sqrt(3) (standard deviation 0.02), each hashed from
// (seed, matrix, index): a multi-gigabyte dummy model fills in seconds on every core, and the
// values do not depend on the thread count.
class RandomFill {
 public:
  explicit RandomFill(uint64_t seed) : seed_(seed) {}

  Bf16Matrix Matrix(int rows, int cols) {
    Bf16Matrix m;
    m.rows = rows;
    m.cols = cols;
    m.data.resize(static_cast<size_t>(rows) * cols);
    const uint64_t key = SplitMix64(seed_ ^ SplitMix64(++matrices_));
    constexpr float kHalfWidth = 0.02f * 1.7320508f;
    kernels::cpu::DefaultThreadPool().ParallelFor(
        static_cast<int64_t>(m.data.size()), 1 << 16, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            const uint64_t bits = SplitMix64(key + static_cast<uint64_t>(i));
            const float u = static_cast<float>(bits >> 40) * 0x1p-24f;  // [0, 1)
            m.data[i] = F32ToBf16((2.0f * u - 1.0f) * kHalfWidth);
          }
        });
    return m;
  }
  // Passes over one matrix, so those after it come out as if it had been made.
  void Skip() { ++matrices_; }

 private:
  const uint64_t seed_;
  uint64_t matrices_ = 0;
};

absl::Status ValidateOnly(const ExpertMask& only, const model::ModelConfig& config) {
  if (only.retained.empty()) return absl::OkStatus();
  bool ok = static_cast<int64_t>(only.retained.size()) == config.num_hidden_layers;
  for (size_t l = 0; ok && l < only.retained.size(); ++l) {
    ok = static_cast<int64_t>(only.retained[l].size()) == config.num_local_experts;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("the experts to load must be given as ",
                                                   config.num_hidden_layers, " layers of ",
                                                   config.num_local_experts, " experts"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Bf16Matrix> MatrixFromTensor(const model::TensorView& view) {
  if (view.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(view.name, " is not a matrix"));
  }
  Bf16Matrix m;
  m.rows = static_cast<int>(view.shape[0]);
  m.cols = static_cast<int>(view.shape[1]);
  m.data.resize(static_cast<size_t>(m.rows) * m.cols);
  if (view.dtype == DType::kBF16) {
    std::memcpy(m.data.data(), view.data, view.size_bytes);
  } else {
    for (size_t i = 0; i < m.data.size(); ++i) m.data[i] = F32ToBf16(ElementAsF32(view, i));
  }
  return m;
}

std::vector<float> VectorFromTensor(const model::TensorView& view) {
  std::vector<float> out(view.num_elements());
  for (size_t i = 0; i < out.size(); ++i) out[i] = ElementAsF32(view, i);
  return out;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(
    const model::ModelConfig& config, const model::SafetensorsModel& checkpoint,
    const ExpertMask& only) {
  RETURN_IF_ERROR(model::ValidateAgainstConfig(checkpoint, config));
  RETURN_IF_ERROR(ValidateOnly(only, config));
  auto w = std::make_unique<ModelWeights>();
  w->config = config;
  w->resident = only;
  ASSIGN_OR_RETURN(w->embed, LoadMatrix(checkpoint, config, TensorKind::kTokenEmbedding));
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    LayerWeights layer;
    ASSIGN_OR_RETURN(layer.attn_norm, LoadVector(checkpoint, config, TensorKind::kAttnNorm, l));
    ASSIGN_OR_RETURN(layer.q, LoadMatrix(checkpoint, config, TensorKind::kAttnQ, l));
    ASSIGN_OR_RETURN(layer.k, LoadMatrix(checkpoint, config, TensorKind::kAttnK, l));
    ASSIGN_OR_RETURN(layer.v, LoadMatrix(checkpoint, config, TensorKind::kAttnV, l));
    ASSIGN_OR_RETURN(layer.o, LoadMatrix(checkpoint, config, TensorKind::kAttnOut, l));
    if (config.HasQkNorm()) {
      ASSIGN_OR_RETURN(layer.q_norm, LoadVector(checkpoint, config, TensorKind::kAttnQNorm, l));
      ASSIGN_OR_RETURN(layer.k_norm, LoadVector(checkpoint, config, TensorKind::kAttnKNorm, l));
    }
    if (config.attention_qkv_bias) {
      ASSIGN_OR_RETURN(layer.q_bias, LoadVector(checkpoint, config, TensorKind::kAttnQBias, l));
      ASSIGN_OR_RETURN(layer.k_bias, LoadVector(checkpoint, config, TensorKind::kAttnKBias, l));
      ASSIGN_OR_RETURN(layer.v_bias, LoadVector(checkpoint, config, TensorKind::kAttnVBias, l));
    }
    if (config.attention_out_bias) {
      ASSIGN_OR_RETURN(layer.o_bias, LoadVector(checkpoint, config, TensorKind::kAttnOutBias, l));
    }
    ASSIGN_OR_RETURN(layer.ffn_norm, LoadVector(checkpoint, config, TensorKind::kFfnNorm, l));
    if (!config.IsSparseLayer(l)) {
      ASSIGN_OR_RETURN(layer.dense.gate, LoadMatrix(checkpoint, config, TensorKind::kDenseGate, l));
      ASSIGN_OR_RETURN(layer.dense.up, LoadMatrix(checkpoint, config, TensorKind::kDenseUp, l));
      ASSIGN_OR_RETURN(layer.dense.down, LoadMatrix(checkpoint, config, TensorKind::kDenseDown, l));
      w->layers.push_back(std::move(layer));
      continue;
    }
    ASSIGN_OR_RETURN(layer.router, LoadMatrix(checkpoint, config, TensorKind::kRouter, l));
    if (config.HasSharedExpert()) {
      ASSIGN_OR_RETURN(layer.shared.gate,
                       LoadMatrix(checkpoint, config, TensorKind::kSharedGate, l));
      ASSIGN_OR_RETURN(layer.shared.up, LoadMatrix(checkpoint, config, TensorKind::kSharedUp, l));
      ASSIGN_OR_RETURN(layer.shared.down,
                       LoadMatrix(checkpoint, config, TensorKind::kSharedDown, l));
      ASSIGN_OR_RETURN(layer.shared_gate,
                       LoadMatrix(checkpoint, config, TensorKind::kSharedExpertGate, l));
    }
    for (int e = 0; e < config.num_local_experts; ++e) {
      ExpertWeights expert;
      if (!w->HasExpert(l, e)) {
        layer.experts.push_back(std::move(expert));
        continue;
      }
      ASSIGN_OR_RETURN(expert.gate, LoadMatrix(checkpoint, config, TensorKind::kExpertGate, l, e));
      ASSIGN_OR_RETURN(expert.up, LoadMatrix(checkpoint, config, TensorKind::kExpertUp, l, e));
      ASSIGN_OR_RETURN(expert.down, LoadMatrix(checkpoint, config, TensorKind::kExpertDown, l, e));
      layer.experts.push_back(std::move(expert));
    }
    w->layers.push_back(std::move(layer));
  }
  ASSIGN_OR_RETURN(w->final_norm, LoadVector(checkpoint, config, TensorKind::kOutputNorm));
  if (config.tie_word_embeddings) {
    w->lm_head = w->embed;
  } else {
    ASSIGN_OR_RETURN(w->lm_head, LoadMatrix(checkpoint, config, TensorKind::kOutput));
  }
  return w;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Random(const model::ModelConfig& config,
                                                                   uint64_t seed,
                                                                   const ExpertMask& only) {
  RETURN_IF_ERROR(ValidateOnly(only, config));
  int64_t params = 0;
  for (const auto& spec : model::ExpectedTensors(config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    params += n;
  }
  if (params > (int64_t{1} << 36)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("dummy model of ", params, " parameters is too large"));
  }
  RandomFill fill(seed);
  auto w = std::make_unique<ModelWeights>();
  w->config = config;
  w->resident = only;
  const int h = static_cast<int>(config.hidden_size);
  const int inter = static_cast<int>(config.intermediate_size);
  const int q_dim = static_cast<int>(config.num_attention_heads * config.head_dim);
  const int kv_dim = static_cast<int>(config.num_key_value_heads * config.head_dim);
  w->embed = fill.Matrix(static_cast<int>(config.vocab_size), h);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    LayerWeights layer;
    layer.attn_norm.assign(h, 1.0f);
    layer.q = fill.Matrix(q_dim, h);
    layer.k = fill.Matrix(kv_dim, h);
    layer.v = fill.Matrix(kv_dim, h);
    layer.o = fill.Matrix(h, q_dim);
    if (config.HasQkNorm()) {
      layer.q_norm.assign(config.head_dim, 1.0f);
      layer.k_norm.assign(config.head_dim, 1.0f);
    }
    if (config.attention_qkv_bias) {  // zero, as a freshly initialised model's
      layer.q_bias.assign(q_dim, 0.0f);
      layer.k_bias.assign(kv_dim, 0.0f);
      layer.v_bias.assign(kv_dim, 0.0f);
    }
    if (config.attention_out_bias) layer.o_bias.assign(h, 0.0f);
    layer.ffn_norm.assign(h, 1.0f);
    if (!config.IsSparseLayer(l)) {
      const int dense = static_cast<int>(config.dense_intermediate_size);
      layer.dense = {fill.Matrix(dense, h), fill.Matrix(dense, h), fill.Matrix(h, dense)};
      w->layers.push_back(std::move(layer));
      continue;
    }
    layer.router = fill.Matrix(static_cast<int>(config.num_local_experts), h);
    if (config.HasSharedExpert()) {
      const int shared = static_cast<int>(config.shared_expert_intermediate_size);
      layer.shared = {fill.Matrix(shared, h), fill.Matrix(shared, h), fill.Matrix(h, shared)};
      layer.shared_gate = fill.Matrix(1, h);
    }
    for (int e = 0; e < config.num_local_experts; ++e) {
      if (!w->HasExpert(l, e)) {
        for (int m = 0; m < 3; ++m) fill.Skip();
        layer.experts.emplace_back();
        continue;
      }
      layer.experts.push_back(
          {fill.Matrix(inter, h), fill.Matrix(inter, h), fill.Matrix(h, inter)});
    }
    w->layers.push_back(std::move(layer));
  }
  w->final_norm.assign(h, 1.0f);
  w->lm_head =
      config.tie_word_embeddings ? w->embed : fill.Matrix(static_cast<int>(config.vocab_size), h);
  return w;
}

absl::StatusOr<LoadFormat> ParseLoadFormat(const std::string& name) {
  if (name == "safetensors" || name == "auto") return LoadFormat::kSafetensors;
  if (name == "dummy") return LoadFormat::kDummy;
  return absl::InvalidArgumentError(
      absl::StrCat("load format \"", name, "\" is not \"auto\", \"safetensors\" or \"dummy\""));
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const std::string& dir,
                                                               LoadFormat format, uint64_t seed,
                                                               const ExpertMask& only) {
  ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(dir + "/config.json"));
  if (format == LoadFormat::kDummy) return ModelWeights::Random(config, seed, only);
  ASSIGN_OR_RETURN(auto checkpoint, model::SafetensorsModel::Open(dir));
  return ModelWeights::Load(config, *checkpoint, only);
}

}  // namespace tandem::engine
