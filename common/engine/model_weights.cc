#include "common/engine/model_weights.h"

#include <algorithm>

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/kernels.h"
#include "common/kernels/cpu/thread_pool.h"
#include "common/model/config_reader.h"
#include "common/util/hash.h"
#include "common/util/logging.h"
#include "common/util/status.h"

namespace tandem::engine {
namespace {

using kernels::cpu::Bf16ToF32;
using kernels::cpu::F32ToBf16;
using model::DType;
using model::TensorKind;

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
      return kernels::F16ToF32(bits);
    }
    case DType::kF32: {
      float v;
      std::memcpy(&v, view.data + i * 4, 4);
      return v;
    }
    case DType::kI8:
    case DType::kU8:
      break;  // levels of quantized weights: never read as floats
  }
  return 0.0f;
}

// A linear layer's weight of `kind`: quantized where the config says so (levels and scales),
// else packed bf16.
absl::StatusOr<WeightMatrix> LoadWeight(
    const model::SafetensorsModel& checkpoint, const model::ModelConfig& config, TensorKind kind,
    int layer = -1, int expert = -1, model::ExpertLayout layout = model::ExpertLayout::kPerExpert) {
  if (!config.quantization.Quantizes(kind)) {
    ASSIGN_OR_RETURN(model::TensorView view,
                     model::GetTensor(checkpoint, config, kind, layer, expert, layout));
    return WeightFromTensor(view);
  }
  ASSIGN_OR_RETURN(model::QuantizedTensor q,
                   model::GetQuantizedTensor(checkpoint, config, kind, layer, expert, layout));
  return WeightFromQuantized(q.levels, q.scales, config.quantization.BitsOf(kind),
                             config.quantization.group_size);
}

absl::StatusOr<Bf16Matrix> LoadMatrix(const model::SafetensorsModel& checkpoint,
                                      const model::ModelConfig& config, TensorKind kind,
                                      int layer = -1, int expert = -1) {
  ASSIGN_OR_RETURN(model::TensorView view,
                   model::GetTensor(checkpoint, config, kind, layer, expert));
  return MatrixFromTensor(view);
}

absl::StatusOr<std::vector<float>> LoadVector(
    const model::SafetensorsModel& checkpoint, const model::ModelConfig& config, TensorKind kind,
    int layer = -1, int expert = -1, model::ExpertLayout layout = model::ExpertLayout::kPerExpert) {
  ASSIGN_OR_RETURN(model::TensorView view,
                   model::GetTensor(checkpoint, config, kind, layer, expert, layout));
  return VectorFromTensor(view);
}

absl::StatusOr<std::vector<float>> LoadNorm(const model::SafetensorsModel& checkpoint,
                                            const model::ModelConfig& config, TensorKind kind,
                                            int layer = -1) {
  ASSIGN_OR_RETURN(model::TensorView view, model::GetTensor(checkpoint, config, kind, layer));
  return NormFromTensor(view, config);
}

// A Gated DeltaNet layer's tensors.
absl::StatusOr<DeltaNetWeights> LoadDeltaNet(const model::SafetensorsModel& checkpoint,
                                             const model::ModelConfig& config, int l) {
  DeltaNetWeights d;
  ASSIGN_OR_RETURN(d.qkv, LoadWeight(checkpoint, config, TensorKind::kLinearQkv, l));
  ASSIGN_OR_RETURN(d.z, LoadWeight(checkpoint, config, TensorKind::kLinearZ, l));
  ASSIGN_OR_RETURN(d.b, LoadWeight(checkpoint, config, TensorKind::kLinearB, l));
  ASSIGN_OR_RETURN(d.a, LoadWeight(checkpoint, config, TensorKind::kLinearA, l));
  ASSIGN_OR_RETURN(d.out, LoadWeight(checkpoint, config, TensorKind::kLinearOut, l));
  ASSIGN_OR_RETURN(d.conv, LoadVector(checkpoint, config, TensorKind::kLinearConv, l));
  ASSIGN_OR_RETURN(d.a_log, LoadVector(checkpoint, config, TensorKind::kLinearALog, l));
  ASSIGN_OR_RETURN(d.dt_bias, LoadVector(checkpoint, config, TensorKind::kLinearDtBias, l));
  ASSIGN_OR_RETURN(d.norm, LoadVector(checkpoint, config, TensorKind::kLinearNorm, l));
  return d;
}

// A SwiGLU MLP's three matrices: a dense layer's, the shared expert's or routed expert e's.
absl::StatusOr<ExpertWeights> LoadMlp(
    const model::SafetensorsModel& checkpoint, const model::ModelConfig& config, TensorKind gate,
    TensorKind up, TensorKind down, int l, int e = -1,
    model::ExpertLayout layout = model::ExpertLayout::kPerExpert) {
  ExpertWeights m;
  ASSIGN_OR_RETURN(m.gate, LoadWeight(checkpoint, config, gate, l, e, layout));
  ASSIGN_OR_RETURN(m.up, LoadWeight(checkpoint, config, up, l, e, layout));
  ASSIGN_OR_RETURN(m.down, LoadWeight(checkpoint, config, down, l, e, layout));
  return m;
}

// An attention layer's tensors.
absl::StatusOr<AttentionWeights> LoadAttention(const model::SafetensorsModel& checkpoint,
                                               const model::ModelConfig& config, int l) {
  AttentionWeights a;
  ASSIGN_OR_RETURN(a.q, LoadWeight(checkpoint, config, TensorKind::kAttnQ, l));
  ASSIGN_OR_RETURN(a.k, LoadWeight(checkpoint, config, TensorKind::kAttnK, l));
  if (!config.LayerAttention(l).values_from_keys) {  // else the keys' projection serves
    ASSIGN_OR_RETURN(a.v, LoadWeight(checkpoint, config, TensorKind::kAttnV, l));
  }
  ASSIGN_OR_RETURN(a.o, LoadWeight(checkpoint, config, TensorKind::kAttnOut, l));
  if (config.HasQkNorm()) {
    ASSIGN_OR_RETURN(a.q_norm, LoadNorm(checkpoint, config, TensorKind::kAttnQNorm, l));
    ASSIGN_OR_RETURN(a.k_norm, LoadNorm(checkpoint, config, TensorKind::kAttnKNorm, l));
  }
  if (config.attention_qkv_bias) {
    ASSIGN_OR_RETURN(a.q_bias, LoadVector(checkpoint, config, TensorKind::kAttnQBias, l));
    ASSIGN_OR_RETURN(a.k_bias, LoadVector(checkpoint, config, TensorKind::kAttnKBias, l));
    ASSIGN_OR_RETURN(a.v_bias, LoadVector(checkpoint, config, TensorKind::kAttnVBias, l));
  }
  if (config.attention_out_bias) {
    ASSIGN_OR_RETURN(a.o_bias, LoadVector(checkpoint, config, TensorKind::kAttnOutBias, l));
  }
  if (config.attention_sinks) {
    ASSIGN_OR_RETURN(a.sinks, LoadVector(checkpoint, config, TensorKind::kAttnSinks, l));
  }
  return a;
}

// W_uk^T and W_uv of each head from kv_b_proj (heads*(nope + v), kv_lora_rank), row-major
// float32: head h's rows are its nope key rows then its value rows.
void SplitLatentUp(const model::ModelConfig& config, const std::vector<float>& kv_b,
                   LatentAttentionWeights* a) {
  const model::LatentAttentionConfig& m = config.mla;
  const int heads = static_cast<int>(config.num_attention_heads);
  const int nope = static_cast<int>(m.qk_nope_head_dim);
  const int v = static_cast<int>(m.v_head_dim);
  const int lora = static_cast<int>(m.kv_lora_rank);
  std::vector<uint16_t> t(static_cast<size_t>(lora) * nope);
  a->q_absorb.clear();
  a->v_up.clear();
  for (int h = 0; h < heads; ++h) {
    const float* head = kv_b.data() + static_cast<size_t>(h) * (nope + v) * lora;
    for (int r = 0; r < nope; ++r) {
      for (int c = 0; c < lora; ++c)
        t[static_cast<size_t>(c) * nope + r] = F32ToBf16(head[r * lora + c]);
    }
    a->q_absorb.push_back(PackBf16Matrix(t.data(), lora, nope));
    std::vector<uint16_t> up(static_cast<size_t>(v) * lora);
    for (size_t i = 0; i < up.size(); ++i)
      up[i] = F32ToBf16(head[static_cast<size_t>(nope) * lora + i]);
    a->v_up.push_back(PackBf16Matrix(up.data(), v, lora));
  }
}

// A latent attention layer's tensors.
absl::StatusOr<LatentAttentionWeights> LoadLatentAttention(
    const model::SafetensorsModel& checkpoint, const model::ModelConfig& config, int l) {
  LatentAttentionWeights a;
  if (config.mla.q_lora_rank > 0) {
    ASSIGN_OR_RETURN(a.q_a, LoadWeight(checkpoint, config, TensorKind::kAttnQA, l));
    ASSIGN_OR_RETURN(a.q_a_norm, LoadNorm(checkpoint, config, TensorKind::kAttnQANorm, l));
    ASSIGN_OR_RETURN(a.q_b, LoadWeight(checkpoint, config, TensorKind::kAttnQB, l));
  } else {
    ASSIGN_OR_RETURN(a.q, LoadWeight(checkpoint, config, TensorKind::kAttnQ, l));
  }
  ASSIGN_OR_RETURN(a.kv_a, LoadWeight(checkpoint, config, TensorKind::kAttnKvA, l));
  ASSIGN_OR_RETURN(a.kv_a_norm, LoadNorm(checkpoint, config, TensorKind::kAttnKvANorm, l));
  ASSIGN_OR_RETURN(model::TensorView kv_b,
                   model::GetTensor(checkpoint, config, TensorKind::kAttnKvB, l));
  SplitLatentUp(config, VectorFromTensor(kv_b), &a);
  ASSIGN_OR_RETURN(a.o, LoadWeight(checkpoint, config, TensorKind::kAttnOut, l));
  return a;
}

// A sparse layer's router, shared expert and the routed experts `weights` keeps.
absl::StatusOr<MoeWeights> LoadMoe(const model::SafetensorsModel& checkpoint,
                                   const model::ModelConfig& config, int l,
                                   const ModelWeights& weights, model::ExpertLayout layout) {
  MoeWeights m;
  ASSIGN_OR_RETURN(m.router, LoadWeight(checkpoint, config, TensorKind::kRouter, l));
  if (config.router.selection_bias || config.router.logit_bias) {
    ASSIGN_OR_RETURN(m.router_bias, LoadVector(checkpoint, config, TensorKind::kRouterBias, l));
  }
  if (config.router.gemma) {
    ASSIGN_OR_RETURN(model::TensorView scale,
                     model::GetTensor(checkpoint, config, TensorKind::kRouterScale, l));
    m.router_norm = RouterNormFromScale(scale, config);
    ASSIGN_OR_RETURN(m.expert_scale,
                     LoadVector(checkpoint, config, TensorKind::kRouterExpertScale, l));
  }
  if (config.HasSharedExpert()) {
    ASSIGN_OR_RETURN(m.shared, LoadMlp(checkpoint, config, TensorKind::kSharedGate,
                                       TensorKind::kSharedUp, TensorKind::kSharedDown, l));
    if (config.shared_expert_gated) {
      ASSIGN_OR_RETURN(m.shared_gate,
                       LoadWeight(checkpoint, config, TensorKind::kSharedExpertGate, l));
    }
  }
  m.experts.resize(config.num_local_experts);
  for (int e = 0; e < config.num_local_experts; ++e) {
    if (weights.HasExpert(l, e)) {
      ASSIGN_OR_RETURN(m.experts[e],
                       LoadMlp(checkpoint, config, TensorKind::kExpertGate, TensorKind::kExpertUp,
                               TensorKind::kExpertDown, l, e, layout));
    }
    if (!config.expert_bias) continue;  // biases of every expert: streamed ones' too
    ExpertWeights& x = m.experts[e];
    ASSIGN_OR_RETURN(x.gate_bias,
                     LoadVector(checkpoint, config, TensorKind::kExpertGateBias, l, e, layout));
    ASSIGN_OR_RETURN(x.up_bias,
                     LoadVector(checkpoint, config, TensorKind::kExpertUpBias, l, e, layout));
    ASSIGN_OR_RETURN(x.down_bias,
                     LoadVector(checkpoint, config, TensorKind::kExpertDownBias, l, e, layout));
  }
  return m;
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
  // A linear layer's weight: bf16, or (when `q` quantizes `kind`) random levels with scales
  // that give the same standard deviation.
  WeightMatrix Weight(int rows, int cols, const model::QuantizationConfig& q, TensorKind kind) {
    if (!q.Quantizes(kind)) {
      const Bf16Matrix m = Matrix(rows, cols);
      return PackBf16Matrix(m.data.data(), rows, cols);
    }
    const int bits = q.BitsOf(kind);
    const kernels::WeightFormat format =
        bits == 8 ? kernels::WeightFormat::kInt8 : kernels::WeightFormat::kInt4;
    kernels::QuantizedRows levels;
    levels.format = format;
    levels.rows = rows;
    levels.cols = cols;
    levels.group = q.group_size;
    levels.q.resize(static_cast<size_t>(rows) * cols);
    // Levels uniform over [-range, range]: standard deviation range / sqrt(3) levels.
    const int range = bits == 8 ? 127 : 7;
    const float scale = 0.02f * 1.7320508f / static_cast<float>(range);
    levels.scales.assign(static_cast<size_t>(rows) * (cols / q.group_size),
                         kernels::F32ToF16(scale));
    const uint64_t key = SplitMix64(seed_ ^ SplitMix64(++matrices_));
    kernels::cpu::DefaultThreadPool().ParallelFor(
        static_cast<int64_t>(levels.q.size()), 1 << 16, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            const uint64_t bits = SplitMix64(key + static_cast<uint64_t>(i));
            levels.q[i] = static_cast<int8_t>(static_cast<int>(bits % (2 * range + 1)) - range);
          }
        });
    WeightMatrix w;
    w.layout = {format, rows, cols, q.group_size};
    w.data.resize(w.layout.bytes());
    kernels::PackQuantized(levels, w.layout, w.data.data());
    return w;
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
  if (view.dtype != DType::kBF16 && view.dtype != DType::kF16 && view.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(view.name, " is not a float tensor"));
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

WeightMatrix PackBf16Matrix(const uint16_t* w, int rows, int cols) {
  WeightMatrix m;
  m.layout = {kernels::WeightFormat::kBf16, rows, cols, 0};
  m.data.resize(m.layout.bytes());
  kernels::PackBf16(w, cols, m.layout, m.data.data());
  return m;
}

WeightMatrix QuantizeMatrix(const float* w, int rows, int cols, kernels::WeightFormat format,
                            int group) {
  if (format == kernels::WeightFormat::kBf16) {
    std::vector<uint16_t> bits(static_cast<size_t>(rows) * cols);
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = F32ToBf16(w[i]);
    return PackBf16Matrix(bits.data(), rows, cols);
  }
  const kernels::QuantizedRows q = kernels::QuantizeRows(w, cols, rows, cols, format, group);
  WeightMatrix m;
  m.layout = {format, rows, cols, group};
  m.data.resize(m.layout.bytes());
  kernels::PackQuantized(q, m.layout, m.data.data());
  return m;
}

absl::StatusOr<WeightMatrix> WeightFromTensor(const model::TensorView& view) {
  ASSIGN_OR_RETURN(Bf16Matrix m, MatrixFromTensor(view));
  return PackBf16Matrix(m.data.data(), m.rows, m.cols);
}

absl::StatusOr<WeightMatrix> WeightFromQuantized(const model::TensorView& levels,
                                                 const model::TensorView& scales, int bits,
                                                 int group) {
  const bool int4 = bits == 4;
  if ((bits != 4 && bits != 8) || !kernels::ValidGroup(group)) {
    return absl::InvalidArgumentError(
        "quantized weights need 8 or 4 bits and a group of 32, 64 or 128");
  }
  if (levels.shape.size() != 2 || levels.dtype != (int4 ? DType::kU8 : DType::kI8)) {
    return absl::InvalidArgumentError(absl::StrCat(levels.name, " must be a matrix of ",
                                                   int4 ? "U8 (two int4 levels a byte)" : "I8"));
  }
  const int64_t rows = levels.shape[0];
  const int64_t cols = int4 ? 2 * levels.shape[1] : levels.shape[1];
  if (scales.dtype != DType::kF16 || scales.shape != std::vector<int64_t>{rows, cols / group} ||
      cols % group != 0) {
    return absl::InvalidArgumentError(absl::StrCat(scales.name, " must be F16 of shape (", rows,
                                                   ", ", cols / group, ") for ", levels.name,
                                                   " in groups of ", group));
  }
  kernels::QuantizedRows q;
  q.format = int4 ? kernels::WeightFormat::kInt4 : kernels::WeightFormat::kInt8;
  q.rows = static_cast<int>(rows);
  q.cols = static_cast<int>(cols);
  q.group = group;
  q.q.resize(static_cast<size_t>(rows * cols));
  if (int4) {
    kernels::UnpackNibbles(reinterpret_cast<const uint8_t*>(levels.data), rows * cols, q.q.data());
  } else {
    std::memcpy(q.q.data(), levels.data, q.q.size());
    for (int8_t v : q.q) {
      if (v == -128) {
        return absl::InvalidArgumentError(
            absl::StrCat(levels.name, " holds the level -128; int8 levels lie in [-127, 127]"));
      }
    }
  }
  q.scales.resize(scales.num_elements());
  std::memcpy(q.scales.data(), scales.data, scales.size_bytes);
  WeightMatrix m;
  m.layout = {q.format, q.rows, q.cols, group};
  m.data.resize(m.layout.bytes());
  kernels::PackQuantized(q, m.layout, m.data.data());
  return m;
}

std::vector<float> VectorFromTensor(const model::TensorView& view) {
  std::vector<float> out(view.num_elements());
  for (size_t i = 0; i < out.size(); ++i) out[i] = ElementAsF32(view, i);
  return out;
}

std::vector<float> NormFromTensor(const model::TensorView& view, const model::ModelConfig& config) {
  std::vector<float> w = VectorFromTensor(view);
  if (config.zero_centred_norms) {
    for (float& x : w) x += 1.0f;
  }
  return w;
}

std::vector<float> RouterNormFromScale(const model::TensorView& view,
                                       const model::ModelConfig& config) {
  std::vector<float> w = VectorFromTensor(view);
  const float root = 1.0f / std::sqrt(static_cast<float>(config.hidden_size));
  for (float& x : w) x *= root;
  return w;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(
    const model::ModelConfig& config, const model::SafetensorsModel& checkpoint,
    const ExpertMask& only) {
  if (!config.quantization.unsupported_method.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "config.json's quantization_config is \"", config.quantization.unsupported_method,
        "\": Tandem does not load such weights (convert the checkpoint to bf16, or quantize that "
        "with tandem quantize)"));
  }
  RETURN_IF_ERROR(model::ValidateAgainstConfig(checkpoint, config));
  RETURN_IF_ERROR(ValidateOnly(only, config));
  const std::vector<std::string> names = checkpoint.Names();
  const model::ExpertLayout layout = model::DetectExpertLayout(config, names);
  const int64_t ignored = std::count_if(names.begin(), names.end(), [&](const std::string& name) {
    return model::IsIgnoredTensor(config, name);
  });
  if (ignored > 0) {
    std::string prefixes;
    for (std::string_view prefix : config.arch->ignored_prefixes) {
      if (!prefix.empty()) prefixes += (prefixes.empty() ? "" : ", ") + std::string(prefix) + "*";
    }
    if (!config.arch->extra_layers_prefix.empty()) {
      prefixes +=
          absl::StrCat(prefixes.empty() ? "" : ", ", model::Sv(config.arch->extra_layers_prefix),
                       "{>= ", config.num_hidden_layers, "}.*");
    }
    TANDEM_LOG(INFO) << "skipping " << ignored << " checkpoint tensors the engine does not run ("
                     << prefixes << ")";
  }
  auto w = std::make_unique<ModelWeights>();
  w->config = config;
  w->resident = only;
  ASSIGN_OR_RETURN(w->embed, LoadMatrix(checkpoint, config, TensorKind::kTokenEmbedding));
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    LayerWeights layer;
    ASSIGN_OR_RETURN(layer.attn_norm, LoadNorm(checkpoint, config, TensorKind::kAttnNorm, l));
    if (config.Mixer(l) == model::MixerKind::kGatedDeltaNet) {
      ASSIGN_OR_RETURN(layer.linear, LoadDeltaNet(checkpoint, config, l));
    } else if (config.Mixer(l) == model::MixerKind::kLatentAttention) {
      ASSIGN_OR_RETURN(layer.latent, LoadLatentAttention(checkpoint, config, l));
    } else {
      ASSIGN_OR_RETURN(layer.attention, LoadAttention(checkpoint, config, l));
    }
    ASSIGN_OR_RETURN(layer.ffn_norm, LoadNorm(checkpoint, config, TensorKind::kFfnNorm, l));
    if (config.sandwich_norms) {
      ASSIGN_OR_RETURN(layer.post_attn_norm,
                       LoadNorm(checkpoint, config, TensorKind::kPostAttnNorm, l));
      ASSIGN_OR_RETURN(layer.post_ffn_norm,
                       LoadNorm(checkpoint, config, TensorKind::kPostFfnNorm, l));
    }
    if (config.layer_scalar) {
      ASSIGN_OR_RETURN(layer.layer_scalar,
                       LoadVector(checkpoint, config, TensorKind::kLayerScalar, l));
    }
    if (config.IsSparseLayer(l)) {
      ASSIGN_OR_RETURN(layer.moe, LoadMoe(checkpoint, config, l, *w, layout));
    }
    if (config.HasDenseMlp(l)) {
      ASSIGN_OR_RETURN(layer.dense, LoadMlp(checkpoint, config, TensorKind::kDenseGate,
                                            TensorKind::kDenseUp, TensorKind::kDenseDown, l));
    }
    if (config.Ffn(l) == model::FfnKind::kDenseAndMoe) {
      ASSIGN_OR_RETURN(layer.post_dense_norm,
                       LoadNorm(checkpoint, config, TensorKind::kPostDenseNorm, l));
      ASSIGN_OR_RETURN(layer.pre_moe_norm,
                       LoadNorm(checkpoint, config, TensorKind::kPreMoeNorm, l));
      ASSIGN_OR_RETURN(layer.post_moe_norm,
                       LoadNorm(checkpoint, config, TensorKind::kPostMoeNorm, l));
    }
    w->layers.push_back(std::move(layer));
  }
  ASSIGN_OR_RETURN(w->final_norm, LoadNorm(checkpoint, config, TensorKind::kOutputNorm));
  if (config.tie_word_embeddings) {
    w->lm_head = PackBf16Matrix(w->embed.data.data(), w->embed.rows, w->embed.cols);
  } else {
    ASSIGN_OR_RETURN(w->lm_head, LoadWeight(checkpoint, config, TensorKind::kOutput));
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
  w->embed = fill.Matrix(static_cast<int>(config.vocab_size), h);
  const model::QuantizationConfig& qc = config.quantization;
  // A SwiGLU MLP `width` wide, its matrices of `kinds` (gate, up, down).
  auto mlp = [&](int width, TensorKind gate, TensorKind up, TensorKind down) {
    ExpertWeights m;
    m.gate = fill.Weight(width, h, qc, gate);
    m.up = fill.Weight(width, h, qc, up);
    m.down = fill.Weight(h, width, qc, down);
    return m;
  };
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    LayerWeights layer;
    layer.attn_norm.assign(h, 1.0f);
    if (config.Mixer(l) == model::MixerKind::kGatedDeltaNet) {
      // Decays exp(g) near 0.5 and an identity-like convolution, so a dummy model's state
      // neither vanishes nor grows.
      const model::DeltaNetConfig& d = config.linear;
      DeltaNetWeights& dn = layer.linear;
      const int heads = static_cast<int>(d.num_value_heads);
      dn.qkv = fill.Weight(static_cast<int>(d.conv_dim()), h, qc, TensorKind::kLinearQkv);
      dn.z = fill.Weight(static_cast<int>(d.value_dim()), h, qc, TensorKind::kLinearZ);
      dn.b = fill.Weight(heads, h, qc, TensorKind::kLinearB);
      dn.a = fill.Weight(heads, h, qc, TensorKind::kLinearA);
      dn.out = fill.Weight(h, static_cast<int>(d.value_dim()), qc, TensorKind::kLinearOut);
      dn.conv.assign(static_cast<size_t>(d.conv_dim() * d.conv_kernel), 0.0f);
      for (int64_t c = 0; c < d.conv_dim(); ++c) dn.conv[(c + 1) * d.conv_kernel - 1] = 1.0f;
      dn.a_log.assign(heads, 0.0f);
      dn.dt_bias.assign(heads, 0.0f);
      dn.norm.assign(d.value_head_dim, 1.0f);
    } else if (config.Mixer(l) == model::MixerKind::kLatentAttention) {
      const model::LatentAttentionConfig& ml = config.mla;
      LatentAttentionWeights& a = layer.latent;
      const int heads = static_cast<int>(config.num_attention_heads);
      const int q_rows = heads * static_cast<int>(ml.qk_head_dim());
      const int lora = static_cast<int>(ml.kv_lora_rank);
      if (ml.q_lora_rank > 0) {
        a.q_a = fill.Weight(static_cast<int>(ml.q_lora_rank), h, qc, TensorKind::kAttnQA);
        a.q_a_norm.assign(ml.q_lora_rank, 1.0f);
        a.q_b = fill.Weight(q_rows, static_cast<int>(ml.q_lora_rank), qc, TensorKind::kAttnQB);
      } else {
        a.q = fill.Weight(q_rows, h, qc, TensorKind::kAttnQ);
      }
      a.kv_a = fill.Weight(static_cast<int>(ml.cache_dim()), h, qc, TensorKind::kAttnKvA);
      a.kv_a_norm.assign(lora, 1.0f);
      const Bf16Matrix kv_b =
          fill.Matrix(heads * static_cast<int>(ml.qk_nope_head_dim + ml.v_head_dim), lora);
      std::vector<float> up(kv_b.data.size());
      for (size_t i = 0; i < up.size(); ++i) up[i] = Bf16ToF32(kv_b.data[i]);
      SplitLatentUp(config, up, &a);
      a.o = fill.Weight(h, heads * static_cast<int>(ml.v_head_dim), qc, TensorKind::kAttnOut);
    } else {
      AttentionWeights& a = layer.attention;
      const model::AttentionShape shape = config.LayerAttention(l);
      const int q_dim = static_cast<int>(config.num_attention_heads * shape.head_dim);
      const int kv_dim = static_cast<int>(shape.kv_heads * shape.head_dim);
      const int q_rows = config.attention_output_gate ? 2 * q_dim : q_dim;
      a.q = fill.Weight(q_rows, h, qc, TensorKind::kAttnQ);
      a.k = fill.Weight(kv_dim, h, qc, TensorKind::kAttnK);
      if (shape.values_from_keys) {
        fill.Skip();  // the same draws whatever the values come from
      } else {
        a.v = fill.Weight(kv_dim, h, qc, TensorKind::kAttnV);
      }
      a.o = fill.Weight(h, q_dim, qc, TensorKind::kAttnOut);
      if (config.HasQkNorm()) {
        a.q_norm.assign(shape.head_dim, 1.0f);
        a.k_norm.assign(shape.head_dim, 1.0f);
      }
      if (config.attention_qkv_bias) {  // zero, as a freshly initialised model's
        a.q_bias.assign(q_rows, 0.0f);
        a.k_bias.assign(kv_dim, 0.0f);
        a.v_bias.assign(kv_dim, 0.0f);
      }
      if (config.attention_out_bias) a.o_bias.assign(h, 0.0f);
      if (config.attention_sinks) a.sinks.assign(config.num_attention_heads, 0.0f);
    }
    layer.ffn_norm.assign(h, 1.0f);
    if (config.sandwich_norms) {
      layer.post_attn_norm.assign(h, 1.0f);
      layer.post_ffn_norm.assign(h, 1.0f);
    }
    if (config.layer_scalar) layer.layer_scalar.assign(1, 1.0f);
    if (config.HasDenseMlp(l)) {
      layer.dense = mlp(static_cast<int>(config.dense_intermediate_size), TensorKind::kDenseGate,
                        TensorKind::kDenseUp, TensorKind::kDenseDown);
    }
    if (!config.IsSparseLayer(l)) {
      w->layers.push_back(std::move(layer));
      continue;
    }
    if (config.Ffn(l) == model::FfnKind::kDenseAndMoe) {
      layer.post_dense_norm.assign(h, 1.0f);
      layer.pre_moe_norm.assign(h, 1.0f);
      layer.post_moe_norm.assign(h, 1.0f);
    }
    MoeWeights& m = layer.moe;
    m.router = fill.Weight(static_cast<int>(config.num_local_experts), h, qc, TensorKind::kRouter);
    if (config.router.selection_bias || config.router.logit_bias) {
      m.router_bias.assign(config.num_local_experts, 0.0f);
    }
    if (config.router.gemma) {  // a unit scale, as a freshly initialised model's
      m.router_norm.assign(h, 1.0f / std::sqrt(static_cast<float>(h)));
      m.expert_scale.assign(config.num_local_experts, 1.0f);
    }
    if (config.HasSharedExpert()) {
      m.shared = mlp(static_cast<int>(config.shared_expert_intermediate_size),
                     TensorKind::kSharedGate, TensorKind::kSharedUp, TensorKind::kSharedDown);
      if (config.shared_expert_gated) {
        m.shared_gate = fill.Weight(1, h, qc, TensorKind::kSharedExpertGate);
      }
    }
    m.experts.resize(config.num_local_experts);
    for (int e = 0; e < config.num_local_experts; ++e) {
      if (!w->HasExpert(l, e)) {
        for (int matrix = 0; matrix < 3; ++matrix) fill.Skip();
      } else {
        m.experts[e] =
            mlp(inter, TensorKind::kExpertGate, TensorKind::kExpertUp, TensorKind::kExpertDown);
      }
      if (config.expert_bias) {  // zero, as a freshly initialised model's
        m.experts[e].gate_bias.assign(inter, 0.0f);
        m.experts[e].up_bias.assign(inter, 0.0f);
        m.experts[e].down_bias.assign(h, 0.0f);
      }
    }
    w->layers.push_back(std::move(layer));
  }
  w->final_norm.assign(h, 1.0f);
  w->lm_head = config.tie_word_embeddings
                   ? PackBf16Matrix(w->embed.data.data(), w->embed.rows, w->embed.cols)
                   : fill.Weight(static_cast<int>(config.vocab_size), h, config.quantization,
                                 TensorKind::kOutput);
  return w;
}

int64_t ModelWeights::bytes() const {
  int64_t total = static_cast<int64_t>(embed.data.size() * sizeof(uint16_t) + lm_head.data.size() +
                                       final_norm.size() * sizeof(float));
  auto floats = [](const std::vector<float>& v) { return static_cast<int64_t>(v.size() * 4); };
  auto expert = [](const ExpertWeights& e) {
    return static_cast<int64_t>(e.gate.data.size() + e.up.data.size() + e.down.data.size());
  };
  for (const LayerWeights& l : layers) {
    const AttentionWeights& a = l.attention;
    const DeltaNetWeights& d = l.linear;
    for (const WeightMatrix* m : {&a.q, &a.k, &a.v, &a.o, &l.moe.router, &l.moe.shared_gate, &d.qkv,
                                  &d.z, &d.b, &d.a, &d.out}) {
      total += static_cast<int64_t>(m->data.size());
    }
    for (const std::vector<float>* v :
         {&l.attn_norm,      &a.q_bias,        &a.k_bias,          &a.v_bias,
          &a.o_bias,         &a.q_norm,        &a.k_norm,          &l.ffn_norm,
          &d.conv,           &d.a_log,         &d.dt_bias,         &d.norm,
          &l.post_attn_norm, &l.post_ffn_norm, &l.post_dense_norm, &l.pre_moe_norm,
          &l.post_moe_norm,  &l.layer_scalar,  &l.moe.router_norm, &l.moe.expert_scale}) {
      total += floats(*v);
    }
    const LatentAttentionWeights& la = l.latent;
    for (const WeightMatrix* m : {&la.q, &la.q_a, &la.q_b, &la.kv_a, &la.o}) {
      total += static_cast<int64_t>(m->data.size());
    }
    for (const auto* heads : {&la.q_absorb, &la.v_up}) {
      for (const WeightMatrix& m : *heads) total += static_cast<int64_t>(m.data.size());
    }
    total += floats(la.q_a_norm) + floats(la.kv_a_norm) + floats(l.moe.router_bias);
    for (const ExpertWeights& e : l.moe.experts) {
      total += expert(e) + floats(e.gate_bias) + floats(e.up_bias) + floats(e.down_bias);
    }
    total += floats(a.sinks);
    total += expert(l.moe.shared) + expert(l.dense);
  }
  return total;
}

absl::StatusOr<LoadFormat> ParseLoadFormat(const std::string& name) {
  if (name == "safetensors" || name == "auto") return LoadFormat::kSafetensors;
  if (name == "dummy") return LoadFormat::kDummy;
  return absl::InvalidArgumentError(
      absl::StrCat("load format \"", name, "\" is not \"auto\", \"safetensors\" or \"dummy\""));
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const model::ModelDir& dir,
                                                               LoadFormat format, uint64_t seed,
                                                               const ExpertMask& only) {
  if (format == LoadFormat::kDummy) return ModelWeights::Random(dir.config(), seed, only);
  ASSIGN_OR_RETURN(const model::SafetensorsModel* checkpoint, dir.checkpoint());
  return ModelWeights::Load(dir.config(), *checkpoint, only);
}

}  // namespace tandem::engine
