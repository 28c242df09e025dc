// `tandem`: the command-line client. Talks to a gateway through the C++ SDK, or runs a model in
// this process (--model). The subcommands, their usage and their flags are listed in
// subcommands.cc (`tandem help`, `tandem SUB --help`).
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/chat/chat_template.h"
#include "common/config/config.h"
#include "common/engine/generator.h"
#include "common/engine/overlay.h"
#include "common/engine/perplexity.h"
#include "common/kernels/cpu/kernels.h"
#include "common/model/config.h"
#include "common/model/model_dir.h"
#include "common/model/tokenizer.h"
#include "common/moe/calibration.h"
#include "common/moe/pruning_plan.h"
#include "common/util/clock.h"
#include "common/util/status.h"
#include "nlohmann/json.hpp"
#include "tandem/client.h"
#include "tandem/version.h"
#include "tools/cli/commands.h"
#include "tools/cli/subcommands.h"

ABSL_FLAG(std::string, endpoint, "127.0.0.1:50051",
          "Gateway gRPC address, host:port (bench serve --backend http: its HTTP address).");
ABSL_FLAG(std::string, model, "",
          "Model directory: generate in this process from it instead of through a gateway, or "
          "the model perplexity scores; bench serve: where the vocabulary size of random "
          "prompts is read.");
ABSL_FLAG(std::string, prompt, "", "The prompt text.");
ABSL_FLAG(std::string, messages, "",
          "tokenize --model: a JSON list of chat messages, rendered by the model's chat "
          "template.");
ABSL_FLAG(std::string, text, "",
          "Text to tokenize (tokenize); the path of the text file to score (perplexity, eval).");
ABSL_FLAG(int, max_tokens, 64,
          "Tokens to generate at most (generate); eval: the budget continuations are judged by.");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature; 0 = greedy.");
ABSL_FLAG(double, top_p, 1.0, "Nucleus sampling mass.");
ABSL_FLAG(int, top_k, 0, "Sample among the k most likely tokens; 0 = off.");
ABSL_FLAG(int64_t, seed, -1,
          "Sampling seed; -1 = random (generate). bench serve: the seed of the arrival times "
          "and the random prompts; -1 = 0.");
ABSL_FLAG(bool, stream, false, "Stream tokens as they arrive.");
ABSL_FLAG(std::string, load_format, "auto",
          "With --model: auto | safetensors | dummy (random weights of the config's shape, for "
          "throughput work; needs --routing).");
ABSL_FLAG(std::string, routing, "",
          "With --model: replace the router by a stated one, uniform or zipf:S (required for "
          "--load_format dummy).");
ABSL_FLAG(std::string, kv_dtype, "bf16",
          "How the KV cache of tandem perplexity stores keys and values: f32, bf16, or int8 "
          "(per-token, per-head scales); docs/kv-cache.md.");
ABSL_FLAG(std::string, kernels, "",
          "CPU kernel level of commands that run a model here: auto (the fastest this CPU has), "
          "exact (the fastest that keeps activations float32), or reference, avx2, avx2int8, "
          "avx512, avx512vnni, avx512bf16, amx; empty: TANDEM_KERNELS, else auto.");
ABSL_FLAG(std::string, out, "",
          "Where calibrate writes its statistics (JSON), prune its plan (proto JSON), or bench "
          "serve its result (JSON).");
ABSL_FLAG(std::string, stats, "",
          "Calibration statistics (from calibrate) that prune, reorder and tier read.");
ABSL_FLAG(std::string, criterion, "reap", "prune: frequency, mass, ean or reap.");
ABSL_FLAG(int, keep, 0, "prune: experts retained per layer.");
ABSL_FLAG(std::string, plan, "",
          "perplexity: mask the experts this pruning plan drops (conventional pruning); eval: "
          "the pruned model.");
ABSL_FLAG(std::string, overlay, "",
          "perplexity, eval: a decoder overlay of --plan (tools/train/distill.py): the pruned "
          "model's distilled norms, routers and shared experts.");
ABSL_FLAG(std::string, tls_root_certs, "",
          "PEM file of root certificates: talk to the gateway over TLS, trusting these.");
ABSL_FLAG(double, timeout_s, 120.0,
          "Deadline of each call, in seconds (bench serve: of each request).");

namespace tandem::cli {

int Report(const absl::Status& status) {
  std::cerr << "tandem: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace tandem::cli

namespace {

namespace util = tandem::util;
using tandem::cli::Report;

absl::StatusOr<std::unique_ptr<tandem::sdk::Client>> Connect() {
  tandem::sdk::ClientOptions options;
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  if (const std::string path = absl::GetFlag(FLAGS_tls_root_certs); !path.empty()) {
    std::ifstream in(path);
    if (!in) return absl::InvalidArgumentError("--tls_root_certs=" + path + ": cannot read");
    options.tls_root_certs.assign(std::istreambuf_iterator<char>(in), {});
  }
  return tandem::sdk::Client::Connect(absl::GetFlag(FLAGS_endpoint), options);
}

const char* FinishName(tandem::engine::FinishReason reason) {
  switch (reason) {
    case tandem::engine::FinishReason::kStop:
      return "stop";
    case tandem::engine::FinishReason::kLength:
      return "length";
    case tandem::engine::FinishReason::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<tandem::engine::LoadOptions> LoadOptionsFromFlags() {
  tandem::engine::LoadOptions options;
  ASSIGN_OR_RETURN(options.format,
                   tandem::engine::ParseLoadFormat(absl::GetFlag(FLAGS_load_format)));
  options.routing = absl::GetFlag(FLAGS_routing);
  if (absl::GetFlag(FLAGS_seed) >= 0) options.seed = absl::GetFlag(FLAGS_seed);
  return options;
}

// Generation in this process: load the model, prefill, decode one token at a time.
int GenerateLocally() {
  const util::Instant load_start = util::Instant::Now();
  auto load = LoadOptionsFromFlags();
  if (!load.ok()) return Report(load.status());
  auto dir = tandem::model::ModelDir::Open(absl::GetFlag(FLAGS_model));
  if (!dir.ok()) return Report(dir.status());
  auto generator = tandem::engine::Generator::Load(**dir, 256, *load);
  if (!generator.ok()) return Report(generator.status());
  const double load_seconds = absl::ToDoubleSeconds(util::Since(load_start));
  tandem::engine::SamplingParams params;
  params.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  params.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  params.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  params.top_k = absl::GetFlag(FLAGS_top_k);
  if (absl::GetFlag(FLAGS_seed) >= 0) params.seed = absl::GetFlag(FLAGS_seed);
  const bool stream = absl::GetFlag(FLAGS_stream);
  auto result =
      (*generator)->Generate(absl::GetFlag(FLAGS_prompt), params, [&](const std::string& text) {
        if (stream) std::cout << text << std::flush;
      });
  if (!result.ok()) return Report(result.status());
  std::cout << (stream ? "" : result->text) << std::endl;
  const size_t generated = result->output_ids.size();
  std::cerr << absl::StrCat(
      "load ", absl::SixDigits(load_seconds), " s; prompt ", result->prompt_ids.size(),
      " tokens in ", absl::SixDigits(result->prefill_seconds), " s (",
      absl::SixDigits(result->prompt_ids.size() / result->prefill_seconds), " tokens/s); ",
      generated, " generated in ", absl::SixDigits(result->decode_seconds), " s (",
      generated > 1 ? absl::StrCat(absl::SixDigits((generated - 1) / result->decode_seconds))
                    : std::string("-"),
      " tokens/s after the first); finish: ", FinishName(result->finish_reason), "\n");
  return 0;
}

int Generate() {
  if (absl::GetFlag(FLAGS_prompt).empty()) {
    return Report(absl::InvalidArgumentError("--prompt is required"));
  }
  if (!absl::GetFlag(FLAGS_model).empty()) return GenerateLocally();
  auto client = Connect();
  if (!client.ok()) return Report(client.status());
  tandem::v1::GenerateRequest request;
  request.set_prompt(absl::GetFlag(FLAGS_prompt));
  auto* sampling = request.mutable_sampling();
  sampling->set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  sampling->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  sampling->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  sampling->set_top_k(absl::GetFlag(FLAGS_top_k));
  if (absl::GetFlag(FLAGS_seed) >= 0) sampling->set_seed(absl::GetFlag(FLAGS_seed));
  const util::Instant start = util::Instant::Now();
  int tokens = 0;
  absl::Status status;
  if (absl::GetFlag(FLAGS_stream)) {
    status = (*client)->GenerateStream(request, [&](const auto& chunk) {
      std::cout << chunk.text() << std::flush;
      tokens += chunk.token_ids_size();
    });
    std::cout << "\n";
  } else {
    auto response = (*client)->Generate(request);
    status = response.status();
    if (response.ok()) {
      std::cout << response->text() << "\n";
      tokens = response->usage().completion_tokens();
    }
  }
  if (!status.ok()) return Report(status);
  const double seconds = absl::ToDoubleSeconds(util::Since(start));
  std::cerr << absl::StrCat(tokens, " tokens in ", seconds, " s (", tokens / seconds,
                            " tokens/s)\n");
  return 0;
}

// tokenize --model: the model directory's tokenizer (and chat template) in this process.
int TokenizeLocally() {
  auto dir = tandem::model::ModelDir::Open(absl::GetFlag(FLAGS_model));
  if (!dir.ok()) return Report(dir.status());
  auto tokenizer = (*dir)->tokenizer();
  if (!tokenizer.ok()) return Report(tokenizer.status());
  std::string text = absl::GetFlag(FLAGS_text);
  bool add_bos = (*tokenizer)->add_bos();
  if (const std::string messages = absl::GetFlag(FLAGS_messages); !messages.empty()) {
    auto chat = tandem::chat::ChatTemplate::Load(**dir);
    if (!chat.ok()) return Report(chat.status());
    const auto parsed =
        nlohmann::ordered_json::parse(messages, nullptr, /*allow_exceptions=*/false);
    auto normalized = tandem::chat::NormalizeMessages(parsed);
    if (!normalized.ok()) return Report(normalized.status());
    tandem::chat::ChatInput input;
    input.messages = *std::move(normalized);
    auto prompt = chat->Apply(input);
    if (!prompt.ok()) return Report(prompt.status());
    std::cerr << *prompt << "\n";
    text = *std::move(prompt);
    add_bos = false;  // the template wrote it
  }
  auto ids = (*tokenizer)->Encode(text);
  if (!ids.ok()) return Report(ids.status());
  if (add_bos) ids->insert(ids->begin(), (*tokenizer)->bos_id());
  std::cout << absl::StrJoin(*ids, " ") << "\n";
  return 0;
}

int Tokenize() {
  if (!absl::GetFlag(FLAGS_model).empty()) return TokenizeLocally();
  if (!absl::GetFlag(FLAGS_messages).empty()) {
    return Report(absl::InvalidArgumentError("--messages needs --model"));
  }
  auto client = Connect();
  if (!client.ok()) return Report(client.status());
  tandem::v1::TokenizeRequest request;
  request.set_text(absl::GetFlag(FLAGS_text));
  auto response = (*client)->Tokenize(request);
  if (!response.ok()) return Report(response.status());
  std::cout << absl::StrJoin(response->token_ids(), " ") << "\n";
  return 0;
}

// Calibration statistics of --model over the text file --text, written to --out.
int Calibrate() {
  if (absl::GetFlag(FLAGS_model).empty() || absl::GetFlag(FLAGS_text).empty() ||
      absl::GetFlag(FLAGS_out).empty()) {
    return Report(
        absl::InvalidArgumentError("calibrate needs --model DIR, --text FILE and --out STATS"));
  }
  auto dir = tandem::model::ModelDir::Open(absl::GetFlag(FLAGS_model));
  if (!dir.ok()) return Report(dir.status());
  // Dummy weights (with their stated routing) calibrate too: how benchmarks make plans for them.
  auto load = LoadOptionsFromFlags();
  if (!load.ok()) return Report(load.status());
  auto model = tandem::engine::LoadModelDir(**dir, *load);
  if (!model.ok()) return Report(model.status());
  const auto& c = model->weights->config;
  const int block = 16;
  auto pool = tandem::engine::KvBlockPool::Create(tandem::engine::KvCacheConfigFor(
      c, block, static_cast<int>((c.max_position_embeddings + block - 1) / block),
      tandem::kernels::KvDtype::kF32, /*max_sequences=*/1));
  if (!pool.ok()) return Report(pool.status());
  auto forward = tandem::engine::ForwardPass::Create(model->weights.get(), pool->get());
  if (!forward.ok()) return Report(forward.status());
  if (absl::Status s = tandem::engine::ApplyRouting(*load, forward->get()); !s.ok()) {
    return Report(s);
  }
  const util::Instant start = util::Instant::Now();
  int shown = -1;
  auto stats = tandem::moe::Calibrate(
      forward->get(), *model->tokenizer, absl::GetFlag(FLAGS_text), [&](double done) {
        const int percent = static_cast<int>(done * 100);
        if (percent == shown) return;
        shown = percent;
        std::cerr << "\rcalibrating: " << std::string(percent / 5, '#')
                  << std::string(20 - percent / 5, '.') << " " << percent << "%" << std::flush;
      });
  std::cerr << "\n";
  if (!stats.ok()) return Report(stats.status());
  stats->model = (*dir)->name();
  std::ofstream out(absl::GetFlag(FLAGS_out));
  out << stats->ToJson().dump(1) << "\n";
  if (!out) return Report(absl::InternalError("cannot write " + absl::GetFlag(FLAGS_out)));
  std::cout << "calibrated " << stats->tokens << " tokens in "
            << absl::ToDoubleSeconds(util::Since(start)) << " s; statistics in "
            << absl::GetFlag(FLAGS_out) << std::endl;
  return 0;
}

// A pruning plan from --stats by --criterion, keeping --keep experts per layer, to --out.
int Prune() {
  if (absl::GetFlag(FLAGS_stats).empty() || absl::GetFlag(FLAGS_out).empty()) {
    return Report(absl::InvalidArgumentError("prune needs --stats STATS and --out PLAN"));
  }
  auto criterion = tandem::moe::ParseCriterion(absl::GetFlag(FLAGS_criterion));
  if (!criterion.ok()) return Report(criterion.status());
  auto stats = tandem::moe::LoadCalibrationStats(absl::GetFlag(FLAGS_stats));
  if (!stats.ok()) return Report(stats.status());
  auto plan = tandem::moe::MakePlan(*stats, *criterion, absl::GetFlag(FLAGS_keep));
  if (!plan.ok()) return Report(plan.status());
  if (absl::Status s = tandem::moe::SavePlan(*plan, absl::GetFlag(FLAGS_out)); !s.ok()) {
    return Report(s);
  }
  std::cout << "kept " << absl::GetFlag(FLAGS_keep) << " of " << plan->num_experts()
            << " experts in each of " << plan->num_layers() << " layers by "
            << absl::GetFlag(FLAGS_criterion) << "; plan in " << absl::GetFlag(FLAGS_out)
            << std::endl;
  return 0;
}

// Perplexity of --model on the text file --text, in this process.
int Perplexity() {
  if (absl::GetFlag(FLAGS_model).empty() || absl::GetFlag(FLAGS_text).empty()) {
    return Report(absl::InvalidArgumentError("perplexity needs --model DIR and --text FILE"));
  }
  if (!absl::GetFlag(FLAGS_routing).empty() || absl::GetFlag(FLAGS_load_format) == "dummy") {
    return Report(absl::InvalidArgumentError(
        "perplexity scores a checkpoint with its own router; --load_format dummy and --routing "
        "are for generate"));
  }
  tandem::engine::PerplexityOptions ppl_options;
  auto kv_dtype = tandem::kernels::ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) return Report(kv_dtype.status());
  ppl_options.kv_dtype = *kv_dtype;
  auto dir = tandem::model::ModelDir::Open(absl::GetFlag(FLAGS_model));
  if (!dir.ok()) return Report(dir.status());
  tandem::engine::ExpertMask mask;
  if (const std::string path = absl::GetFlag(FLAGS_plan); !path.empty()) {
    auto plan_mask = tandem::moe::LoadPlanMask(path, **dir);
    if (!plan_mask.ok()) return Report(plan_mask.status());
    mask = *std::move(plan_mask);
    ppl_options.moe.mask = &mask;
  }
  const util::Instant load_start = util::Instant::Now();
  auto model = tandem::engine::LoadModelDir(**dir);
  if (!model.ok()) return Report(model.status());
  std::unique_ptr<tandem::engine::DecoderOverlay> overlay;
  if (const std::string path = absl::GetFlag(FLAGS_overlay); !path.empty()) {
    auto loaded = tandem::engine::LoadDecoderOverlay(path, **dir, *model->weights, mask);
    if (!loaded.ok()) return Report(loaded.status());
    overlay = *std::move(loaded);
    ppl_options.moe.overlay = overlay.get();
  }
  const util::Instant start = util::Instant::Now();
  auto result = tandem::engine::EvaluatePerplexity(*model->weights, *model->tokenizer,
                                                   absl::GetFlag(FLAGS_text), ppl_options);
  if (!result.ok()) return Report(result.status());
  const double seconds = absl::ToDoubleSeconds(util::Since(start));
  std::cout << std::fixed << std::setprecision(2) << "perplexity " << result->perplexity << " over "
            << result->tokens << " tokens (" << std::setprecision(0) << result->tokens / seconds
            << " tokens/s)" << std::endl;
  std::cerr << absl::StrCat("load ", absl::SixDigits(absl::ToDoubleSeconds(start - load_start)),
                            " s; ", result->documents, " documents in ", result->windows,
                            " windows; mean nll ", absl::SixDigits(result->nll), " nats/token; ",
                            absl::SixDigits(seconds), " s\n");
  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    double logprob_sum = 0;
    for (float lp : result->logprobs) logprob_sum += lp;
    const nlohmann::json json = {{"perplexity", result->perplexity},
                                 {"nll", result->nll},
                                 {"tokens", result->tokens},
                                 {"documents", result->documents},
                                 {"logprob_sum", logprob_sum}};
    std::ofstream file(out);
    file << json.dump(2) << "\n";
    if (!file) return Report(absl::UnavailableError(absl::StrCat("cannot write ", out)));
  }
  return 0;
}

int Models() {
  auto client = Connect();
  if (!client.ok()) return Report(client.status());
  auto response = (*client)->ListModels();
  if (!response.ok()) return Report(response.status());
  for (const auto& model : response->models()) {
    std::cout << model.name() << "\t" << model.architecture() << "\tcontext "
              << model.context_length() << "\n";
  }
  return 0;
}

int Health() {
  auto client = Connect();
  if (!client.ok()) return Report(client.status());
  if (absl::Status status = (*client)->Health(); !status.ok()) return Report(status);
  std::cout << "SERVING\n";
  return 0;
}

}  // namespace

// `tandem serve ARGS` runs tandem-serve (colocated mode) from the same directory with ARGS.
int Serve(int argc, char** argv) {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  const std::string binary =
      (error ? std::filesystem::path(argv[0]).parent_path() : self.parent_path()) / "tandem-serve";
  std::vector<char*> args = {const_cast<char*>(binary.c_str())};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(binary.c_str(), args.data());
  std::cerr << "tandem: serve runs " << binary
            << ", which cannot be started: " << std::strerror(errno) << "\n";
  return 1;
}

int main(int argc, char** argv) {
  using tandem::cli::FindSubcommand;
  using tandem::cli::Subcommand;
  if (argc >= 2 && std::string(argv[1]) == "serve") return Serve(argc, argv);
  const tandem::config::ProgramInfo program{
      "tandem", "Tandem's command-line client", "", {"tools/cli/"}};
  auto line = tandem::config::SplitCommandLine(argc, argv, program);
  if (!line.ok()) return Report(line.status());
  if (line->version) {
    std::cout << "tandem " << tandem::kVersion << "\n";
    return 0;
  }
  const std::vector<std::string> words(line->positional.begin() + 1, line->positional.end());
  // `tandem`, `tandem help [COMMAND]`, `tandem [COMMAND] --help`.
  if (words.empty()) {
    std::cerr << tandem::cli::OverviewText();
    return line->help ? 0 : 2;
  }
  const bool help_word = words[0] == "help";
  const std::vector<std::string> named(words.begin() + (help_word ? 1 : 0), words.end());
  const Subcommand* subcommand = FindSubcommand(named);
  if (help_word || line->help) {
    if (named.empty()) {
      std::cout << tandem::cli::OverviewText();
      return 0;
    }
    if (subcommand == nullptr) {
      std::cerr << "tandem: unknown command '" << named[0] << "'\n\n"
                << tandem::cli::OverviewText();
      return 2;
    }
    std::cout << tandem::cli::SubcommandHelp(*subcommand);
    return 0;
  }
  if (subcommand == nullptr) {
    std::cerr << "tandem: unknown command '" << named[0] << "'"
              << (named[0] == "bench" ? " (tandem bench serve is the benchmark)" : "") << "\n\n"
              << tandem::cli::OverviewText();
    return 2;
  }
  if (absl::Status s = tandem::cli::CheckFlags(*subcommand, line->flags); !s.ok()) {
    return Report(s);
  }
  const size_t expected = subcommand->name == "bench serve" ? 2 : 1;
  if (words.size() != expected) {
    std::cerr << "tandem " << subcommand->name << ": unexpected argument '" << words[expected]
              << "'\nusage: " << subcommand->usage << "\n";
    return 2;
  }
  if (absl::Status s = tandem::config::ApplyCommandLine(*line, program); !s.ok()) return Report(s);
  if (const std::string level = absl::GetFlag(FLAGS_kernels);
      !level.empty() && !tandem::kernels::cpu::SetKernelIsa(level)) {
    return Report(absl::InvalidArgumentError(
        absl::StrCat("--kernels=", level, " is not a kernel level this CPU can run (",
                     tandem::kernels::cpu::KernelIsaNames(), ")")));
  }
  const std::string& command = subcommand->name;
  if (command == "generate") return Generate();
  if (command == "tokenize") return Tokenize();
  if (command == "perplexity") return Perplexity();
  if (command == "calibrate") return Calibrate();
  if (command == "prune") return Prune();
  if (command == "eval") return tandem::cli::Eval();
  if (command == "reorder") return tandem::cli::Reorder();
  if (command == "tier") return tandem::cli::Tier();
  if (command == "pack") return tandem::cli::Pack();
  if (command == "quantize") return tandem::cli::Quantize();
  if (command == "models") return Models();
  if (command == "health") return Health();
  if (command == "bench serve") return tandem::cli::BenchServe();
  return Report(absl::UnimplementedError(absl::StrCat("tandem ", command, " has no handler")));
}
