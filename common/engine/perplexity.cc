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

// log softmax(row)[target] for a (vocab,) row of float32 logits. The exponentials are float (to
// within an ulp) and summed in double, so the result is good to ~1e-7 whatever the vocabulary.
double LogProb(const float* row, int vocab, int32_t target) {
  const float max = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(row[i] - max);
  return (static_cast<double>(row[target]) - max) - std::log(sum);
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

  ASSIGN_OR_RETURN(ProtocolText protocol, ReadProtocolText(tokenizer, text_path, options.window));
  PerplexityResult result;
  result.documents = protocol.documents;
  const std::vector<int32_t>& scored = protocol.scored;
  const std::vector<ProtocolWindow>& windows = protocol.windows;

  KvBlockPool* pool = forward->pool();
  const int block_size = pool->config().block_size;
  const int free_blocks = pool->num_free();
  int longest = 0;
  for (const ProtocolWindow& w : windows) longest = std::max(longest, w.size + 1);
  if (BlocksFor(longest, block_size) > free_blocks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the KV pool has ", free_blocks, " free blocks of ", block_size, " tokens; a window of ",
        longest, " tokens needs ", BlocksFor(longest, block_size)));
  }

  std::vector<double> logprobs(scored.size());
  std::vector<std::vector<int32_t>> inputs;
  std::vector<BlockTable> tables;
  std::vector<StepInput> batch;
  std::vector<std::vector<float>> logits;
  for (size_t next = 0; next < windows.size();) {
    // As many whole windows as the step's token budget and the pool's blocks allow.
    size_t last = next;
    for (int tokens = 0, blocks = 0; last < windows.size(); ++last) {
      const int n = windows[last].size + 1;
      const int b = BlocksFor(n, block_size);
      if (last > next && (tokens + n > options.max_step_tokens || blocks + b > free_blocks)) break;
      tokens += n;
      blocks += b;
    }
    const size_t count = last - next;
    inputs.resize(count);
    tables.assign(count, BlockTable());
    batch.resize(count);
    absl::Status status;
    for (size_t i = 0; i < count && status.ok(); ++i) {
      const ProtocolWindow& w = windows[next + i];
      inputs[i].assign(1, bos);
      inputs[i].insert(inputs[i].end(), scored.begin() + w.begin,
                       scored.begin() + w.begin + w.size);
      status = tables[i].Reserve(pool, w.size + 1);
      batch[i] = StepInput();
      batch[i].tokens = inputs[i];
      batch[i].start_position = 0;
      batch[i].block_table = &tables[i];
      batch[i].logits = LogitRows::kAll;
    }
    if (status.ok()) status = forward->Step(batch, options.moe, &logits);
    for (BlockTable& table : tables) table.ReleaseAll(pool);
    if (!status.ok()) return status;

    // Row r of window i's logits (positions [BOS] + c) predicts c[r]; the row after the last
    // target predicts nothing.
    struct Row {
      const float* logits;
      int64_t target;  // index into `scored`
    };
    std::vector<Row> rows;
    for (size_t i = 0; i < count; ++i) {
      const ProtocolWindow& w = windows[next + i];
      for (int r = 0; r < w.size; ++r) {
        rows.push_back({logits[i].data() + static_cast<size_t>(r) * vocab, w.begin + r});
      }
    }
    kernels::cpu::DefaultThreadPool().ParallelFor(
        static_cast<int64_t>(rows.size()), 16, [&](int64_t begin, int64_t end) {
          for (int64_t j = begin; j < end; ++j) {
            logprobs[rows[j].target] = LogProb(rows[j].logits, vocab, scored[rows[j].target]);
          }
        });
    next = last;
  }

  // Summed in protocol order, so the result does not depend on how windows were batched.
  double total = 0;
  for (double lp : logprobs) total -= lp;
  result.windows = static_cast<int64_t>(windows.size());
  result.tokens = static_cast<int64_t>(scored.size());
  result.nll = total / static_cast<double>(result.tokens);
  result.perplexity = std::exp(result.nll);
  result.logprobs.assign(logprobs.begin(), logprobs.end());
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
  KvCacheConfig kv{static_cast<int>(c.num_hidden_layers), static_cast<int>(c.num_key_value_heads),
                   static_cast<int>(c.head_dim), kBlockSize, blocks};
  ASSIGN_OR_RETURN(std::unique_ptr<KvBlockPool> pool, KvBlockPool::Create(kv));
  ASSIGN_OR_RETURN(std::unique_ptr<ForwardPass> forward, ForwardPass::Create(&weights, pool.get()));
  return EvaluatePerplexity(forward.get(), tokenizer, text_path, options);
}

}  // namespace tandem::engine
