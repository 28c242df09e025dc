// The batched forward pass of an MoE transformer. One Step runs a batch of sequences, each
// contributing a span of tokens (a prefill chunk or one decode token) at known positions, writes
// what its layers keep (keys and values) into the paged KV cache through their block tables,
// and returns logits. A step embeds the tokens, then runs each layer as the architecture's
// recipe composed it (model::LayerSpec): its token mixer and its feed-forward block, each after
// its RMSNorm and with a residual add, each a Block (common/engine/layers: attention, MoE,
// dense MLP) emitting ops on a backend's op table (common/kernels/backend.h: the CPU backend's
// level in use, or one given at creation); then the final norm and the logits.
//
// A sequence whose options carry a decoder overlay (a distilled pruned decoder,
// common/engine/overlay.h) runs its norms, router, shared expert and dense MLPs instead of the
// model's; attention and routed experts are always the model's. Callers may assume Step is
// deterministic for the same batch, and that a sequence's result does not depend on which other
// sequences share its batch. A ForwardPass runs one Step at a time (it reuses its buffers); use
// one per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/engine/kv_cache.h"
#include "common/engine/layers/block.h"
#include "common/engine/model_weights.h"
#include "common/engine/step.h"
#include "common/kernels/backend.h"

namespace tandem::engine {

class ForwardPass {
 public:
  // `weights` and `pool` must outlive this object; the pool's geometry must match the model.
  // `backend`: the op table to run on (static storage); null runs each step on the CPU
  // backend's level in use then (kernels::cpu::ActiveBackend()).
  static absl::StatusOr<std::unique_ptr<ForwardPass>> Create(
      const ModelWeights* weights, KvBlockPool* pool, const kernels::Backend* backend = nullptr);

  // Uses `router` instead of the model's router weights from now on (null restores them).
  void SetRouterOverride(std::unique_ptr<RouterOverride> router) { router_ = std::move(router); }
  // Reports every expert group to `observer` from now on (null stops it); not owned.
  void SetExpertObserver(ExpertObserver* observer) { observer_ = observer; }
  // Takes expert weights from `provider` from now on instead of the model's (null restores
  // them); not owned. The model may then hold no experts at all.
  void SetExpertProvider(ExpertProvider* provider) { provider_ = provider; }

  // Runs one step; `moe` applies to every sequence without its own. `logits` gets one entry per
  // batch element: (rows, vocab) with rows = n for kAll, 1 for kLast and 0 (empty) for kNone.
  // INVALID_ARGUMENT for bad tokens, positions, block tables, masks or widths.
  absl::Status Step(absl::Span<const StepInput> batch, const MoeOptions& moe,
                    std::vector<std::vector<float>>* logits, RouterTrace* trace = nullptr);

  const StepStats& last_step_stats() const { return ctx_.stats; }
  const ModelWeights& weights() const { return *w_; }
  KvBlockPool* pool() const { return pool_; }

 private:
  // A layer: its token mixer, then its feed-forward block (blocks are shared between layers).
  struct Layer {
    Block* mixer = nullptr;
    Block* ffn = nullptr;
  };

  ForwardPass(const ModelWeights* weights, KvBlockPool* pool, const kernels::Backend* backend);
  absl::Status Validate(absl::Span<const StepInput> batch, const MoeOptions& moe) const;
  absl::Status ValidateMask(const ExpertMask* mask) const;
  // The rows of logits each sequence asked for (final norm, lm_head).
  void Logits(absl::Span<const StepInput> batch, const MoeOptions& moe,
              std::vector<std::vector<float>>* logits);

  const ModelWeights* w_;
  KvBlockPool* pool_;
  const kernels::Backend* const backend_;  // null: the CPU backend's active level
  std::unique_ptr<RouterOverride> router_;
  ExpertObserver* observer_ = nullptr;
  ExpertProvider* provider_ = nullptr;

  // One block of each kind the model has; layers_ point into them.
  std::unique_ptr<Block> attention_, latent_attention_, delta_net_, moe_, dense_, dense_and_moe_;
  // The embedding's scale (Gemma 4's sqrt(hidden), in the checkpoint's dtype as Hugging Face
  // applies it); 1: none.
  float embedding_scale_ = 1.0f;
  std::vector<Layer> layers_;
  StepContext ctx_;
  // Buffers reused across steps (sized by the largest step so far): the residual stream, a
  // block's output (also the rows whose logits are wanted), and logits.
  std::vector<float> x_, out_, logits_;
  std::vector<int32_t> logit_rows_;  // the step's rows whose logits are wanted
};

}  // namespace tandem::engine
