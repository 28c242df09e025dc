#include "common/engine/model_weights.h"

#include <algorithm>

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/kernels.h"
#include "common/kernels/cpu/thread_pool.h"
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
  ASSIGN_OR_RETURN(model::TensorView view,
                   model::GetTensor(checkpoint, config, kind, layer, expert, layout));
  if (!config.quantization.Quantizes(kind)) return WeightFromTensor(view);
  ASSIGN_OR_RETURN(model::TensorView scales, checkpoint.Get(model::ScaleTensorName(view.name)));
  return WeightFromQuantized(view, scales, config.quantization.bits,
                             config.quantization.group_size);
}

absl::StatusOr<Bf16Matrix> LoadMatrix(const model::SafetensorsModel& checkpoint,
                                      const model::ModelConfig& config, TensorKind kind,
                                      int layer = -1, int expert = -1) {
  ASSIGN_OR_RETURN(model::TensorView view,
                   model::GetTensor(checkpoint, config, kind, layer, expert));
  return MatrixFromTensor(view);
}

absl::StatusOr<std::vector<float>> LoadVector(const model::SafetensorsModel& checkpoint,
                                              const model::ModelConfig& config, TensorKind kind,
                                              int layer = -1) {
  ASSIGN_OR_RETURN(model::TensorView view, model::GetTensor(checkpoint, config, kind, layer));
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
    const kernels::WeightFormat format =
        q.bits == 8 ? kernels::WeightFormat::kInt8 : kernels::WeightFormat::kInt4;
    kernels::QuantizedRows levels;
    levels.format = format;
    levels.rows = rows;
    levels.cols = cols;
    levels.group = q.group_size;
    levels.q.resize(static_cast<size_t>(rows) * cols);
    // Levels uniform over [-range, range]: standard deviation range / sqrt(3) levels.
    const int range = q.bits == 8 ? 127 : 7;
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

void StackQkv(LayerWeights* layer) {
  const WeightMatrix* parts[] = {&layer->q, &layer->k, &layer->v};
  for (const WeightMatrix* m : parts) {
    if (m->empty() || m->rows() % kernels::kPanelRows != 0 ||
        m->layout.format != layer->q.layout.format || m->layout.group != layer->q.layout.group ||
        m->cols() != layer->q.cols()) {
      return;
    }
  }
  WeightMatrix qkv;
  qkv.layout = layer->q.layout;
  qkv.layout.rows = layer->q.rows() + layer->k.rows() + layer->v.rows();
  qkv.data.resize(qkv.layout.bytes());
  std::byte* out = qkv.data.data();
  for (const WeightMatrix* m : parts) {
    std::memcpy(out, m->data.data(), m->data.size());
    out += m->data.size();
  }
  layer->qkv = std::move(qkv);
  layer->q = WeightMatrix();
  layer->k = WeightMatrix();
  layer->v = WeightMatrix();
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

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(
    const model::ModelConfig& config, const model::SafetensorsModel& checkpoint,
    const ExpertMask& only) {
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
    ASSIGN_OR_RETURN(layer.ffn_norm, LoadNorm(checkpoint, config, TensorKind::kFfnNorm, l));
    if (config.Mixer(l) == model::MixerKind::kGatedDeltaNet) {
      ASSIGN_OR_RETURN(layer.linear, LoadDeltaNet(checkpoint, config, l));
    } else {
      ASSIGN_OR_RETURN(layer.q, LoadWeight(checkpoint, config, TensorKind::kAttnQ, l));
      ASSIGN_OR_RETURN(layer.k, LoadWeight(checkpoint, config, TensorKind::kAttnK, l));
      ASSIGN_OR_RETURN(layer.v, LoadWeight(checkpoint, config, TensorKind::kAttnV, l));
      ASSIGN_OR_RETURN(layer.o, LoadWeight(checkpoint, config, TensorKind::kAttnOut, l));
      StackQkv(&layer);
    }
    if (config.HasQkNorm() && config.Mixer(l) == model::MixerKind::kAttention) {
      ASSIGN_OR_RETURN(layer.q_norm, LoadNorm(checkpoint, config, TensorKind::kAttnQNorm, l));
      ASSIGN_OR_RETURN(layer.k_norm, LoadNorm(checkpoint, config, TensorKind::kAttnKNorm, l));
    }
    if (config.attention_qkv_bias && config.Mixer(l) == model::MixerKind::kAttention) {
      ASSIGN_OR_RETURN(layer.q_bias, LoadVector(checkpoint, config, TensorKind::kAttnQBias, l));
      ASSIGN_OR_RETURN(layer.k_bias, LoadVector(checkpoint, config, TensorKind::kAttnKBias, l));
      ASSIGN_OR_RETURN(layer.v_bias, LoadVector(checkpoint, config, TensorKind::kAttnVBias, l));
    }
    if (config.attention_out_bias && config.Mixer(l) == model::MixerKind::kAttention) {
      ASSIGN_OR_RETURN(layer.o_bias, LoadVector(checkpoint, config, TensorKind::kAttnOutBias, l));
    }
    if (!config.IsSparseLayer(l)) {
      ASSIGN_OR_RETURN(layer.dense.gate, LoadWeight(checkpoint, config, TensorKind::kDenseGate, l));
      ASSIGN_OR_RETURN(layer.dense.up, LoadWeight(checkpoint, config, TensorKind::kDenseUp, l));
      ASSIGN_OR_RETURN(layer.dense.down, LoadWeight(checkpoint, config, TensorKind::kDenseDown, l));
      w->layers.push_back(std::move(layer));
      continue;
    }
    ASSIGN_OR_RETURN(layer.router, LoadWeight(checkpoint, config, TensorKind::kRouter, l));
    if (config.HasSharedExpert()) {
      ASSIGN_OR_RETURN(layer.shared.gate,
                       LoadWeight(checkpoint, config, TensorKind::kSharedGate, l));
      ASSIGN_OR_RETURN(layer.shared.up, LoadWeight(checkpoint, config, TensorKind::kSharedUp, l));
      ASSIGN_OR_RETURN(layer.shared.down,
                       LoadWeight(checkpoint, config, TensorKind::kSharedDown, l));
      if (config.shared_expert_gated) {
        ASSIGN_OR_RETURN(layer.shared_gate,
                         LoadWeight(checkpoint, config, TensorKind::kSharedExpertGate, l));
      }
    }
    for (int e = 0; e < config.num_local_experts; ++e) {
      ExpertWeights expert;
      if (!w->HasExpert(l, e)) {
        layer.experts.push_back(std::move(expert));
        continue;
      }
      ASSIGN_OR_RETURN(expert.gate,
                       LoadWeight(checkpoint, config, TensorKind::kExpertGate, l, e, layout));
      ASSIGN_OR_RETURN(expert.up,
                       LoadWeight(checkpoint, config, TensorKind::kExpertUp, l, e, layout));
      ASSIGN_OR_RETURN(expert.down,
                       LoadWeight(checkpoint, config, TensorKind::kExpertDown, l, e, layout));
      layer.experts.push_back(std::move(expert));
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
  const int q_dim = static_cast<int>(config.num_attention_heads * config.head_dim);
  const int kv_dim = static_cast<int>(config.num_key_value_heads * config.head_dim);
  w->embed = fill.Matrix(static_cast<int>(config.vocab_size), h);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    LayerWeights layer;
    layer.attn_norm.assign(h, 1.0f);
    const model::QuantizationConfig& qc = config.quantization;
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
    } else {
      const int q_rows = config.attention_output_gate ? 2 * q_dim : q_dim;
      layer.q = fill.Weight(q_rows, h, qc, TensorKind::kAttnQ);
      layer.k = fill.Weight(kv_dim, h, qc, TensorKind::kAttnK);
      layer.v = fill.Weight(kv_dim, h, qc, TensorKind::kAttnV);
      layer.o = fill.Weight(h, q_dim, qc, TensorKind::kAttnOut);
      StackQkv(&layer);
      if (config.HasQkNorm()) {
        layer.q_norm.assign(config.head_dim, 1.0f);
        layer.k_norm.assign(config.head_dim, 1.0f);
      }
      if (config.attention_qkv_bias) {  // zero, as a freshly initialised model's
        layer.q_bias.assign(q_rows, 0.0f);
        layer.k_bias.assign(kv_dim, 0.0f);
        layer.v_bias.assign(kv_dim, 0.0f);
      }
      if (config.attention_out_bias) layer.o_bias.assign(h, 0.0f);
    }
    layer.ffn_norm.assign(h, 1.0f);
    if (!config.IsSparseLayer(l)) {
      const int dense = static_cast<int>(config.dense_intermediate_size);
      layer.dense = {fill.Weight(dense, h, qc, TensorKind::kDenseGate),
                     fill.Weight(dense, h, qc, TensorKind::kDenseUp),
                     fill.Weight(h, dense, qc, TensorKind::kDenseDown)};
      w->layers.push_back(std::move(layer));
      continue;
    }
    layer.router =
        fill.Weight(static_cast<int>(config.num_local_experts), h, qc, TensorKind::kRouter);
    if (config.HasSharedExpert()) {
      const int shared = static_cast<int>(config.shared_expert_intermediate_size);
      layer.shared = {fill.Weight(shared, h, qc, TensorKind::kSharedGate),
                      fill.Weight(shared, h, qc, TensorKind::kSharedUp),
                      fill.Weight(h, shared, qc, TensorKind::kSharedDown)};
      if (config.shared_expert_gated) {
        layer.shared_gate = fill.Weight(1, h, qc, TensorKind::kSharedExpertGate);
      }
    }
    for (int e = 0; e < config.num_local_experts; ++e) {
      if (!w->HasExpert(l, e)) {
        for (int m = 0; m < 3; ++m) fill.Skip();
        layer.experts.emplace_back();
        continue;
      }
      layer.experts.push_back({fill.Weight(inter, h, qc, TensorKind::kExpertGate),
                               fill.Weight(inter, h, qc, TensorKind::kExpertUp),
                               fill.Weight(h, inter, qc, TensorKind::kExpertDown)});
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
    total += static_cast<int64_t>(l.qkv.data.size() + l.q.data.size() + l.k.data.size() +
                                  l.v.data.size() + l.o.data.size() + l.router.data.size() +
                                  l.shared_gate.data.size());
    const DeltaNetWeights& d = l.linear;
    for (const WeightMatrix* m : {&d.qkv, &d.z, &d.b, &d.a, &d.out}) {
      total += static_cast<int64_t>(m->data.size());
    }
    for (const std::vector<float>* v : {&d.conv, &d.a_log, &d.dt_bias, &d.norm}) {
      total += floats(*v);
    }
    for (const std::vector<float>* v : {&l.attn_norm, &l.q_bias, &l.k_bias, &l.v_bias, &l.o_bias,
                                        &l.q_norm, &l.k_norm, &l.ffn_norm}) {
      total += floats(*v);
    }
    for (const ExpertWeights& e : l.experts) total += expert(e);
    total += expert(l.shared) + expert(l.dense);
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
