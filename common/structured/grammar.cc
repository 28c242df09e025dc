#include "common/structured/grammar.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::structured {

uint32_t GrammarBuilder::NewRule() {
  rules_.emplace_back();
  return static_cast<uint32_t>(rules_.size() - 1);
}

void GrammarBuilder::AddAlternative(uint32_t rule, const Sequence& sequence) {
  rules_[rule].push_back(static_cast<uint32_t>(elements_.size()));
  elements_.insert(elements_.end(), sequence.begin(), sequence.end());
  elements_.push_back({Element::Kind::kEnd, 0});
}

uint32_t GrammarBuilder::Rule(const std::vector<Sequence>& alternatives) {
  const uint32_t rule = NewRule();
  for (const Sequence& alternative : alternatives) AddAlternative(rule, alternative);
  return rule;
}

Element GrammarBuilder::Bytes(const ByteSet& set) {
  // Few distinct sets occur; a linear search from the newest keeps this simple.
  for (size_t i = byte_sets_.size(); i-- > 0;) {
    if (byte_sets_[i] == set) return {Element::Kind::kBytes, static_cast<uint32_t>(i)};
  }
  byte_sets_.push_back(set);
  return {Element::Kind::kBytes, static_cast<uint32_t>(byte_sets_.size() - 1)};
}

Element GrammarBuilder::Byte(uint8_t byte) {
  ByteSet set;
  set.set(byte);
  return Bytes(set);
}

GrammarBuilder::Sequence GrammarBuilder::Literal(std::string_view text) {
  Sequence out;
  out.reserve(text.size());
  for (char c : text) out.push_back(Byte(static_cast<uint8_t>(c)));
  return out;
}

uint32_t GrammarBuilder::Repeat(const Sequence& sequence, int64_t min, int64_t max) {
  Sequence body;
  if (max == kUnbounded) {
    // tail ::= sequence tail | ""   (right recursion: a matcher's stacks do not grow with it)
    const uint32_t tail = NewRule();
    Sequence more = sequence;
    more.push_back(Ref(tail));
    AddAlternative(tail, more);
    AddAlternative(tail, {});
    for (int64_t i = 0; i < min && !too_large(); ++i) {
      body.insert(body.end(), sequence.begin(), sequence.end());
    }
    body.push_back(Ref(tail));
    return Rule({body});
  }
  // Optional copies nest: opt_k ::= sequence opt_{k-1} | "".
  uint32_t optional = Rule({{}});
  for (int64_t i = 0; i < max - min && !too_large(); ++i) {
    Sequence more = sequence;
    more.push_back(Ref(optional));
    optional = Rule({more, {}});
  }
  for (int64_t i = 0; i < min && !too_large(); ++i) {
    body.insert(body.end(), sequence.begin(), sequence.end());
  }
  body.push_back(Ref(optional));
  return Rule({body});
}

absl::StatusOr<Grammar> GrammarBuilder::Build(uint32_t root) && {
  if (too_large()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the constraint compiles to a grammar of more than ", kMaxGrammarElements,
        " elements; simplify it (fewer or smaller bounded repetitions, properties, choices)"));
  }
  for (size_t r = 0; r < rules_.size(); ++r) {
    if (rules_[r].empty()) {
      return absl::InternalError(absl::StrCat("grammar rule ", r, " has no alternatives"));
    }
  }
  Grammar g;
  g.elements = std::move(elements_);
  g.rules = std::move(rules_);
  g.byte_sets = std::move(byte_sets_);
  g.root = root;
  // The fewest bytes each rule derives, by relaxation to a fixed point (rules recurse).
  constexpr uint32_t kInf = Grammar::kInfinite;
  g.rule_min_bytes.assign(g.rules.size(), kInf);
  const auto sequence_min = [&g](uint32_t pos) {
    uint64_t total = 0;
    for (; g.elements[pos].kind != Element::Kind::kEnd; ++pos) {
      const Element& e = g.elements[pos];
      const uint64_t n = e.kind == Element::Kind::kBytes ? 1 : g.rule_min_bytes[e.value];
      if (n == kInf) return kInf;
      total += n;
    }
    return static_cast<uint32_t>(std::min<uint64_t>(total, kInf - 1));
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < g.rules.size(); ++r) {
      uint32_t best = g.rule_min_bytes[r];
      for (uint32_t start : g.rules[r]) best = std::min(best, sequence_min(start));
      if (best < g.rule_min_bytes[r]) {
        g.rule_min_bytes[r] = best;
        changed = true;
      }
    }
  }
  if (g.rule_min_bytes[root] == kInf) {
    return absl::InvalidArgumentError(
        "the constraint can never be completed: every value it allows is infinite (a required "
        "recursion with no way out)");
  }
  // An alternative that can never end is dead: dropping it keeps a matcher from entering it.
  for (auto& alternatives : g.rules) {
    std::erase_if(alternatives, [&](uint32_t start) { return sequence_min(start) == kInf; });
  }
  g.min_rest.assign(g.elements.size(), 0);
  for (size_t p = g.elements.size(); p-- > 0;) {
    const Element& e = g.elements[p];
    if (e.kind == Element::Kind::kEnd) continue;
    const uint64_t n = e.kind == Element::Kind::kBytes ? 1 : g.rule_min_bytes[e.value];
    g.min_rest[p] = static_cast<uint32_t>(std::min<uint64_t>(n + g.min_rest[p + 1], kInf - 1));
  }
  return g;
}

}  // namespace tandem::structured
