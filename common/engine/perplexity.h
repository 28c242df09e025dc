// Perplexity of a model on a text file, by the evaluation protocol of tools/train/data.py that
// the shipped splits and golden files were measured with: each non-blank line of the file is
// one document, encoded without BOS or EOS, with EOS appended, and cut into consecutive chunks
// of at most `window` tokens; each chunk c is scored as input [BOS] + c with targets c, so every
// token of every document, and its EOS, is predicted exactly once. Perplexity is exp(mean
// negative log-likelihood), the log-probabilities taken from the log-softmax of the float32
// logits. This is what `tandem perplexity` runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/forward.h"
#include "common/engine/model_weights.h"
#include "common/model/tokenizer.h"

namespace tandem::engine {

struct PerplexityOptions {
  // The longest chunk of targets; a window runs window + 1 positions (BOS first), which must fit
  // in the model's context. 511 is the protocol's, for a 512-token context.
  int window = 511;
  // Positions one forward step may run: windows are batched into steps up to this many (and up
  // to the KV blocks, and with recurrent layers the state slots, free in the pool), each step
  // holding at least one window. The result does
  // not depend on it; it trades memory ((positions, vocab) float logits) for speed.
  int max_step_tokens = 2048;
  // Applies to every window (the defaults run the whole model).
  MoeOptions moe;
  // A prompt / continuation split, as served (`tandem eval`): when > 0, each window's first
  // `context` targets are its prompt, run as one prefill with `context_moe`; the prefill's
  // last row predicts the first continuation target, and the rest of the window runs with `moe`
  // on the prompt's KV cache, teacher-forced. Only continuation targets are scored, and windows
  // of `context` targets or fewer are skipped. 0 scores every target with `moe`.
  int context = 0;
  MoeOptions context_moe;
  // How the KV cache stores keys and values (the overload that makes its own pool).
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
};

struct PerplexityResult {
  int64_t documents = 0;
  int64_t windows = 0;    // windows scored
  int64_t tokens = 0;     // scored tokens (the documents' tokens, EOS included, less prompts)
  double nll = 0;         // mean negative log-likelihood per scored token, in nats
  double perplexity = 0;  // exp(nll)
  double accuracy = 0;    // share of scored tokens that were the most likely (first of ties)
  // Per scored token, in document order: its log-probability, whether it was the most likely,
  // and its offset in its window's continuation (0 = the first after the prompt; without a
  // prompt, its offset in the window).
  std::vector<float> logprobs;
  std::vector<char> top1;
  std::vector<int32_t> offsets;
};

// One window of the protocol: targets scored[begin, begin + size), run as [BOS] + those.
struct ProtocolWindow {
  int64_t begin = 0;
  int size = 0;
};

// A text file read by the protocol: every target in order (documents back to back, each with
// its EOS) and the windows over them.
struct ProtocolText {
  std::vector<int32_t> scored;
  std::vector<ProtocolWindow> windows;
  int64_t documents = 0;
};

// NOT_FOUND naming the path when the file does not exist; INVALID_ARGUMENT when it holds no
// document, for a bad window, or when the tokenizer has no BOS or EOS. `tandem calibrate` reads
// its calibration text the same way.
absl::StatusOr<ProtocolText> ReadProtocolText(const model::Tokenizer& tokenizer,
                                              const std::string& text_path, int window);

// Scores the documents of `text_path` with `forward`, taking KV blocks from forward->pool() and
// releasing them before returning. NOT_FOUND naming the path when the file does not exist;
// INVALID_ARGUMENT when it holds no document, for bad options, or when the tokenizer has no BOS
// or EOS; RESOURCE_EXHAUSTED when the pool's free blocks cannot hold one window.
absl::StatusOr<PerplexityResult> EvaluatePerplexity(ForwardPass* forward,
                                                    const model::Tokenizer& tokenizer,
                                                    const std::string& text_path,
                                                    const PerplexityOptions& options = {});

// The same on `weights`, with a KV pool and forward pass of its own sized for
// options.max_step_tokens.
absl::StatusOr<PerplexityResult> EvaluatePerplexity(const ModelWeights& weights,
                                                    const model::Tokenizer& tokenizer,
                                                    const std::string& text_path,
                                                    const PerplexityOptions& options = {});

}  // namespace tandem::engine
