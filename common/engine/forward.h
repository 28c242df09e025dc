// The batched forward pass of a Mixtral-style MoE transformer. One Step runs a batch of
// sequences, each contributing a span of tokens (a prefill chunk or one decode token) at known
// positions, writes their keys and values into the paged KV cache through their block tables,
// and returns logits. A step is a short sequence of ops — embed, then per layer attention,
// route, experts (or a dense MLP), then logits — each calling a backend's op table
// (common/kernels/backend.h): the CPU backend's level in use, or one given at creation.
//
// MoE layer, per the design: router logits -> retained-expert mask (pruned experts get -inf)
// -> softmax -> top-k -> weights renormalised where norm_topk_prob says (Mixtral always) ->
// width per (token, expert) -> tokens grouped per (expert, width) -> expert FFN at that width
// -> weighted sum, plus the always-on shared expert scaled by its sigmoid gate (Qwen2-MoE). A
// dense layer (Qwen's decoder_sparse_step / mlp_only_layers) runs its MLP on every token, and
// masks, width policies and providers do not apply to it. Attention adds the projections'
// biases and the per-head q/k RMSNorm (Qwen3-MoE) where the model has them. A sequence whose
// options carry a decoder overlay (a distilled pruned decoder, common/engine/overlay.h) runs
// its norms, router, shared expert and dense MLPs instead of the model's; attention and routed
// experts are always the model's. Callers may assume
// Step is deterministic for the same batch, and that a sequence's result does not depend on
// which other sequences share its batch. A ForwardPass runs one Step at a time (it reuses its
// buffers); use one per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/engine/kv_cache.h"
#include "common/engine/model_weights.h"
#include "common/kernels/backend.h"

namespace tandem::engine {

// Which rows of logits a sequence wants back from a step.
enum class LogitRows {
  kNone,  // an intermediate prefill chunk: only its KV matters
  kLast,  // the next-token distribution
  kAll,   // every position (perplexity, tests)
};

// The width each routed (token, expert) pair runs at: how many of the expert's intermediate
// neurons it uses. Checkpoints for mixed width store neurons in importance order, so width w
// reads the first w gate and up rows and the first w down columns; 0 skips the expert; the
// intermediate size is the whole expert. The policy may also change the router weights the
// pairs are summed with (a tier that skips an expert renormalises over the ones that run);
// otherwise they are applied as routed. Implementations must be deterministic and safe to call
// from the stepping thread.
class ExpertWidthPolicy {
 public:
  virtual ~ExpertWidthPolicy() = default;
  // experts (top_k,): one token's routed experts in descending router weight, with their
  // weights (top_k,), which it may rewrite; fills widths (top_k,) with values in
  // [0, intermediate_size].
  virtual void Widths(int layer, absl::Span<const int32_t> experts, absl::Span<float> weights,
                      absl::Span<int> widths) const = 0;
};

// Replaces the learned router with a stated one (`--load-format dummy`, whose random router
// says nothing about real routing). Deterministic in its arguments, so batching and chunking
// do not change a sequence's routing.
class RouterOverride {
 public:
  virtual ~RouterOverride() = default;
  // Fills logits (experts,) for `token` at `position` in `layer`.
  virtual void Logits(int layer, int32_t token, int position, absl::Span<float> logits) const = 0;
};

// Sees every expert group a step runs, for calibration (`tandem calibrate`): which tokens (rows
// of the step, in batch token order) went to `expert` of `layer` at `width`, their activations
// act (rows, width) = silu(gate) * up and the expert's outputs out (rows, hidden) before the
// router weight. Called on the stepping thread; the pointers are valid during the call only.
class ExpertObserver {
 public:
  virtual ~ExpertObserver() = default;
  virtual void OnExpert(int layer, int expert, int width, absl::Span<const int> tokens,
                        const float* act, const float* out) = 0;
};

// Expert weights that are not all resident (mixed width with host-offloaded experts): the
// forward pass asks for each layer's experts, widest first, and computes each as soon as it
// is in, so that wide experts' compute hides narrow experts' loads.
struct ExpertLoad {
  int expert = 0;
  int width = 0;  // the widest the step runs it at
};
// One expert's first `width` neurons or more, packed as the model's experts are: gate and up
// (>= width, hidden), down (hidden, >= width) with the neurons in the first columns.
struct ExpertView {
  kernels::PackedMatrix gate, up, down;
};
class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  // The step runs `loads` (distinct experts, widest first) of `layer`: start bringing them in,
  // in that order.
  virtual absl::Status BeginLayer(int layer, absl::Span<const ExpertLoad> loads) = 0;
  // The expert, once in; valid until EndLayer.
  virtual absl::StatusOr<ExpertView> Wait(int layer, int expert, int width) = 0;
  virtual void EndLayer(int layer) = 0;
};

struct DecoderOverlay;  // common/engine/overlay.h

// Per-step MoE controls; the defaults run every expert at full width with the model's weights.
struct MoeOptions {
  const ExpertMask* mask = nullptr;
  const ExpertWidthPolicy* widths = nullptr;
  // A distilled decoder's always-on tensors (norms, routers, shared experts, dense MLPs) in
  // place of the model's; attention and routed experts stay the model's. Not owned.
  const DecoderOverlay* overlay = nullptr;
};

struct StepInput {
  absl::Span<const int32_t> tokens;   // (n,) n >= 1
  int start_position = 0;             // position of tokens[0]; earlier positions are in the cache
  BlockTable* block_table = nullptr;  // capacity for start_position + n tokens, reserved
  LogitRows logits = LogitRows::kLast;
  // This sequence's MoE controls, instead of the step's (colocated mode: a prefill chunk runs
  // the full pool while decode tokens in the same step run the pruned one). Not owned.
  const MoeOptions* moe = nullptr;
};

// Router decisions of one Step, rows in batch token order, for calibration and tests.
struct RouterTrace {
  std::vector<std::vector<float>> probs;      // (layers) x (tokens, experts), after masking
  std::vector<std::vector<int32_t>> experts;  // (layers) x (tokens, top_k)
  std::vector<std::vector<float>> weights;    // (layers) x (tokens, top_k)
  std::vector<std::vector<int32_t>> widths;   // (layers) x (tokens, top_k)
};

// What the last Step did, for benchmarks and metrics.
struct StepStats {
  int64_t tokens = 0;               // tokens run
  int64_t weight_bytes = 0;         // bytes of (packed) weight matrices the step read, once each
  int64_t expert_weight_bytes = 0;  // the part of weight_bytes that is expert FFNs
  int64_t expert_runs = 0;          // (expert, width) groups run, over all layers
  int64_t matmul_flops = 0;         // 2 * rows * n * d summed over the weight products
  // Attention over the KV cache (the paged kernels and the merge of split contexts, not the
  // projections): bytes of K and V (and int8 scales) read, once per (token, KV head, position),
  // and wall time over all layers.
  int64_t kv_bytes = 0;
  double attention_seconds = 0;
};

// The width an expert of `config` runs at when asked for `width` neurons: quantized experts
// run whole quantization groups (a multiple of the group size, at most the expert's width);
// bf16 experts exactly `width`.
int ExpertRunWidth(const model::ModelConfig& config, int width);

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

  const StepStats& last_step_stats() const { return stats_; }
  const ModelWeights& weights() const { return *w_; }
  KvBlockPool* pool() const { return pool_; }

 private:
  // Where a token of the batch comes from.
  struct TokenRef {
    int seq;        // index into the batch
    int position;   // absolute position in its sequence
    int32_t token;  // token id
  };

  ForwardPass(const ModelWeights* weights, KvBlockPool* pool, const kernels::Backend* backend)
      : w_(weights), pool_(pool), backend_(backend) {}
  absl::Status Validate(absl::Span<const StepInput> batch, const MoeOptions& moe) const;
  absl::Status ValidateMask(const ExpertMask* mask) const;

  // The ops of a step, in order. Each reads and writes the step's buffers.
  // Lays out the step's tokens (refs_), runs of rows sharing always-on weights, and buffers.
  void Prepare(absl::Span<const StepInput> batch, const MoeOptions& moe);
  // x_ (T, hidden) = the tokens' embeddings.
  void Embed();
  // x_ += attention of layer l (RMSNorm, projections, q/k norm, RoPE, K/V into the cache,
  // paged attention, output projection).
  void Attention(int l, absl::Span<const StepInput> batch);
  // The routed pairs of layer l into routed_ (masked softmax, top-k, renormalising, widths),
  // over h_ (the normalised residual).
  absl::Status Route(int l, absl::Span<const StepInput> batch, const MoeOptions& moe,
                     RouterTrace* trace);
  // Expert FFNs of layer l over the routed tokens, widest expert first; their weighted outputs
  // into moe_ (overwritten).
  absl::Status RunExperts(int l);
  // moe_ += the gated shared expert of layer l.
  void SharedExpert(int l);
  // moe_ = the dense MLP of layer l.
  void DenseMlp(int l);
  // The rows of logits each sequence asked for (final norm, lm_head).
  void Logits(absl::Span<const StepInput> batch, const MoeOptions& moe,
              std::vector<std::vector<float>>* logits);

  // out (rows, w.rows) = in (rows, w.cols) @ W^T on the backend, counted in stats_; `exact`
  // keeps activations float32 (the router).
  void Linear(const float* in, int rows, const kernels::PackedMatrix& w, float* out,
              bool exact = false);
  // out (rows, hidden) = the SwiGLU MLP `w` (shared expert or dense layer) over rows
  // [row0, row0 + rows) of h_.
  void Mlp(const ExpertWeights& w, int row0, int rows, float* out);
  // The always-on tensors (norms, router, shared expert, dense MLP) of layer l for a run.
  struct RowRun;
  const LayerWeights& AlwaysOn(const RowRun& run, int l) const;

  const ModelWeights* w_;
  KvBlockPool* pool_;
  const kernels::Backend* const backend_;  // null: the CPU backend's active level
  const kernels::Backend* ops_ = nullptr;  // this step's
  std::vector<TokenRef> refs_;             // this step's tokens, in batch order
  std::unique_ptr<RouterOverride> router_;
  ExpertObserver* observer_ = nullptr;
  ExpertProvider* provider_ = nullptr;
  std::vector<ExpertLoad> loads_;
  StepStats stats_;

  // Buffers reused across steps (sized by the largest step so far).
  struct Routed {
    int token;
    int width;
    float weight;
  };
  std::vector<std::vector<Routed>> routed_;  // (experts) x routed pairs of the current layer
  std::vector<float> x_, h_, qkv_, q_, k_, v_, attn_, proj_, router_logits_, moe_;
  // Attention split along contexts: (T + 1) prefix sums of each token's parts, and the parts'
  // outputs (item, heads, head_dim) and log-sum-exps (item, heads).
  // A unit of attention work: `count` consecutive tokens of one sequence from refs_[first],
  // and where its parts' rows start in part_out_ when its context is split.
  struct AttentionUnit {
    int first;
    int count;
    int64_t part_row;
  };
  std::vector<AttentionUnit> units_;
  std::vector<int64_t> attention_parts_;
  std::vector<float> part_out_, part_lse_;
  std::vector<const float*> merge_out_;
  std::vector<float> merge_lse_;
  std::vector<float> expert_in_, gate_, up_, act_, expert_out_, logits_;
  std::vector<float> shared_out_, shared_scale_;
  std::vector<int32_t> chosen_;
  std::vector<float> chosen_w_;
  std::vector<int> chosen_width_;
  std::vector<int> observer_tokens_;
  // Consecutive rows of the step that share always-on weights (the model's or an overlay's).
  struct RowRun {
    int begin;
    int end;
    const DecoderOverlay* overlay;
  };
  std::vector<int> order_;  // expert indices, for top-k
  std::vector<RowRun> runs_;
};

}  // namespace tandem::engine
