#include "common/engine/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status.h"

namespace tandem::engine {

struct Scheduler::Sequence {
  Sequence(SequenceId id, SequenceRequest request, int32_t eos_token_id,
           const model::Tokenizer* tokenizer, std::optional<structured::GrammarMatcher> grammar)
      : id(id),
        tokens(std::move(request.prompt_ids)),
        prompt_len(static_cast<int>(tokens.size())),
        prefill_only(request.prefill_only),
        params(std::move(request.params)),
        sampler(params, tokens),
        stop(params, eos_token_id),
        grammar(std::move(grammar)) {
    if (tokenizer != nullptr) detok.emplace(tokenizer);
  }

  int pending() const { return static_cast<int>(tokens.size()) - num_computed; }
  bool decoding() const { return pending() == 1 && static_cast<int>(tokens.size()) > prompt_len; }

  const SequenceId id;
  std::vector<int32_t> tokens;  // prompt, then generated
  const int prompt_len;
  const bool prefill_only;
  int num_computed = 0;  // leading tokens whose KV is in the cache
  BlockTable table;
  const SamplingParams params;
  Sampler sampler;
  StopChecker stop;
  std::optional<structured::GrammarMatcher> grammar;  // params.constraint's state
  std::optional<model::StreamingDetokenizer> detok;
  bool running = false;
  bool scheduled = false;              // in the step being built
  bool pinned = false;                 // prefilled elsewhere: never preempted
  std::optional<int32_t> first_token;  // sampled elsewhere, emitted by the next step
  std::optional<TokenLogprobs> first_logprobs;
  // params.prompt_logprobs >= 0: collected as the prompt's chunks run, given with the first
  // output; recomputed chunks after a preemption do not collect them again.
  std::vector<TokenLogprobs> prompt_logprobs;
  bool prompt_scored = false;
  // Prefix cache: leading blocks that are published (or were taken from the cache), and the
  // key of the last of them (the chain's root when there is none).
  int published = 0;
  uint64_t chain_key = 0;
  bool wants_prompt_logprobs() const { return params.prompt_logprobs >= 0 && !prompt_scored; }
};

Scheduler::Scheduler(ForwardPass* forward, const model::Tokenizer* tokenizer, int32_t eos_token_id,
                     const SchedulerConfig& config)
    : forward_(forward),
      tokenizer_(tokenizer),
      eos_token_id_(eos_token_id),
      config_(config),
      grammars_(tokenizer) {}

Scheduler::~Scheduler() {
  for (auto& seq : running_) seq->table.ReleaseAll(forward_->pool());
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(ForwardPass* forward,
                                                             const model::Tokenizer* tokenizer,
                                                             int32_t eos_token_id,
                                                             const SchedulerConfig& config) {
  if (config.max_running < 1) return absl::InvalidArgumentError("max_running must be >= 1");
  if (config.max_step_tokens < config.max_running) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_step_tokens (", config.max_step_tokens, ") must be at least max_running (",
        config.max_running, ") so that every running sequence can decode in each step"));
  }
  return std::unique_ptr<Scheduler>(new Scheduler(forward, tokenizer, eos_token_id, config));
}

absl::Status Scheduler::Validate(const SequenceRequest& request) const {
  const model::ModelConfig& c = forward_->weights().config;
  const int n = static_cast<int>(request.prompt_ids.size());
  if (n == 0) return absl::InvalidArgumentError("prompt has no tokens");
  for (int32_t token : request.prompt_ids) {
    if (token < 0 || token >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", token, " outside the vocabulary of ", c.vocab_size));
    }
  }
  RETURN_IF_ERROR(request.params.Validate(static_cast<int>(c.vocab_size)));
  if (tokenizer_ == nullptr && !request.params.stop_strings.empty() && !request.prefill_only) {
    return absl::InvalidArgumentError("stop strings need a tokenizer; this engine has none");
  }
  if (request.params.constraint.has_value()) {
    RETURN_IF_ERROR(grammars_.Get(*request.params.constraint).status());
  }
  // A prompt that is only scored may fill the context; one that generates needs a position.
  if (request.params.max_tokens == 0 ? n > c.max_position_embeddings
                                     : n >= c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt has ", n, " tokens; the context length is ", c.max_position_embeddings));
  }
  const KvCacheConfig& kv = forward_->pool()->config();
  const int64_t blocks = (int64_t{n} + 1 + kv.block_size - 1) / kv.block_size;
  if (blocks > kv.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt needs ", blocks, " KV blocks; the whole pool has ", kv.num_blocks));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<structured::GrammarMatcher>> Scheduler::Matcher(
    const SequenceRequest& request) {
  if (!request.params.constraint.has_value()) return std::nullopt;
  ASSIGN_OR_RETURN(std::shared_ptr<structured::CompiledGrammar> grammar,
                   grammars_.Get(*request.params.constraint));
  // The tokens that end a sequence end a constrained one only where it is complete.
  std::vector<int32_t> end_tokens = request.params.stop_token_ids;
  if (!request.params.ignore_eos && eos_token_id_ >= 0) end_tokens.push_back(eos_token_id_);
  using Kind = structured::OutputConstraint::Kind;
  const Kind kind = request.params.constraint->kind;
  return structured::GrammarMatcher::Create(
      std::move(grammar), std::move(end_tokens),
      /*unique_keys=*/kind == Kind::kJsonSchema || kind == Kind::kJsonObject);
}

absl::StatusOr<SequenceId> Scheduler::Add(SequenceRequest request) {
  RETURN_IF_ERROR(Validate(request));
  ASSIGN_OR_RETURN(std::optional<structured::GrammarMatcher> grammar, Matcher(request));
  const SequenceId id{next_id_++};
  auto seq = std::make_unique<Sequence>(id, std::move(request), eos_token_id_, tokenizer_,
                                        std::move(grammar));
  by_id_[id] = seq.get();
  waiting_.push_back(std::move(seq));
  return id;
}

absl::StatusOr<SequenceId> Scheduler::AddPrefilled(SequenceRequest request, BlockTable table,
                                                   int32_t first_token,
                                                   std::optional<TokenLogprobs> first_logprobs) {
  const model::ModelConfig& c = forward_->weights().config;
  absl::Status status = Validate(request);
  if (status.ok() && request.params.max_tokens < 1) {
    status = absl::InvalidArgumentError("a prefilled sequence needs max_tokens >= 1");
  }
  if (status.ok() && request.prefill_only) {
    status = absl::InvalidArgumentError("a prefilled sequence cannot be prefill-only");
  }
  const int n = static_cast<int>(request.prompt_ids.size());
  const int block_size = forward_->pool()->config().block_size;
  if (status.ok() && (first_token < 0 || first_token >= c.vocab_size)) {
    status = absl::InvalidArgumentError(
        absl::StrCat("first token id ", first_token, " outside the vocabulary"));
  }
  if (status.ok() && (table.num_tokens() != n || table.capacity_tokens(block_size) < n + 1)) {
    status = absl::InvalidArgumentError(
        absl::StrCat("the block table holds ", table.num_tokens(), " tokens in room for ",
                     table.capacity_tokens(block_size), "; the prompt has ", n,
                     " and decoding needs room for one more"));
  }
  absl::StatusOr<std::optional<structured::GrammarMatcher>> grammar = std::nullopt;
  if (status.ok()) {
    grammar = Matcher(request);
    status = grammar.status();
  }
  if (!status.ok()) {
    table.ReleaseAll(forward_->pool());
    return status;
  }
  const SequenceId id{next_id_++};
  auto seq = std::make_unique<Sequence>(id, std::move(request), eos_token_id_, tokenizer_,
                                        *std::move(grammar));
  seq->table = std::move(table);
  seq->num_computed = n;
  seq->pinned = true;
  seq->running = true;
  seq->first_token = first_token;
  seq->first_logprobs = std::move(first_logprobs);
  seq->prompt_scored = true;  // by the engine that prefilled it
  seq->sampler.SkipDraw(first_token);
  by_id_[id] = seq.get();
  running_.push_back(std::move(seq));
  return id;
}

bool Scheduler::Cancel(SequenceId id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  Remove(it->second);
  return true;
}

void Scheduler::Remove(Sequence* seq) {
  seq->table.ReleaseAll(forward_->pool());
  by_id_.erase(seq->id);
  auto owned = [seq](const std::unique_ptr<Sequence>& p) { return p.get() == seq; };
  if (seq->running) {
    running_.remove_if(owned);
  } else {
    waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), owned), waiting_.end());
  }
}

int Scheduler::ReuseCachedPrefix(Sequence* seq) {
  KvBlockPool* pool = forward_->pool();
  seq->published = 0;
  if (!pool->prefix_cache_enabled()) return 0;
  seq->chain_key = pool->PrefixRoot(config_.prefix_salt);
  // Every prompt row is needed to score the prompt.
  if (seq->wants_prompt_logprobs()) return 0;
  const int block_size = pool->config().block_size;
  const int total = static_cast<int>(seq->tokens.size());
  const int cacheable = config_.cache_generated ? total : seq->prompt_len;
  // At least the last token is computed: its logits are what the next step samples from.
  const int max_blocks = std::min(cacheable, total - 1) / block_size;
  const absl::Span<const int32_t> tokens = seq->tokens;
  // The chain of cached blocks; with recurrent layers it is resumed only up to the last block
  // that holds a state snapshot (the state after its last token), and the rest is released.
  const bool stateful = pool->config().num_state_slots > 0;
  std::vector<int32_t> blocks;
  std::vector<uint64_t> keys;
  size_t keep = 0;
  uint64_t parent = seq->chain_key;
  for (int i = 0; i < max_blocks; ++i) {
    const absl::Span<const int32_t> block_tokens = tokens.subspan(i * block_size, block_size);
    const uint64_t key = pool->PrefixKey(parent, block_tokens);
    const int32_t block = pool->AcquireCached(parent, key, block_tokens);
    if (block < 0) break;
    blocks.push_back(block);
    keys.push_back(key);
    parent = key;
    if (!stateful || pool->HasStateSnapshot(block)) keep = blocks.size();
  }
  pool->Release(absl::MakeConstSpan(blocks).subspan(keep));
  for (size_t i = 0; i < keep; ++i) seq->table.AppendFull(pool, blocks[i]);
  if (keep > 0) seq->chain_key = keys[keep - 1];
  seq->published = static_cast<int>(keep);
  seq->num_computed = seq->published * block_size;
  if (stateful && keep > 0) {
    // The sequence's state slot, then the state at the end of its last cached block. The
    // snapshot may have gone to another block meanwhile: then nothing is reused.
    if (!seq->table.Reserve(pool, seq->num_computed).ok() ||
        !pool->RestoreState(blocks[keep - 1], seq->table.state_slot())) {
      DropKv(seq);
      seq->chain_key = pool->PrefixRoot(config_.prefix_salt);
      seq->published = 0;
      return 0;
    }
  }
  return seq->num_computed;
}

void Scheduler::PublishBlocks(Sequence* seq) {
  KvBlockPool* pool = forward_->pool();
  if (seq->pinned || !pool->prefix_cache_enabled()) return;
  const int block_size = pool->config().block_size;
  const int cacheable =
      config_.cache_generated ? seq->num_computed : std::min(seq->num_computed, seq->prompt_len);
  const absl::Span<const int32_t> tokens = seq->tokens;
  for (; seq->published < cacheable / block_size; ++seq->published) {
    const absl::Span<const int32_t> block_tokens =
        tokens.subspan(seq->published * block_size, block_size);
    const uint64_t key = pool->PrefixKey(seq->chain_key, block_tokens);
    // False when another sequence published the same block first: ours stays private, and
    // the chain goes on from the same key.
    pool->Publish(seq->table.blocks()[seq->published], seq->chain_key, key, block_tokens);
    // With recurrent layers, the state now in the sequence's slot is the state at the end of
    // the block published under `key` (ours or another sequence's) only where the step ended
    // there (prompt chunks are cut at block boundaries for this, in Step).
    if (seq->table.state_slot() >= 0 && (seq->published + 1) * block_size == seq->num_computed) {
      pool->SnapshotState(key, seq->table.state_slot());
    }
    seq->chain_key = key;
  }
}

void Scheduler::DropKv(Sequence* seq) {
  seq->table.ReleaseAll(forward_->pool());
  seq->num_computed = 0;
  seq->published = 0;
}

void Scheduler::Preempt(Sequence* seq) {
  DropKv(seq);
  seq->running = false;
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->get() == seq) {
      waiting_.push_front(std::move(*it));
      running_.erase(it);
      break;
    }
  }
  ++counters_.preemptions;
}

bool Scheduler::ReserveOrPreempt(Sequence* seq, int num_tokens) {
  while (!seq->table.Reserve(forward_->pool(), num_tokens).ok()) {
    // The newest sequence not already in this step: `seq` itself or a newer one.
    Sequence* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend() && victim == nullptr; ++it) {
      if (!(*it)->scheduled && (!(*it)->pinned || it->get() == seq)) victim = it->get();
    }
    if (victim == nullptr || victim->pinned) return false;  // a pinned sequence waits
    Preempt(victim);
    if (victim == seq) return false;
  }
  return true;
}

int Scheduler::Fit(const Sequence* seq, int len) const {
  const int block_size = forward_->pool()->config().block_size;
  const int capacity =
      seq->table.capacity_tokens(block_size) + forward_->pool()->num_free() * block_size;
  return std::min(len, capacity - seq->num_computed);
}

absl::StatusOr<int32_t> Scheduler::Draw(Sequence* seq, absl::Span<const float> logits,
                                        SequenceOutput* out) {
  int32_t token;
  if (seq->grammar.has_value()) {
    // Tokens that may follow this one, within max_tokens and the context.
    const int64_t generated = static_cast<int64_t>(seq->tokens.size()) - seq->prompt_len;
    const int64_t context_left = forward_->weights().config.max_position_embeddings -
                                 static_cast<int64_t>(seq->tokens.size());
    const int64_t left = std::min<int64_t>(seq->params.max_tokens - generated, context_left) - 1;
    constrained_.assign(logits.begin(), logits.end());
    RETURN_IF_ERROR(seq->grammar->Constrain(absl::MakeSpan(constrained_),
                                            static_cast<int>(std::max<int64_t>(left, 0))));
    token = seq->sampler.Sample(constrained_);
  } else {
    token = seq->sampler.Sample(logits);
  }
  // The model's own log-probabilities, as without a constraint (vLLM's raw logprobs).
  if (seq->params.logprobs >= 0)
    out->logprobs = ComputeLogprobs(logits, token, seq->params.logprobs);
  return token;
}

void Scheduler::Sample(Sequence* seq, absl::Span<const float> logits, SequenceOutput* out) {
  absl::StatusOr<int32_t> token = Draw(seq, logits, out);
  if (!token.ok()) {
    out->status = token.status();
    return;
  }
  Accept(seq, *token, out);
}

void Scheduler::Accept(Sequence* seq, int32_t token, SequenceOutput* out) {
  seq->tokens.push_back(token);
  out->token = token;
  std::string piece;
  if (seq->detok.has_value()) {
    absl::StatusOr<std::string> text = seq->detok->Add(token);
    if (!text.ok()) {
      out->status = text.status();
      return;
    }
    piece = *std::move(text);
  }
  if (seq->grammar.has_value()) {
    // A token from elsewhere (a prefill's first) is checked like one drawn here.
    if (absl::Status status = seq->grammar->Accept(token); !status.ok()) {
      out->status = status;
      return;
    }
  }
  StopResult r = seq->stop.Add(token, piece);
  out->text = std::move(r.text);
  out->finish = r.reason;
  // A constrained output that is complete, with nothing allowed after it, stops (as an EOS
  // would), on its last allowed token too.
  const bool complete = seq->grammar.has_value() && seq->grammar->finished();
  if (complete && out->finish == FinishReason::kLength) out->finish = FinishReason::kStop;
  if (out->finish == FinishReason::kNone &&
      (complete || static_cast<int64_t>(seq->tokens.size()) >=
                       forward_->weights().config.max_position_embeddings)) {
    // Complete, or the context is full before max_tokens (a length finish, as vLLM reports it).
    out->text += seq->stop.Flush();
    if (seq->detok.has_value()) {
      absl::StatusOr<std::string> rest = seq->detok->Flush();
      if (rest.ok()) out->text += *rest;
    }
    out->finish = complete ? FinishReason::kStop : FinishReason::kLength;
  }
}

absl::Status Scheduler::Step(std::vector<SequenceOutput>* outputs) {
  struct Work {
    Sequence* seq;
    int begin;
    int len;
  };
  std::vector<Work> work;
  int budget = config_.max_step_tokens;
  const int64_t preemptions_before = counters_.preemptions;

  // First tokens sampled by another engine (AddPrefilled) are emitted before anything runs.
  std::vector<Sequence*> finished;
  for (auto& owned : running_) {
    Sequence* seq = owned.get();
    if (!seq->first_token.has_value()) continue;
    SequenceOutput out;
    out.id = seq->id;
    out.logprobs = std::move(seq->first_logprobs);
    seq->first_logprobs.reset();
    Accept(seq, *seq->first_token, &out);
    seq->first_token.reset();
    if (out.finish != FinishReason::kNone || !out.status.ok()) finished.push_back(seq);
    outputs->push_back(std::move(out));
  }
  for (Sequence* seq : finished) Remove(seq);

  // Decode first: one token for every running sequence that has sampled one. Preemption only
  // ever takes the newest sequences, which this loop has not reached yet.
  std::vector<Sequence*> running;
  for (auto& seq : running_) running.push_back(seq.get());
  auto schedule = [&](Sequence* seq, int len) {
    work.push_back({seq, seq->num_computed, len});
    seq->scheduled = true;
    budget -= len;
  };
  for (Sequence* seq : running) {
    if (!seq->running || !seq->decoding()) continue;
    if (ReserveOrPreempt(seq, seq->num_computed + 1)) schedule(seq, 1);
  }
  // Then prefill chunks: running sequences part-way through, oldest first, then new ones. A
  // chunk stops at the end of the prompt, so each chunk is wholly prefill or wholly decode
  // phase (tokens recomputed after a preemption), and shrinks to the free blocks; only a
  // sequence that cannot get a single token in preempts.
  // A pool keeping state snapshots for the prefix cache ends a prompt's chunks on a block
  // boundary where one lies inside them, so that the state there can be snapshotted.
  KvBlockPool* pool = forward_->pool();
  const int align = pool->prefix_cache_enabled() && pool->config().num_state_slots > 0
                        ? pool->config().block_size
                        : 1;
  auto chunk = [&](Sequence* seq) {
    int end = static_cast<int>(seq->tokens.size());
    if (seq->num_computed < seq->prompt_len) end = seq->prompt_len;
    int len = Fit(seq, std::min(end - seq->num_computed, budget));
    const int aligned = (seq->num_computed + len) / align * align;
    if (len > 1 && aligned > seq->num_computed) len = aligned - seq->num_computed;
    return len;
  };
  for (Sequence* seq : running) {
    if (budget == 0) break;
    if (!seq->running || seq->scheduled || seq->pending() == 0) continue;
    const int len = std::max(1, chunk(seq));
    if (ReserveOrPreempt(seq, seq->num_computed + len)) schedule(seq, len);
  }
  // Admit waiting sequences while there is room; not in a step that had to preempt, which
  // would only hand the freed blocks back and forth.
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int>(running_.size()) < config_.max_running &&
         counters_.preemptions == preemptions_before) {
    Sequence* seq = waiting_.front().get();
    const int reused = ReuseCachedPrefix(seq);
    const int len = chunk(seq);
    if (len < 1 || !seq->table.Reserve(forward_->pool(), seq->num_computed + len).ok()) {
      DropKv(seq);  // cached blocks are taken again next time
      break;
    }
    if (forward_->pool()->prefix_cache_enabled()) {
      counters_.prefix_query_tokens += static_cast<int64_t>(seq->tokens.size());
      counters_.prefix_hit_tokens += reused;
    }
    seq->running = true;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    schedule(seq, len);
  }
  for (const Work& w : work) w.seq->scheduled = false;
  if (work.empty()) return absl::OkStatus();

  std::vector<StepInput> batch;
  batch.reserve(work.size());
  for (const Work& w : work) {
    const bool last = w.begin + w.len == static_cast<int>(w.seq->tokens.size());
    const bool prompt = w.begin < w.seq->prompt_len;
    // A prompt being scored needs every row; otherwise only the one a token is sampled from.
    const LogitRows rows = prompt && w.seq->wants_prompt_logprobs() ? LogitRows::kAll
                           : last                                   ? LogitRows::kLast
                                                                    : LogitRows::kNone;
    batch.push_back({absl::MakeConstSpan(w.seq->tokens).subspan(w.begin, w.len), w.begin,
                     &w.seq->table, rows, prompt ? &config_.prefill : &config_.decode});
  }
  std::vector<std::vector<float>> logits;
  ++counters_.steps;
  if (absl::Status status = forward_->Step(batch, {}, &logits); !status.ok()) {
    for (const Work& w : work) {
      SequenceOutput out;
      out.id = w.seq->id;
      out.status = status;
      outputs->push_back(std::move(out));
      Remove(w.seq);
    }
    return status;
  }
  for (size_t i = 0; i < work.size(); ++i) {
    Sequence* seq = work[i].seq;
    seq->table.Append(work[i].len);
    seq->num_computed += work[i].len;
    PublishBlocks(seq);
    if (work[i].begin < seq->prompt_len || work[i].len > 1) {
      counters_.prefill_tokens += work[i].len;
    } else {
      counters_.decode_tokens += 1;
    }
    if (logits[i].empty()) continue;
    absl::Span<const float> row = logits[i];
    if (batch[i].logits == LogitRows::kAll) {
      // Row r predicts token begin + r + 1: a prompt token's log-probability, or (the last
      // row of the prompt) the first generated token.
      const size_t vocab = logits[i].size() / work[i].len;
      const int begin = work[i].begin;
      AppendPromptLogprobs(row, begin, work[i].len,
                           absl::MakeConstSpan(seq->tokens).first(seq->prompt_len),
                           seq->params.prompt_logprobs, &seq->prompt_logprobs);
      if (begin + work[i].len == seq->prompt_len) seq->prompt_scored = true;
      row = row.subspan((work[i].len - 1) * vocab, vocab);
      if (begin + work[i].len < static_cast<int>(seq->tokens.size())) continue;  // mid-prompt
    }
    SequenceOutput out;
    out.id = seq->id;
    if (seq->params.prompt_logprobs >= 0 && seq->prompt_scored) {
      out.prompt_logprobs = std::exchange(seq->prompt_logprobs, {});
    }
    if (seq->params.max_tokens == 0) {
      // Scored only: nothing is generated.
      out.finish = FinishReason::kLength;
      outputs->push_back(std::move(out));
      Remove(seq);
      continue;
    }
    if (seq->prefill_only) {
      // The first token, unchecked (the decoder applies the stop rules), and the prompt's KV.
      absl::StatusOr<int32_t> token = Draw(seq, row, &out);
      if (!token.ok()) {
        out.status = token.status();
        outputs->push_back(std::move(out));
        Remove(seq);
        continue;
      }
      out.token = *token;
      out.finish = FinishReason::kLength;
      out.prompt_kv = std::make_shared<const PromptKv>(forward_->pool(), std::move(seq->table));
      seq->table = BlockTable();
      outputs->push_back(std::move(out));
      Remove(seq);
      continue;
    }
    Sample(seq, row, &out);
    const bool done = out.finish != FinishReason::kNone || !out.status.ok();
    outputs->push_back(std::move(out));
    if (done) Remove(seq);
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine
