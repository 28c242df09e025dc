#include "common/engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/engine/kv_cache.h"
#include "common/kernels/cpu/kernels.h"
#include "common/kernels/cpu/thread_pool.h"
#include "common/util/status.h"

namespace tandem::engine {
namespace {

constexpr int kBlockSize = 16;  // tokens per KV block of the pool the convenience overload makes

int BlocksFor(int tokens, int block_size) {
  return static_cast<int>((static_cast<int64_t>(tokens) + block_size - 1) / block_size);
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    return absl::NotFoundError(absl::StrCat("text file ", path, " does not exist"));
  }
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat("text file ", path, " is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) return absl::PermissionDeniedError(absl::StrCat("cannot open ", path));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return text;
}

// log softmax(row)[target] for a (vocab,) row of float32 logits: the kernel's normaliser
// (float exponentials summed in double), the one ComputeLogprobs uses too, so a served request's
// log-probabilities add up to this protocol's.
double LogProb(const float* row, int vocab, int32_t target) {
  return static_cast<double>(row[target]) - kernels::cpu::LogSumExp(row, vocab);
}

}  // namespace

absl::StatusOr<ProtocolText> ReadProtocolText(const model::Tokenizer& tokenizer,
                                              const std::string& text_path, int window) {
  if (window < 1) return absl::InvalidArgumentError("the window must be >= 1");
  const int32_t eos = tokenizer.eos_id();
  if (tokenizer.bos_id() < 0 || eos < 0) {
    return absl::InvalidArgumentError("the evaluation protocol needs a tokenizer with BOS and EOS");
  }
  // The documents, EOS appended, back to back: `scored` is every target in protocol order.
  ASSIGN_OR_RETURN(const std::string text, ReadText(text_path));
  ProtocolText out;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    // As Python's text mode reads a CRLF file; a blank line is no document.
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (std::all_of(line.begin(), line.end(), [](char ch) { return absl::ascii_isspace(ch); })) {
      continue;
    }
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(line));
    ids.push_back(eos);
    for (size_t s = 0; s < ids.size(); s += window) {
      out.windows.push_back({static_cast<int64_t>(out.scored.size() + s),
                             static_cast<int>(std::min<size_t>(window, ids.size() - s))});
    }
    out.scored.insert(out.scored.end(), ids.begin(), ids.end());
    ++out.documents;
  }
  if (out.documents == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("text file ", text_path, " holds no document (no non-blank line)"));
  }
  return out;
}

absl::StatusOr<PerplexityResult> EvaluatePerplexity(ForwardPass* forward,
                                                    const model::Tokenizer& tokenizer,
                                                    const std::string& text_path,
                                                    const PerplexityOptions& options) {
  const model::ModelConfig& c = forward->weights().config;
  const int vocab = static_cast<int>(c.vocab_size);
  if (options.window < 1 || options.window + 1 > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "perplexity window ", options.window, " must be in [1, ", c.max_position_embeddings - 1,
        "] (BOS + window within the context length ", c.max_position_embeddings, ")"));
  }
  if (options.max_step_tokens < 1) {
    return absl::InvalidArgumentError("perplexity max_step_tokens must be >= 1");
  }
  const int32_t bos = tokenizer.bos_id();
  const int32_t eos = tokenizer.eos_id();
  if (bos < 0 || eos < 0) {
    return absl::InvalidArgumentError("the perplexity protocol needs a tokenizer with BOS and EOS");
  }

  if (options.context < 0 || options.context >= options.window) {
    return absl::InvalidArgumentError(absl::StrCat("perplexity context ", options.context,
                                                   " must be in [0, window ", options.window, ")"));
  }
  ASSIGN_OR_RETURN(ProtocolText protocol, ReadProtocolText(tokenizer, text_path, options.window));
  PerplexityResult result;
  result.documents = protocol.documents;
  const std::vector<int32_t>& scored = protocol.scored;
  const int context = options.context;
  std::vector<ProtocolWindow> windows;
  for (const ProtocolWindow& w : protocol.windows) {
    if (w.size > context) windows.push_back(w);
  }
  if (windows.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no window of ", text_path, " is longer than ", context, " prompt tokens"));
  }

  KvBlockPool* pool = forward->pool();
  const int block_size = pool->config().block_size;
  const int free_blocks = pool->num_free();
  // A model with recurrent layers holds a state slot per window in flight.
  const size_t free_states = pool->config().num_state_slots > 0
                                 ? static_cast<size_t>(pool->num_free_states())
                                 : windows.size();
  if (free_states == 0) {
    return absl::ResourceExhaustedError("the KV pool has no free state slot for a window");
  }
  int longest = 0;
  for (const ProtocolWindow& w : windows) longest = std::max(longest, w.size + 1);
  if (BlocksFor(longest, block_size) > free_blocks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the KV pool has ", free_blocks, " free blocks of ", block_size, " tokens; a window of ",
        longest, " tokens needs ", BlocksFor(longest, block_size)));
  }

  // Per target of `scored`: its log-probability, whether it was the argmax, whether scored, and
  // its offset in its continuation.
  std::vector<double> logprobs(scored.size());
  std::vector<char> top1(scored.size()), is_scored(scored.size());
  std::vector<int32_t> offsets(scored.size());
  std::vector<std::vector<int32_t>> prompts, continuations;
  std::vector<BlockTable> tables;
  std::vector<StepInput> prompt_batch, batch;
  std::vector<std::vector<float>> prompt_logits, logits;
  for (size_t next = 0; next < windows.size();) {
    // As many whole windows as the step's token budget and the pool's blocks allow.
    size_t last = next;
    for (int tokens = 0, blocks = 0; last < windows.size(); ++last) {
      const int n = windows[last].size + 1;
      const int b = BlocksFor(n, block_size);
      if (last > next && (tokens + n > options.max_step_tokens || blocks + b > free_blocks ||
                          last - next == free_states)) {
        break;
      }
      tokens += n;
      blocks += b;
    }
    const size_t count = last - next;
    prompts.resize(count);
    continuations.resize(count);
    tables.assign(count, BlockTable());
    prompt_batch.resize(count);
    batch.resize(count);
    absl::Status status;
    // Window positions: [BOS] + c. With a prompt, [BOS] + c[0, context) runs first and its last
    // row predicts c[context]; c[context, size) follows, its row r predicting c[context + 1 + r].
    // Without, [BOS] + c runs at once, row r predicting c[r].
    for (size_t i = 0; i < count && status.ok(); ++i) {
      const ProtocolWindow& w = windows[next + i];
      const auto c0 = scored.begin() + w.begin;
      status = tables[i].Reserve(pool, w.size + 1);
      prompts[i].assign(1, bos);
      prompts[i].insert(prompts[i].end(), c0, c0 + context);
      continuations[i].clear();
      if (context == 0) continuations[i].push_back(bos);
      continuations[i].insert(continuations[i].end(), c0 + context, c0 + w.size);
      prompt_batch[i] = {prompts[i], 0, &tables[i], LogitRows::kLast};
      batch[i] = {continuations[i], context == 0 ? 0 : context + 1, &tables[i], LogitRows::kAll};
    }
    if (status.ok() && context > 0) {
      status = forward->Step(prompt_batch, options.context_moe, &prompt_logits);
    }
    if (status.ok()) status = forward->Step(batch, options.moe, &logits);
    for (BlockTable& table : tables) table.ReleaseAll(pool);
    if (!status.ok()) return status;

    struct Row {
      const float* logits;
      int64_t target;  // index into `scored`
      int32_t offset;  // in the continuation
    };
    std::vector<Row> rows;
    for (size_t i = 0; i < count; ++i) {
      const ProtocolWindow& w = windows[next + i];
      if (context > 0) rows.push_back({prompt_logits[i].data(), w.begin + context, 0});
      const int first = context == 0 ? 0 : context + 1;  // the target row 0 predicts
      for (int t = first; t < w.size; ++t) {
        rows.push_back(
            {logits[i].data() + static_cast<size_t>(t - first) * vocab, w.begin + t, t - context});
      }
    }
    kernels::cpu::DefaultThreadPool().ParallelFor(
        static_cast<int64_t>(rows.size()), 16, [&](int64_t begin, int64_t end) {
          for (int64_t j = begin; j < end; ++j) {
            const int64_t target = rows[j].target;
            logprobs[target] = LogProb(rows[j].logits, vocab, scored[target]);
            top1[target] =
                std::max_element(rows[j].logits, rows[j].logits + vocab) - rows[j].logits ==
                scored[target];
            is_scored[target] = 1;
            offsets[target] = rows[j].offset;
          }
        });
    next = last;
  }

  // Summed in protocol order, so the result does not depend on how windows were batched.
  double total = 0;
  int64_t correct = 0;
  for (size_t t = 0; t < scored.size(); ++t) {
    if (!is_scored[t]) continue;
    total -= logprobs[t];
    correct += top1[t];
    result.logprobs.push_back(static_cast<float>(logprobs[t]));
    result.top1.push_back(top1[t]);
    result.offsets.push_back(offsets[t]);
  }
  result.windows = static_cast<int64_t>(windows.size());
  result.tokens = static_cast<int64_t>(result.logprobs.size());
  result.nll = total / static_cast<double>(result.tokens);
  result.perplexity = std::exp(result.nll);
  result.accuracy = static_cast<double>(correct) / static_cast<double>(result.tokens);
  return result;
}

absl::StatusOr<PerplexityResult> EvaluatePerplexity(const ModelWeights& weights,
                                                    const model::Tokenizer& tokenizer,
                                                    const std::string& text_path,
                                                    const PerplexityOptions& options) {
  const model::ModelConfig& c = weights.config;
  // Room for a full step plus the slack of partly filled blocks, and always one full window.
  const int blocks = BlocksFor(std::max(options.max_step_tokens, 1), kBlockSize) +
                     BlocksFor(std::max(options.window, 0) + 1, kBlockSize);
  // Windows share a step up to the free state slots too (recurrent layers), 8 here.
  const KvCacheConfig kv =
      KvCacheConfigFor(c, kBlockSize, blocks, options.kv_dtype, /*max_sequences=*/8);
  ASSIGN_OR_RETURN(std::unique_ptr<KvBlockPool> pool, KvBlockPool::Create(kv));
  ASSIGN_OR_RETURN(std::unique_ptr<ForwardPass> forward, ForwardPass::Create(&weights, pool.get()));
  return EvaluatePerplexity(forward.get(), tokenizer, text_path, options);
}

}  // namespace tandem::engine
