#include "common/structured/matcher.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status.h"

namespace tandem::structured {
namespace {

// Limits on one grammar's state tables (about 60 MB at most in all); a sequence that outgrows
// them fails with RESOURCE_EXHAUSTED, naming the limit. The caches (transitions, masks) are
// bounded and then stop growing or start over.
constexpr size_t kMaxNodes = size_t{1} << 20;
constexpr size_t kMaxSets = size_t{1} << 17;
constexpr size_t kMaxTransitionTables = size_t{1} << 13;  // 1 KiB each
constexpr size_t kMaxMaskBytes = size_t{16} << 20;
constexpr int kMaxExpandDepth = 4096;
// Ambiguity bounds: a grammar state is a set of stacks, one per way the output so far can be
// read (nested repetitions such as ([^x]{1,40}){2,40} read one byte many ways), and a mask
// advances every stack of every state it walks through. Past these a sequence fails with
// RESOURCE_EXHAUSTED instead of taking seconds per token.
constexpr size_t kMaxStacksPerState = 1024;
constexpr int64_t kMaxMaskWork = int64_t{1} << 22;  // stacks advanced in one mask
constexpr uint32_t kUnknown = std::numeric_limits<uint32_t>::max();

absl::Status TooLarge(const std::string& what) {
  return absl::ResourceExhaustedError(
      absl::StrCat("the constrained output's grammar reached its limit of ", what,
                   "; use a simpler schema or pattern"));
}

}  // namespace

std::shared_ptr<const TokenTable> TokenTable::FromBytes(const std::vector<std::string>& tokens) {
  return Make(tokens);
}

std::shared_ptr<TokenTable> TokenTable::Make(const std::vector<std::string>& tokens) {
  auto table = std::shared_ptr<TokenTable>(new TokenTable());
  for (const std::string& t : tokens) {
    table->by_id_.emplace_back(static_cast<uint32_t>(table->bytes_.size()),
                               static_cast<uint32_t>(t.size()));
    table->bytes_ += t;
  }
  for (size_t id = 0; id < tokens.size(); ++id) {
    const auto [offset, length] = table->by_id_[id];
    if (length == 0) continue;
    table->sorted_.push_back({static_cast<int32_t>(id), offset, length, 0});
    table->max_length_ = std::max(table->max_length_, length);
  }
  const std::string_view all = table->bytes_;
  const auto text = [&](const Entry& e) { return all.substr(e.offset, e.length); };
  std::sort(table->sorted_.begin(), table->sorted_.end(),
            [&](const Entry& a, const Entry& b) { return text(a) < text(b); });
  for (size_t i = 1; i < table->sorted_.size(); ++i) {
    const std::string_view a = text(table->sorted_[i - 1]), b = text(table->sorted_[i]);
    const auto mismatch = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
    table->sorted_[i].lcp = static_cast<uint32_t>(mismatch.first - a.begin());
  }
  table->start_excluded_.assign((tokens.size() + 63) / 64, 0);
  for (size_t id = 0; id < tokens.size(); ++id) {
    const auto quotes = std::count(tokens[id].begin(), tokens[id].end(), '"');
    for (int n = 1; n <= 3 && n <= quotes; ++n) {
      table->quote_tokens_[n - 1].push_back(static_cast<int32_t>(id));
    }
  }
  return table;
}

std::shared_ptr<const TokenTable> TokenTable::Build(const model::Tokenizer& tokenizer) {
  const size_t vocab = static_cast<size_t>(tokenizer.vocab_size());
  std::vector<std::string> tokens(vocab);
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    tokens[static_cast<size_t>(id)] = tokenizer.TokenBytes(id).value_or("");
  }
  std::shared_ptr<TokenTable> table = Make(tokens);
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::string& inside = tokens[static_cast<size_t>(id)];
    if (inside.empty()) continue;
    // A token holding part of a character decodes to U+FFFD alone; its bytes are the same at
    // the start (the detokenizer holds them until the character is whole).
    absl::StatusOr<std::string> alone = tokenizer.Decode({&id, 1});
    if (!alone.ok() || *alone == inside || alone->find(kReplacement) != std::string::npos) continue;
    table->start_excluded_[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  }
  return table;
}

std::string_view TokenTable::bytes(int32_t token) const {
  if (token < 0 || token >= vocab_size()) return {};
  const auto [offset, length] = by_id_[static_cast<size_t>(token)];
  return std::string_view(bytes_).substr(offset, length);
}

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenTable> tokens)
    : grammar_(std::move(grammar)), tokens_(std::move(tokens)) {
  absl::MutexLock lock(&mu_);
  nodes_.push_back({0, 0});  // 0: the empty stack
  node_min_.push_back(0);
  sets_.push_back({});  // 0: the dead state
  sets_[0].min_bytes = Grammar::kInfinite;
  walk_.resize(tokens_->max_length_ + 1);
}

CompiledGrammar::~CompiledGrammar() = default;

absl::StatusOr<uint32_t> CompiledGrammar::InternNodeLocked(uint32_t pos, uint32_t parent) {
  const uint64_t key = (uint64_t{pos} << 32) | parent;
  if (auto it = node_ids_.find(key); it != node_ids_.end()) return it->second;
  if (nodes_.size() >= kMaxNodes) return TooLarge("stack entries");
  const uint32_t id = static_cast<uint32_t>(nodes_.size());
  nodes_.push_back({pos, parent});
  const uint64_t min = uint64_t{grammar_.min_rest[pos]} + node_min_[parent];
  node_min_.push_back(static_cast<uint32_t>(std::min<uint64_t>(min, Grammar::kInfinite - 1)));
  node_ids_.emplace(key, id);
  return id;
}

absl::Status CompiledGrammar::ExpandLocked(uint32_t pos, uint32_t parent,
                                           std::vector<uint32_t>* out, int depth) {
  if (depth > kMaxExpandDepth) return TooLarge("expansion depth");
  const Element& e = grammar_.elements[pos];
  switch (e.kind) {
    case Element::Kind::kEnd:
      if (parent == 0) {
        out->push_back(0);
        return absl::OkStatus();
      }
      return ExpandLocked(nodes_[parent].pos, nodes_[parent].parent, out, depth + 1);
    case Element::Kind::kBytes: {
      ASSIGN_OR_RETURN(const uint32_t node, InternNodeLocked(pos, parent));
      out->push_back(node);
      return absl::OkStatus();
    }
    case Element::Kind::kRule: {
      // A reference at the end of its sequence continues straight with the parent (a tail
      // call), so right recursion does not grow the stack.
      uint32_t cont = parent;
      if (grammar_.elements[pos + 1].kind != Element::Kind::kEnd) {
        ASSIGN_OR_RETURN(cont, InternNodeLocked(pos + 1, parent));
      }
      for (uint32_t start : grammar_.rules[e.value]) {
        // A rule reached again with the same continuation, without consuming a byte, adds (nullable
        // loops such as (a*)*). nothing new (nullable loops such as (a*)*), and neither does one
        // reached again by another path: its stacks are in `out` already.
        if (!expanded_.insert((uint64_t{start} << 32) | cont).second) continue;
        RETURN_IF_ERROR(ExpandLocked(start, cont, out, depth + 1));
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CompiledGrammar::State> CompiledGrammar::InternSetLocked(
    std::vector<uint32_t> stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.empty()) return kDead;
  if (stacks.size() > kMaxStacksPerState) {
    return TooLarge(absl::StrCat(kMaxStacksPerState,
                                 " readings of the output at once (it is too "
                                 "ambiguous: nested repetitions?)"));
  }
  if (auto it = set_ids_.find(stacks); it != set_ids_.end()) return it->second;
  if (sets_.size() >= kMaxSets) return TooLarge("states");
  Set set;
  set.min_bytes = Grammar::kInfinite;
  for (uint32_t node : stacks) {
    set.min_bytes = std::min(set.min_bytes, node_min_[node]);
    if (node != 0) set.first_bytes |= grammar_.byte_sets[grammar_.elements[nodes_[node].pos].value];
  }
  set.stacks = stacks;
  const State id = static_cast<State>(sets_.size());
  sets_.push_back(std::move(set));
  set_ids_.emplace(std::move(stacks), id);
  return id;
}

absl::StatusOr<CompiledGrammar::State> CompiledGrammar::Initial() {
  absl::MutexLock lock(&mu_);
  std::vector<uint32_t> stacks;
  expanded_.clear();
  for (uint32_t start : grammar_.rules[grammar_.root]) {
    RETURN_IF_ERROR(ExpandLocked(start, 0, &stacks, 0));
  }
  return InternSetLocked(std::move(stacks));
}

absl::StatusOr<CompiledGrammar::State> CompiledGrammar::StepLocked(State state, uint8_t byte) {
  Set& set = sets_[state];
  if (!set.first_bytes.test(byte)) return kDead;
  if (set.next != nullptr && set.next[byte] != kUnknown) return set.next[byte];
  std::vector<uint32_t> stacks;
  expanded_.clear();
  work_ += static_cast<int64_t>(sets_[state].stacks.size());
  if (work_ > kMaxMaskWork) {
    return TooLarge(absl::StrCat(kMaxMaskWork, " grammar steps for one token mask"));
  }
  for (size_t i = 0; i < sets_[state].stacks.size(); ++i) {
    const uint32_t node = sets_[state].stacks[i];
    if (node == 0) continue;
    const Node n = nodes_[node];
    if (!grammar_.byte_sets[grammar_.elements[n.pos].value].test(byte)) continue;
    RETURN_IF_ERROR(ExpandLocked(n.pos + 1, n.parent, &stacks, 0));
  }
  ASSIGN_OR_RETURN(const State next, InternSetLocked(std::move(stacks)));
  Set& again = sets_[state];  // sets_ may have grown
  if (again.next == nullptr && transition_tables_ < kMaxTransitionTables) {
    again.next = std::make_unique<State[]>(256);
    std::fill(again.next.get(), again.next.get() + 256, kUnknown);
    ++transition_tables_;
  }
  if (again.next != nullptr) again.next[byte] = next;
  return next;
}

absl::StatusOr<CompiledGrammar::State> CompiledGrammar::Advance(State state,
                                                                std::string_view bytes) {
  absl::MutexLock lock(&mu_);
  work_ = 0;
  for (char c : bytes) {
    if (state == kDead) break;
    ASSIGN_OR_RETURN(state, StepLocked(state, static_cast<uint8_t>(c)));
  }
  return state;
}

bool CompiledGrammar::Accepting(State state) {
  absl::MutexLock lock(&mu_);
  const std::vector<uint32_t>& stacks = sets_[state].stacks;
  return !stacks.empty() && stacks.front() == 0;
}

bool CompiledGrammar::Final(State state) {
  absl::MutexLock lock(&mu_);
  const std::vector<uint32_t>& stacks = sets_[state].stacks;
  return stacks.size() == 1 && stacks.front() == 0;
}

uint32_t CompiledGrammar::MinBytes(State state) {
  absl::MutexLock lock(&mu_);
  return sets_[state].min_bytes;
}

absl::Status CompiledGrammar::Mask(State state, std::optional<uint32_t> budget,
                                   std::vector<uint64_t>* mask) {
  const size_t words = (static_cast<size_t>(tokens_->vocab_size()) + 63) / 64;
  absl::MutexLock lock(&mu_);
  if (!budget.has_value()) {
    if (auto it = masks_.find(state); it != masks_.end()) {
      *mask = it->second;
      return absl::OkStatus();
    }
  }
  mask->assign(words, 0);
  work_ = 0;
  const std::string_view all = tokens_->bytes_;
  walk_[0] = state;
  uint32_t valid = 0;  // walk_[0..valid] hold the previous token's live prefix states
  for (const TokenTable::Entry& e : tokens_->sorted_) {
    if (e.lcp > valid) continue;  // it starts with the previous token's dead prefix
    uint32_t j = e.lcp;
    for (; j < e.length; ++j) {
      ASSIGN_OR_RETURN(const State next,
                       StepLocked(walk_[j], static_cast<uint8_t>(all[e.offset + j])));
      if (next == kDead) break;
      walk_[j + 1] = next;
    }
    valid = j;
    if (j < e.length) continue;
    if (budget.has_value()) {
      // With no token to follow, the output must be over: complete, nothing allowed after.
      const Set& after = sets_[walk_[j]];
      if (*budget == 0 ? !(after.stacks.size() == 1 && after.stacks[0] == 0)
                       : after.min_bytes > *budget) {
        continue;
      }
    }
    (*mask)[static_cast<size_t>(e.token) / 64] |= uint64_t{1} << (e.token % 64);
  }
  if (!budget.has_value()) {
    if ((masks_.size() + 1) * words * 8 > kMaxMaskBytes) masks_.clear();
    masks_.emplace(state, *mask);
  }
  return absl::OkStatus();
}

namespace {

enum class LexResult { kOk, kRepeat, kStop };

// One byte of a JSON text, as far as keys go: `lex` is where the text is (inside a string or
// not, a key's bytes so far), `levels` its open containers (push, pop, expect_key, AddKey).
template <class Levels>
LexResult LexByte(char c, JsonKeyTracker::Lexer* lex, Levels* levels) {
  if (lex->in_string) {
    if (lex->escape) {
      lex->escape = false;
    } else if (c == '\\') {
      lex->escape = true;
    } else if (c == '"') {
      lex->in_string = false;
      if (!lex->is_key) return LexResult::kOk;
      const bool added = levels->AddKey(std::move(lex->key));
      lex->key.clear();
      return added ? LexResult::kOk : LexResult::kRepeat;
    }
    if (lex->is_key) lex->key.push_back(c);
    return LexResult::kOk;
  }
  switch (c) {
    case '{':
    case '[':
      levels->Push(c == '{');
      break;
    case '}':
    case ']':
      if (!levels->Pop()) return LexResult::kStop;
      break;
    case ',':
      if (levels->object()) levels->set_expect_key(true);
      break;
    case ':':
      if (levels->open()) levels->set_expect_key(false);
      break;
    case '"':
      lex->in_string = true;
      lex->is_key = levels->object() && levels->expect_key();
      break;
    default:
      break;
  }
  return LexResult::kOk;
}

}  // namespace

// The tracker's own levels.
struct JsonKeyTracker::Stack {
  JsonKeyTracker* t;
  bool open() const { return !t->stack_.empty(); }
  bool object() const { return open() && t->stack_.back().object; }
  bool expect_key() const { return t->stack_.back().expect_key; }
  void set_expect_key(bool v) { t->stack_.back().expect_key = v; }
  void Push(bool is_object) {
    t->stack_.push_back({is_object, is_object, {}});
    t->objects_ += is_object;
  }
  bool Pop() {
    if (open()) {
      t->objects_ -= t->stack_.back().object;
      t->stack_.pop_back();
    }
    return true;
  }
  bool AddKey(std::string key) { return t->stack_.back().keys.insert(std::move(key)).second; }
};

// The tracker's levels as they would be after some bytes, leaving the tracker as it is: the
// innermost level's keys and expect_key overlaid, levels opened by the bytes held here. A pop
// below the innermost level stops the look-ahead.
struct JsonKeyTracker::Overlay {
  struct Opened {
    bool object;
    bool expect_key;
    std::vector<std::string> keys;
  };
  const JsonKeyTracker* t;
  bool top_expect;
  std::vector<std::string> top_added;
  std::vector<Opened> opened;

  bool open() const { return !opened.empty() || !t->stack_.empty(); }
  bool object() const {
    return opened.empty() ? !t->stack_.empty() && t->stack_.back().object : opened.back().object;
  }
  bool expect_key() const { return opened.empty() ? top_expect : opened.back().expect_key; }
  void set_expect_key(bool v) { (opened.empty() ? top_expect : opened.back().expect_key) = v; }
  void Push(bool is_object) { opened.push_back({is_object, is_object, {}}); }
  bool Pop() {
    if (opened.empty()) return false;
    opened.pop_back();
    return true;
  }
  bool AddKey(std::string key) {
    std::vector<std::string>& added = opened.empty() ? top_added : opened.back().keys;
    if ((opened.empty() && t->stack_.back().keys.contains(key)) ||
        std::find(added.begin(), added.end(), key) != added.end()) {
      return false;
    }
    added.push_back(std::move(key));
    return true;
  }
};

bool JsonKeyTracker::Feed(std::string_view bytes) {
  Stack levels{this};
  for (char c : bytes) {
    if (LexByte(c, &lex_, &levels) == LexResult::kRepeat) return false;
  }
  return true;
}

bool JsonKeyTracker::WouldRepeat(std::string_view bytes) const {
  Lexer lex = lex_;
  Overlay levels{this, !stack_.empty() && stack_.back().expect_key, {}, {}};
  for (char c : bytes) {
    switch (LexByte(c, &lex, &levels)) {
      case LexResult::kRepeat:
        return true;
      case LexResult::kStop:
        return false;  // into the object around: Feed checks the rest
      case LexResult::kOk:
        break;
    }
  }
  return false;
}

absl::StatusOr<GrammarMatcher> GrammarMatcher::Create(std::shared_ptr<CompiledGrammar> grammar,
                                                      std::vector<int32_t> end_tokens,
                                                      bool unique_keys) {
  ASSIGN_OR_RETURN(const CompiledGrammar::State state, grammar->Initial());
  if (state == CompiledGrammar::kDead) {
    return absl::InvalidArgumentError("the constraint allows no output at all");
  }
  return GrammarMatcher(std::move(grammar), std::move(end_tokens), state, unique_keys);
}

bool GrammarMatcher::finished() const { return ended_ || grammar_->Final(state_); }

absl::Status GrammarMatcher::Constrain(absl::Span<float> logits, int tokens_left) {
  const uint32_t need = grammar_->MinBytes(state_);
  std::optional<uint32_t> budget;
  if (tokens_left >= 0 && static_cast<int64_t>(tokens_left) <= int64_t{need} + kBudgetSlack) {
    budget = static_cast<uint32_t>(tokens_left);
  }
  const std::vector<uint64_t>& excluded = grammar_->tokens().start_excluded();
  const auto mask = [&](std::optional<uint32_t> b) -> absl::Status {
    RETURN_IF_ERROR(grammar_->Mask(state_, b, &mask_));
    if (at_start_) {
      for (size_t w = 0; w < mask_.size() && w < excluded.size(); ++w) mask_[w] &= ~excluded[w];
    }
    if (keys_.has_value() && keys_->any_object()) {
      // Only a token with enough '"' can close a key.
      for (int32_t t : grammar_->tokens().quote_tokens(keys_->quotes_to_close_key())) {
        uint64_t& word = mask_[static_cast<size_t>(t) / 64];
        const uint64_t bit = uint64_t{1} << (t % 64);
        if ((word & bit) != 0 && keys_->WouldRepeat(grammar_->tokens().bytes(t))) word &= ~bit;
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(mask(budget));
  const bool accepting = grammar_->Accepting(state_);
  if (budget.has_value() && !accepting &&
      std::all_of(mask_.begin(), mask_.end(), [](uint64_t w) { return w == 0; })) {
    // No token closes the output in time (multi-byte tokens may still): the best effort is
    // the unbudgeted mask, and the sequence may end at max_tokens.
    RETURN_IF_ERROR(mask(std::nullopt));
  }
  // End tokens are allowed exactly when the output is complete; having no bytes, the mask
  // leaves them out, so their logits are kept aside.
  end_logits_.clear();
  if (accepting) {
    for (int32_t t : end_tokens_) {
      if (t >= 0 && static_cast<size_t>(t) < logits.size()) {
        end_logits_.push_back(logits[static_cast<size_t>(t)]);
      }
    }
  }
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t vocab = std::min(logits.size(), mask_.size() * 64);
  bool any = false;
  for (size_t t = 0; t < vocab; ++t) {
    if ((mask_[t / 64] >> (t % 64)) & 1) {
      any = any || !std::isnan(logits[t]);
    } else {
      logits[t] = kNegInf;
    }
  }
  for (size_t t = vocab; t < logits.size(); ++t) logits[t] = kNegInf;
  if (accepting) {
    size_t i = 0;
    for (int32_t t : end_tokens_) {
      if (t >= 0 && static_cast<size_t>(t) < logits.size()) {
        logits[static_cast<size_t>(t)] = end_logits_[i++];
        any = true;
      }
    }
  }
  if (!any) {
    return absl::FailedPreconditionError(
        "no token of the vocabulary continues the constrained output");
  }
  return absl::OkStatus();
}

absl::Status GrammarMatcher::Accept(int32_t token) {
  if (ended_) return absl::FailedPreconditionError("the constrained output has ended");
  if (std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end()) {
    if (!grammar_->Accepting(state_)) {
      return absl::InvalidArgumentError(
          absl::StrCat("end token ", token, " before the constrained output is complete"));
    }
    ended_ = true;
    return absl::OkStatus();
  }
  const std::string_view bytes = grammar_->tokens().bytes(token);
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", token, " has no text; the constrained output cannot take it"));
  }
  ASSIGN_OR_RETURN(const CompiledGrammar::State next, grammar_->Advance(state_, bytes));
  if (next == CompiledGrammar::kDead) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", token, " does not continue the constrained output"));
  }
  if (keys_.has_value() && !keys_->Feed(bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", token, " repeats a key of a JSON object in the output"));
  }
  state_ = next;
  at_start_ = false;
  return absl::OkStatus();
}

}  // namespace tandem::structured
