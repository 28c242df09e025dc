// Continuous batching over one ForwardPass. Sequences join (Add) and leave (they finish, fail
// or are cancelled) between steps. Each Step builds one batch: first the next token of every
// running sequence that is decoding, then prefill chunks in what is left of the token budget,
// oldest sequence first (vLLM's chunked prefill with decode priority). KV blocks are reserved
// as sequences grow. When the pool runs dry a decode preempts the newest running sequence: its
// blocks are freed and its tokens recomputed when it runs again (vLLM's recompute
// preemption). Batching, chunking and preemption do not change a sequence's tokens beyond the
// forward pass's batch invariance (1e-5 relative on logits).
//
// Not thread-safe: one thread owns a Scheduler (a service's engine executor).
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/forward.h"
#include "common/engine/sampling.h"
#include "common/model/tokenizer.h"
#include "common/structured/constraint.h"

namespace tandem::engine {

enum class SequenceId : int64_t {};

struct SchedulerConfig {
  int max_running = 64;       // sequences holding KV blocks at once
  int max_step_tokens = 512;  // tokens per step, decode and prefill together; >= max_running
  // Phase-aware MoE controls (colocated mode): prompt tokens run `prefill`, generated tokens
  // `decode`. Not owned; the defaults run the full pool.
  MoeOptions prefill = {};
  MoeOptions decode = {};
  // Prefix caching, when the pool's prefix cache is on (docs/kv-cache.md "Prefix cache"): a
  // sequence's full prompt blocks are published as they are computed, and a sequence starting
  // (or restarting after a preemption) takes the longest run of cached blocks that match its
  // tokens and computes only the rest, always at least its last token. `prefix_salt` stands for
  // the prefill setting (the experts `prefill` runs), so blocks of another setting never
  // match. Blocks of generated tokens are computed under `decode` and published only with
  // `cache_generated`, which the owner sets when decode runs the same experts as prefill.
  uint64_t prefix_salt = 0;
  bool cache_generated = false;
};

struct SequenceRequest {
  std::vector<int32_t> prompt_ids;  // (n,) n >= 1, BOS included if the model wants one
  SamplingParams params;
  // Prefill only (a prefill instance): the sequence ends with the first token it samples,
  // before any stop rule (the decoder applies them), and hands its prompt's KV out
  // (SequenceOutput::prompt_kv). Stop strings are allowed without a tokenizer.
  bool prefill_only = false;
};

// A prompt's KV blocks handed out by a prefill-only sequence: `table` holds the prompt's
// tokens, in blocks of `pool`. The blocks are released when the last holder lets go.
class PromptKv {
 public:
  PromptKv(KvBlockPool* pool, BlockTable table) : pool_(pool), table_(std::move(table)) {}
  ~PromptKv() { table_.ReleaseAll(pool_); }
  PromptKv(const PromptKv&) = delete;
  PromptKv& operator=(const PromptKv&) = delete;

  KvBlockPool* pool() const { return pool_; }
  const BlockTable& table() const { return table_; }

 private:
  KvBlockPool* const pool_;
  BlockTable table_;
};

// What one sequence did in a step.
struct SequenceOutput {
  SequenceId id;
  std::optional<int32_t> token;  // the token sampled this step
  std::string text;              // text released this step (needs a tokenizer)
  FinishReason finish = FinishReason::kNone;
  absl::Status status;  // not OK: the sequence failed and is gone
  // With params.logprobs >= 0: `token`'s log-probabilities.
  std::optional<TokenLogprobs> logprobs;
  // With params.prompt_logprobs >= 0, on the sequence's first output only: those of prompt
  // tokens 1..n-1 (entry i is token i + 1's, given the tokens before it). A sequence with
  // max_tokens 0 has only that output: no token, finish kLength.
  std::vector<TokenLogprobs> prompt_logprobs;
  // A prefill-only sequence's last output (with its token, finish kLength): the prompt's KV.
  std::shared_ptr<const PromptKv> prompt_kv;
};

struct SchedulerCounters {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;  // recomputed tokens included
  int64_t decode_tokens = 0;
  int64_t preemptions = 0;
  // Prefix cache: tokens of sequences looked up when they started, and how many of them came
  // from cached blocks (not computed).
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
};

class Scheduler {
 public:
  // `forward` must outlive the scheduler and be used by nobody else while it lives.
  // `tokenizer` may be null: outputs then carry no text and stop strings are refused.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(ForwardPass* forward,
                                                           const model::Tokenizer* tokenizer,
                                                           int32_t eos_token_id,
                                                           const SchedulerConfig& config);
  ~Scheduler();

  // Queues a sequence. INVALID_ARGUMENT for an empty prompt, out-of-vocabulary tokens, bad
  // sampling params (an output constraint that does not compile included), or a prompt that leaves
  // no room in the context or the KV pool.
  absl::StatusOr<SequenceId> Add(SequenceRequest request);
  // The checks Add makes, without adding; safe from any thread while another steps.
  absl::Status Validate(const SequenceRequest& request) const;
  // Adds a sequence whose prompt KV another engine already wrote into `table` (blocks of this
  // scheduler's pool, holding prompt_ids.size() tokens) and whose first token it sampled with
  // the same sampling params. The sequence decodes from there: the next Step emits
  // `first_token` (stop rules applied), later steps the rest. It is never preempted, since
  // this engine may not be able to recompute the prompt (a pruned decoder); reserve its blocks
  // for prompt + max_tokens up front. The scheduler takes the table's blocks (released when
  // the sequence ends). `first_logprobs`, if given, is emitted with the first token.
  // INVALID_ARGUMENT as Add, for max_tokens 0, or if the table does not hold the prompt.
  absl::StatusOr<SequenceId> AddPrefilled(SequenceRequest request, BlockTable table,
                                          int32_t first_token,
                                          std::optional<TokenLogprobs> first_logprobs = {});
  // Drops a waiting or running sequence and frees its blocks; false if it is not here.
  bool Cancel(SequenceId id);

  // Runs one step, if there is work, and appends one output per sequence that sampled a
  // token, finished or failed. An error is returned only for a failure of the step itself;
  // the sequences in that step then fail with it (outputs say so) and the rest carry on.
  absl::Status Step(std::vector<SequenceOutput>* outputs);

  bool idle() const { return running_.empty() && waiting_.empty(); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  KvBlockPool* pool() const { return forward_->pool(); }
  const SchedulerCounters& counters() const { return counters_; }

 private:
  struct Sequence;

  Scheduler(ForwardPass* forward, const model::Tokenizer* tokenizer, int32_t eos_token_id,
            const SchedulerConfig& config);
  // The matcher of `request`'s output constraint, if it has one.
  absl::StatusOr<std::optional<structured::GrammarMatcher>> Matcher(const SequenceRequest& request);
  // Frees `seq`'s blocks and puts it at the front of the waiting queue.
  void Preempt(Sequence* seq);
  // Releases `seq`'s blocks: nothing of it is computed or published any more.
  void DropKv(Sequence* seq);
  // Reserves KV for `seq` up to `num_tokens`, preempting newer running sequences if needed.
  // False when `seq` itself had to be preempted.
  bool ReserveOrPreempt(Sequence* seq, int num_tokens);
  // How many of `len` more tokens of `seq` fit in its blocks and the free ones.
  int Fit(const Sequence* seq, int len) const;
  // Samples from `logits` and applies the stop rules; fills `out`.
  void Sample(Sequence* seq, absl::Span<const float> logits, SequenceOutput* out);
  // Draws a token from `logits` (with its log-probabilities in `out` when asked), among those
  // its output constraint allows; nothing else.
  absl::StatusOr<int32_t> Draw(Sequence* seq, absl::Span<const float> logits, SequenceOutput* out);
  // Appends `token` to `seq` and applies the stop rules; fills `out`.
  void Accept(Sequence* seq, int32_t token, SequenceOutput* out);
  void Remove(Sequence* seq);
  // For a sequence holding no blocks: takes the longest run of cached blocks matching its
  // tokens into its table and returns how many tokens they hold.
  int ReuseCachedPrefix(Sequence* seq);
  // Publishes `seq`'s blocks that are now full and may be cached.
  void PublishBlocks(Sequence* seq);

  ForwardPass* const forward_;
  const model::Tokenizer* const tokenizer_;
  const int32_t eos_token_id_;
  const SchedulerConfig config_;
  // Output constraints compiled for this engine's vocabulary (used from Validate's threads too).
  mutable structured::GrammarCache grammars_;
  std::vector<float> constrained_;  // scratch: a row of logits under its constraint
  int64_t next_id_ = 1;
  std::list<std::unique_ptr<Sequence>> running_;  // admission order, oldest first
  std::deque<std::unique_ptr<Sequence>> waiting_;
  absl::flat_hash_map<SequenceId, Sequence*> by_id_;
  SchedulerCounters counters_;
};

}  // namespace tandem::engine
