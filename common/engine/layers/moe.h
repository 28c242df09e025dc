// The MoE block: router logits (plus the router's bias where it has one: gpt-oss; Gemma 4's
// router reads the residual stream through a norm of its own), or a
// RouterOverride's -> the sequence's retained-expert mask
// (pruned experts get -inf) -> softmax -> top-k -> weights renormalised where norm_topk_prob
// says (Mixtral always), times Gemma 4's per-expert scales -> a width per (token, expert) from
// the sequence's width policy -> tokens grouped per (expert, width) -> expert FFNs at those
// widths (SwiGLU, Gemma's GeGLU, or gpt-oss's clamped SwiGLU with the experts' biases), widest
// expert first, from
// the model's weights or an ExpertProvider -> the weighted sum, plus the always-on shared
// expert where the model has one (scaled by its sigmoid gate, or not: model::ModelConfig's
// shared_expert_gated). A sequence's decoder overlay supplies its router and shared expert.
#pragma once

#include <cstdint>
#include <vector>

#include "common/engine/layers/block.h"

namespace tandem::engine {

class MoeBlock : public Block {
 public:
  explicit MoeBlock(const model::ModelConfig& config);

  absl::Status Forward(int layer, StepContext& ctx, float* out) override;

 private:
  // A token's routed pair of the current layer, under its expert.
  struct Routed {
    int token;
    int width;
    float weight;
  };
  // The routed pairs of layer l into routed_ (masked softmax, top-k, renormalising, widths),
  // over ctx.h; the layer's decisions into ctx.trace.
  absl::Status Route(int l, StepContext& ctx);
  // out (tokens, hidden) = the routed experts' weighted outputs: every expert of the layer in,
  // then in waves of experts (all of them in decode): their gate and up products in one pass
  // over the threads, their downs in another (Backend::linear_group), summed widest expert
  // first.
  absl::Status RunExperts(int l, StepContext& ctx, float* out);
  // out += the shared expert of layer l.
  void SharedExpert(int l, StepContext& ctx, float* out);

  // Buffers reused across steps (sized by the largest step so far).
  std::vector<std::vector<Routed>> routed_;  // (experts) x routed pairs
  std::vector<ExpertLoad> loads_;
  std::vector<float> router_logits_;
  std::vector<float> router_in_;  // (tokens, hidden): Gemma 4's router input
  std::vector<int32_t> chosen_;   // (tokens, top_k)
  std::vector<float> chosen_w_;
  std::vector<int> chosen_width_;
  std::vector<float> mask_bias_;  // (experts,): 0, or -inf for an expert a mask leaves out
  // A wave's gate, up and act values at most (or one run's, when larger): 128K floats, 1.5 MB
  // for the three, which a core's L2 cache mostly keeps between the products that write and
  // read them. A decode step's experts are one wave; a long prefill chunk's are several.
  static constexpr int64_t kWaveValues = int64_t{1} << 17;
  // One width's pairs of an expert: rows [row, row + m) of expert_in_ / expert_out_, and its
  // gate, up and act values (m, width) from `offset`.
  struct ExpertRun {
    ExpertView view;
    int expert;
    int width;
    int m;
    int64_t row;
    int64_t offset;
    int64_t end() const { return offset + int64_t{m} * width; }  // past its values
  };
  std::vector<ExpertRun> runs_;
  std::vector<kernels::LinearProduct> products_;
  std::vector<float> expert_in_, gate_, up_, act_, expert_out_;
  std::vector<float> shared_out_, shared_scale_;
  // Every run's pairs in turn: their tokens (rows of h and out) and routing weights.
  std::vector<int32_t> pair_tokens_;
  std::vector<float> pair_weights_;
};

}  // namespace tandem::engine
