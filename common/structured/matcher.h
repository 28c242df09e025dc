// Constrained decoding: which tokens may come next under a grammar, per sequence.
//
// A grammar's state is a set of stacks of grammar positions (llama.cpp's GBNF engine keeps
// the same), advanced one output byte at a time. CompiledGrammar interns every stack and every
// set of stacks it meets, so a state is one integer; transitions (state, byte) -> state and
// the allowed-token mask of a state are cached, so a state met again (every character inside a
// JSON string, every element of an array of numbers) costs a lookup. A mask is computed by
// walking the vocabulary's byte strings in sorted order against the state: tokens that share
// a prefix share its transitions, and a dead prefix rejects every token that starts with it.
//
// Budget: a constrained sequence must end inside max_tokens. Each state knows the fewest
// bytes that complete the grammar from it; when the tokens left come within kBudgetSlack of
// that, the mask also drops tokens whose resulting state needs more bytes than there are
// tokens left (byte-level and byte-fallback vocabularies have a token for each byte), so the
// output closes its value instead of being cut off. When no token can close it in time (a
// max_tokens below what the constraint needs), the mask is the unbudgeted one and the output
// may end at max_tokens, unfinished, as vLLM's does.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/model/tokenizer.h"
#include "common/structured/grammar.h"

namespace tandem::structured {

// The byte strings of a tokenizer's tokens, sorted, built once per tokenizer. Control tokens
// (BOS, EOS, chat markers) have none: a grammar never allows them as text.
class TokenTable {
 public:
  static std::shared_ptr<const TokenTable> Build(const model::Tokenizer& tokenizer);
  // For tests: token i's bytes are tokens[i] (empty: a control token).
  static std::shared_ptr<const TokenTable> FromBytes(const std::vector<std::string>& tokens);

  int32_t vocab_size() const { return static_cast<int32_t>(by_id_.size()); }
  std::string_view bytes(int32_t token) const;
  // Bit t set: token t reads differently at the start of an output than inside one (a
  // SentencePiece "▁x" is " x" inside a text but "x" at its start), so it may not be an
  // output's first token: the grammar and the client would see different text.
  const std::vector<uint64_t>& start_excluded() const { return start_excluded_; }
  // The tokens whose bytes hold at least `n` '"' (n in 1..3): only they can close a JSON key.
  const std::vector<int32_t>& quote_tokens(int n) const { return quote_tokens_[n - 1]; }

 private:
  friend class CompiledGrammar;
  static std::shared_ptr<TokenTable> Make(const std::vector<std::string>& tokens);
  struct Entry {
    int32_t token;
    uint32_t offset;
    uint32_t length;
    uint32_t lcp;  // bytes shared with the previous entry
  };
  std::string bytes_;                                 // every token's bytes, concatenated
  std::vector<std::pair<uint32_t, uint32_t>> by_id_;  // (offset, length) per token id
  std::vector<Entry> sorted_;                         // tokens with bytes, by their bytes
  uint32_t max_length_ = 0;
  std::vector<uint64_t> start_excluded_;
  std::vector<int32_t> quote_tokens_[3];
};

// A grammar bound to a vocabulary, with the caches every sequence under it shares.
// Thread-safe.
class CompiledGrammar {
 public:
  using State = uint32_t;
  static constexpr State kDead = 0;  // no continuation: the bytes so far left the grammar

  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenTable> tokens);
  ~CompiledGrammar();

  // RESOURCE_EXHAUSTED when the grammar's state tables outgrow their limits.
  absl::StatusOr<State> Initial();
  absl::StatusOr<State> Advance(State state, std::string_view bytes);
  // The output so far is complete (the grammar may end here).
  bool Accepting(State state);
  // Complete, and nothing may follow.
  bool Final(State state);
  // The fewest bytes that complete the grammar from `state`.
  uint32_t MinBytes(State state);
  // Sets bit t of `mask` ((vocab + 63) / 64 words) for each token t whose bytes continue
  // `state`; with a budget, only tokens after which at most `budget` bytes complete it (with
  // a budget of 0, only those after which it is complete and nothing may follow).
  absl::Status Mask(State state, std::optional<uint32_t> budget, std::vector<uint64_t>* mask);

  const TokenTable& tokens() const { return *tokens_; }
  const Grammar& grammar() const { return grammar_; }

 private:
  struct Node {
    uint32_t pos;     // the grammar position to continue at
    uint32_t parent;  // the stack below (0: empty)
  };
  absl::Status ExpandLocked(uint32_t pos, uint32_t parent, std::vector<uint32_t>* out, int depth)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint32_t> InternNodeLocked(uint32_t pos, uint32_t parent)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<State> InternSetLocked(std::vector<uint32_t> stacks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<State> StepLocked(State state, uint8_t byte) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Grammar grammar_;
  const std::shared_ptr<const TokenTable> tokens_;
  absl::Mutex mu_;
  std::vector<Node> nodes_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> node_min_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint32_t> node_ids_ ABSL_GUARDED_BY(mu_);
  struct Set {
    std::vector<uint32_t> stacks;  // sorted node ids; 0 = the empty stack (complete)
    ByteSet first_bytes;           // bytes some stack can take next
    uint32_t min_bytes;
    std::unique_ptr<State[]> next;  // (256,) transitions, kUnknown until met; lazily
  };
  std::vector<Set> sets_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::vector<uint32_t>, State> set_ids_ ABSL_GUARDED_BY(mu_);
  size_t transition_tables_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<State, std::vector<uint64_t>> masks_ ABSL_GUARDED_BY(mu_);
  std::vector<State> walk_ ABSL_GUARDED_BY(mu_);  // scratch: state per depth of the walk
  int64_t work_ ABSL_GUARDED_BY(mu_) = 0;         // stacks advanced in the current Mask or Advance
  // Scratch of one expansion: (alternative start, continuation) pairs already expanded.
  absl::flat_hash_set<uint64_t> expanded_ ABSL_GUARDED_BY(mu_);
};

// The keys of the JSON objects an output has open, fed the output's bytes: a grammar cannot
// say "no key twice" (that is not context-free), so the matcher masks the tokens that would
// close a key its object already has. Keys compare as written (JSON text between the quotes).
class JsonKeyTracker {
 public:
  // Takes output bytes; false when they close a key its object already has.
  bool Feed(std::string_view bytes);
  // Whether `bytes` would close a key its object already has (this is unchanged). A token
  // that closes an object and goes on to write keys in the one around it is not looked into
  // past that point (Feed still refuses a repeat there).
  bool WouldRepeat(std::string_view bytes) const;
  // Whether a key could be closed by the next bytes (an object is open).
  bool any_object() const { return objects_ > 0; }
  // The fewest '"' a token needs to close a key from here: 1 inside a key, 2 outside strings
  // (open and close one), 3 inside a value string.
  int quotes_to_close_key() const { return !lex_.in_string ? 2 : lex_.is_key ? 1 : 3; }

  // Where the text is between two bytes: inside a string or not, and a key's bytes so far.
  struct Lexer {
    bool in_string = false, escape = false, is_key = false;
    std::string key;
  };

 private:
  struct Level {
    bool object = false;
    bool expect_key = false;  // object: the next string is a key
    absl::flat_hash_set<std::string> keys;
  };
  struct Stack;    // the levels as Feed changes them
  struct Overlay;  // the levels as WouldRepeat imagines them
  std::vector<Level> stack_;
  int objects_ = 0;
  Lexer lex_;
};

// One sequence's position in a grammar. Not thread-safe.
class GrammarMatcher {
 public:
  // Tokens left within kBudgetSlack of the bytes needed: the mask starts counting.
  static constexpr int kBudgetSlack = 32;

  // `end_tokens`: EOS and stop tokens, allowed exactly when the output is complete.
  // `unique_keys`: the output is JSON whose objects may not repeat a key.
  static absl::StatusOr<GrammarMatcher> Create(std::shared_ptr<CompiledGrammar> grammar,
                                               std::vector<int32_t> end_tokens,
                                               bool unique_keys = false);

  // Sets the logits of the tokens that may not come next to -inf. `tokens_left`: how many
  // tokens may follow this one. FAILED_PRECONDITION when no token may come next.
  absl::Status Constrain(absl::Span<float> logits, int tokens_left);
  // Takes `token` as the next one. INVALID_ARGUMENT when the grammar does not allow it.
  absl::Status Accept(int32_t token);
  // Nothing may follow the output (the sequence ends without an EOS).
  bool finished() const;

 private:
  GrammarMatcher(std::shared_ptr<CompiledGrammar> grammar, std::vector<int32_t> end_tokens,
                 CompiledGrammar::State state, bool unique_keys)
      : grammar_(std::move(grammar)), end_tokens_(std::move(end_tokens)), state_(state) {
    if (unique_keys) keys_.emplace();
  }

  std::shared_ptr<CompiledGrammar> grammar_;
  std::vector<int32_t> end_tokens_;
  CompiledGrammar::State state_;
  bool ended_ = false;    // an end token was accepted
  bool at_start_ = true;  // no token taken yet
  std::optional<JsonKeyTracker> keys_;
  std::vector<uint64_t> mask_;     // scratch
  std::vector<float> end_logits_;  // scratch
};

}  // namespace tandem::structured
