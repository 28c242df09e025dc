#include "common/engine/forward.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/engine/layers/attention.h"
#include "common/engine/layers/delta_net.h"
#include "common/engine/layers/dense_and_moe.h"
#include "common/engine/layers/latent_attention.h"
#include "common/engine/layers/mlp.h"
#include "common/engine/layers/moe.h"
#include "common/engine/overlay.h"
#include "common/kernels/cpu/kernels.h"
#include "common/util/status.h"

namespace tandem::engine {
namespace {

namespace k = kernels::cpu;

}  // namespace

ForwardPass::ForwardPass(const ModelWeights* weights, KvBlockPool* pool,
                         const kernels::Backend* backend)
    : w_(weights), pool_(pool), backend_(backend), ctx_(weights) {
  const model::ModelConfig& c = weights->config;
  if (c.embedding_scale > 0) {
    embedding_scale_ = static_cast<float>(c.embedding_scale);
    // Hugging Face multiplies by the scale cast to the embedding's dtype (sqrt(2816) = 53.07 is
    // 53 in bf16).
    if (c.torch_dtype == "bfloat16")
      embedding_scale_ = k::Bf16ToF32(k::F32ToBf16(embedding_scale_));
  }
}

absl::StatusOr<std::unique_ptr<ForwardPass>> ForwardPass::Create(const ModelWeights* weights,
                                                                 KvBlockPool* pool,
                                                                 const kernels::Backend* backend) {
  std::unique_ptr<ForwardPass> forward(new ForwardPass(weights, pool, backend));
  const model::ModelConfig& c = weights->config;
  const KvCacheConfig& kv = pool->config();
  const CacheLayout layout = CacheLayoutFor(c, kv.block_size, kv.dtype, !kv.rings.empty());
  if (kv.num_layers != layout.paged_layers || kv.state_bytes != layout.state_bytes ||
      (layout.state_bytes > 0 && kv.num_state_slots <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV pool geometry (", kv.num_layers, " paged layers, state slots of ", kv.state_bytes,
        " bytes) does not match the model (", layout.paged_layers, ", ", layout.state_bytes, ")"));
  }
  // One block of each kind, shared by the layers (their buffers are the step's); each layer
  // as its spec composes it.
  forward->layers_.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Layer& layer = forward->layers_[l];
    switch (c.Mixer(l)) {
      case model::MixerKind::kAttention:
        if (forward->attention_ == nullptr) {
          forward->attention_ = std::make_unique<AttentionBlock>(c, pool, layout);
        }
        layer.mixer = forward->attention_.get();
        break;
      case model::MixerKind::kLatentAttention:
        if (forward->latent_attention_ == nullptr) {
          forward->latent_attention_ =
              std::make_unique<LatentAttentionBlock>(c, pool, layout.kv_layers);
        }
        layer.mixer = forward->latent_attention_.get();
        break;
      case model::MixerKind::kGatedDeltaNet:
        if (forward->delta_net_ == nullptr) {
          forward->delta_net_ = std::make_unique<GatedDeltaNetBlock>(c, pool, layout.state_offsets);
        }
        layer.mixer = forward->delta_net_.get();
        break;
    }
    switch (c.Ffn(l)) {
      case model::FfnKind::kMoe:
        if (forward->moe_ == nullptr) forward->moe_ = std::make_unique<MoeBlock>(c);
        layer.ffn = forward->moe_.get();
        break;
      case model::FfnKind::kDenseMlp:
        if (forward->dense_ == nullptr) forward->dense_ = std::make_unique<DenseMlpBlock>();
        layer.ffn = forward->dense_.get();
        break;
      case model::FfnKind::kDenseAndMoe:
        if (forward->dense_and_moe_ == nullptr) {
          forward->dense_and_moe_ = std::make_unique<DenseAndMoeBlock>(c);
        }
        layer.ffn = forward->dense_and_moe_.get();
        break;
    }
  }
  // The pool holds what the layers' blocks keep: paged K/V of its geometry (a ring's layer has
  // its own, sized in the state slot above).
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const CacheSpec cache = forward->layers_[l].mixer->cache(l);
    if (cache.kind != CacheSpec::Kind::kPagedKv) continue;
    if (cache.kv_heads != kv.num_kv_heads || cache.head_dim != kv.head_dim ||
        cache.keys_only != kv.keys_only) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV pool geometry (kv heads ", kv.num_kv_heads, ", head dim ", kv.head_dim,
          kv.keys_only ? ", keys only" : "", ") does not match layer ", l, "'s attention (",
          cache.kv_heads, ", ", cache.head_dim, cache.keys_only ? ", keys only" : "", ")"));
    }
  }
  return forward;
}

absl::Status ForwardPass::ValidateMask(const ExpertMask* mask) const {
  const model::ModelConfig& c = w_->config;
  // With a provider, expert weights come from it, whatever the model holds.
  const bool partial = provider_ == nullptr && !w_->resident.retained.empty();
  if (mask == nullptr || mask->retained.empty()) {
    if (!partial) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "this engine holds only some experts' weights (a pruning plan's); its steps need a mask "
        "that retains no others");
  }
  if (static_cast<int64_t>(mask->retained.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError("expert mask must have one entry per layer");
  }
  for (size_t l = 0; l < mask->retained.size(); ++l) {
    const std::vector<bool>& layer = mask->retained[l];
    const int64_t kept = std::count(layer.begin(), layer.end(), true);
    if (static_cast<int64_t>(layer.size()) != c.num_local_experts || kept < c.num_experts_per_tok) {
      return absl::InvalidArgumentError(absl::StrCat("expert mask layers need ",
                                                     c.num_local_experts, " entries with at least ",
                                                     c.num_experts_per_tok, " retained"));
    }
    for (size_t e = 0; partial && e < layer.size(); ++e) {
      if (layer[e] && !w_->HasExpert(static_cast<int>(l), static_cast<int>(e))) {
        return absl::InvalidArgumentError(absl::StrCat("the expert mask retains expert ", e,
                                                       " of layer ", l,
                                                       ", whose weights this engine did not load"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ForwardPass::Validate(absl::Span<const StepInput> batch, const MoeOptions& moe) const {
  const model::ModelConfig& c = w_->config;
  // The step's controls are checked only if some sequence runs them.
  if (std::any_of(batch.begin(), batch.end(), [](const StepInput& in) { return !in.moe; })) {
    RETURN_IF_ERROR(ValidateMask(moe.mask));
  }
  const ExpertMask* checked = nullptr;  // sequences usually share one mask
  const int block_size = pool_->config().block_size;
  for (size_t s = 0; s < batch.size(); ++s) {
    const StepInput& in = batch[s];
    if (in.tokens.empty())
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": no tokens"));
    if (in.block_table == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": no block table"));
    }
    if (pool_->config().num_state_slots > 0 && in.block_table->state_slot() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s, ": no state slot for the model's recurrent layers or window rings"));
    }
    const int64_t end = static_cast<int64_t>(in.start_position) + in.tokens.size();
    if (in.start_position < 0 || end > c.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, ": positions [", in.start_position, ", ", end,
                       ") outside the context length ", c.max_position_embeddings));
    }
    if (static_cast<int64_t>(in.block_table->blocks().size()) * block_size < end) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": block table holds ",
                                                     in.block_table->blocks().size() * block_size,
                                                     " tokens, the step needs ", end));
    }
    for (int32_t token : in.tokens) {
      if (token < 0 || token >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": token id ", token, " outside the vocabulary"));
      }
    }
    const DecoderOverlay* overlay = in.moe != nullptr ? in.moe->overlay : moe.overlay;
    if (overlay != nullptr && static_cast<int64_t>(overlay->layers.size()) != c.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": the decoder overlay has ",
                                                     overlay->layers.size(), " layers, the model ",
                                                     c.num_hidden_layers));
    }
    if (in.moe != nullptr && (in.moe->mask != checked || checked == nullptr)) {
      if (absl::Status status = ValidateMask(in.moe->mask); !status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", status.message()));
      }
      checked = in.moe->mask;
    }
  }
  return absl::OkStatus();
}

absl::Status ForwardPass::Step(absl::Span<const StepInput> batch, const MoeOptions& moe,
                               std::vector<std::vector<float>>* logits, RouterTrace* trace) {
  if (absl::Status s = Validate(batch, moe); !s.ok()) return s;
  if (trace != nullptr) *trace = RouterTrace();
  ctx_.router = router_.get();
  ctx_.observer = observer_;
  ctx_.provider = provider_;
  ctx_.Begin(batch, moe, backend_ != nullptr ? backend_ : &k::ActiveBackend(), trace);
  const model::ModelConfig& c = w_->config;
  const int T = ctx_.tokens();
  const int hidden = static_cast<int>(c.hidden_size);
  const float eps = static_cast<float>(c.rms_norm_eps);
  Resize(x_, T, hidden);
  Resize(out_, T, hidden);
  Resize(ctx_.h, T, hidden);
  ctx_.ops->embed(w_->embed.data.data(), hidden, ctx_.ids.data(), T, x_.data());
  if (embedding_scale_ != 1.0f) ctx_.ops->scale(x_.data(), T * hidden, embedding_scale_);
  ctx_.x = x_.data();
  // Each layer: x += mixer(norm(x)), then x += ffn(norm(x)), each norm the run's (the model's
  // or a decoder overlay's); with sandwich norms each block's output is normed too before its
  // add, and with a layer scalar the layer's output is scaled (Gemma 4).
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (const auto& [block, norm, post_norm] :
         {std::tuple{layers_[l].mixer, &LayerWeights::attn_norm, &LayerWeights::post_attn_norm},
          std::tuple{layers_[l].ffn, &LayerWeights::ffn_norm, &LayerWeights::post_ffn_norm}}) {
      for (const StepContext::RowRun& run : ctx_.runs) {
        ctx_.ops->rms_norm(Row(x_, run.begin, hidden), run.end - run.begin, hidden,
                           (ctx_.AlwaysOn(run, l).*norm).data(), eps,
                           Row(ctx_.h, run.begin, hidden));
      }
      RETURN_IF_ERROR(block->Forward(l, ctx_, out_.data()));
      for (const StepContext::RowRun& run : ctx_.runs) {
        const std::vector<float>& weight = ctx_.AlwaysOn(run, l).*post_norm;
        if (weight.empty()) break;
        ctx_.ops->rms_norm(Row(out_, run.begin, hidden), run.end - run.begin, hidden, weight.data(),
                           eps, Row(out_, run.begin, hidden));
      }
      ctx_.ops->add_rows(out_.data(), T, hidden, nullptr, nullptr, x_.data());
    }
    for (const StepContext::RowRun& run : ctx_.runs) {
      const std::vector<float>& scalar = ctx_.AlwaysOn(run, l).layer_scalar;
      if (scalar.empty()) break;
      ctx_.ops->scale(Row(x_, run.begin, hidden), (run.end - run.begin) * hidden, scalar[0]);
    }
  }
  Logits(batch, moe, logits);
  return absl::OkStatus();
}

void ForwardPass::Logits(absl::Span<const StepInput> batch, const MoeOptions& moe,
                         std::vector<std::vector<float>>* logits) {
  // Final norm and lm_head, only for the rows whose logits are wanted, gathered into one
  // product: the lm_head is read once per step, not once per sequence.
  const model::ModelConfig& c = w_->config;
  const int hidden = static_cast<int>(c.hidden_size);
  const int vocab = static_cast<int>(c.vocab_size);
  const float eps = static_cast<float>(c.rms_norm_eps);
  logits->resize(batch.size());
  std::vector<int> wanted(batch.size());  // rows of logits per sequence
  int only = -1;
  logit_rows_.clear();
  for (size_t s = 0, first = 0; s < batch.size(); ++s) {
    const int n = static_cast<int>(batch[s].tokens.size());
    wanted[s] = batch[s].logits == LogitRows::kAll    ? n
                : batch[s].logits == LogitRows::kLast ? 1
                                                      : 0;
    (*logits)[s].resize(static_cast<size_t>(wanted[s]) * vocab);
    if (wanted[s] > 0) {
      only = logit_rows_.empty() ? static_cast<int>(s) : -1;
      for (int i = n - wanted[s]; i < n; ++i) logit_rows_.push_back(static_cast<int>(first) + i);
    }
    first += n;
  }
  const int total = static_cast<int>(logit_rows_.size());
  if (total == 0) return;
  Resize(out_, total, hidden);
  ctx_.ops->gather_rows(x_.data(), hidden, logit_rows_.data(), total, hidden, out_.data(), hidden);
  for (size_t s = 0, row = 0; s < batch.size(); ++s) {  // each with its final norm
    if (wanted[s] == 0) continue;
    const DecoderOverlay* overlay = (batch[s].moe != nullptr ? *batch[s].moe : moe).overlay;
    const std::vector<float>& norm = overlay != nullptr ? overlay->final_norm : w_->final_norm;
    ctx_.ops->rms_norm(Row(out_, static_cast<int>(row), hidden), wanted[s], hidden, norm.data(),
                       eps, Row(ctx_.h, static_cast<int>(row), hidden));
    row += wanted[s];
  }
  const float cap = static_cast<float>(c.final_logit_softcap);
  if (only >= 0) {  // one sequence wants logits: straight into its output
    ctx_.Linear(ctx_.h.data(), total, w_->lm_head.view(), (*logits)[only].data());
    if (cap > 0) ctx_.ops->soft_cap((*logits)[only].data(), total * vocab, cap);
    return;
  }
  Resize(logits_, total, vocab);
  ctx_.Linear(ctx_.h.data(), total, w_->lm_head.view(), logits_.data());
  if (cap > 0) ctx_.ops->soft_cap(logits_.data(), total * vocab, cap);
  for (size_t s = 0, row = 0; s < batch.size(); ++s) {
    if (wanted[s] == 0) continue;  // an empty vector's data() may be null, even for memcpy
    std::memcpy((*logits)[s].data(), Row(logits_, static_cast<int>(row), vocab),
                (*logits)[s].size() * sizeof(float));
    row += wanted[s];
  }
}

}  // namespace tandem::engine
