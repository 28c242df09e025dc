#include "tools/cli/subcommands.h"

#include <algorithm>
#include <sstream>

#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem::cli {
namespace {

// Flags of the subcommands that talk to a gateway through the C++ SDK.
std::vector<SubcommandFlag> GatewayFlags() {
  return {{"endpoint", "The gateway's gRPC address, host:port."},
          {"tls_root_certs", ""},
          {"timeout_s", "Deadline of the call, in seconds."}};
}

std::vector<SubcommandFlag> Join(std::vector<SubcommandFlag> a,
                                 const std::vector<SubcommandFlag>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<Subcommand> MakeSubcommands() {
  std::vector<Subcommand> all;
  all.push_back(
      {"generate", "send a prompt to a gateway and print the completion, or generate in-process",
       "tandem generate --prompt TEXT [--endpoint HOST:PORT | --model DIR] [sampling flags]",
       "Through a gateway (--endpoint) by default; with --model, loads the model and generates\n"
       "in this process, no services needed.",
       Join({{"prompt", ""},
             {"max_tokens", "Tokens to generate at most."},
             {"temperature", ""},
             {"top_p", ""},
             {"top_k", ""},
             {"seed", "Sampling seed; -1 = random."},
             {"stream", ""},
             {"model",
              "Generate in this process from this model directory instead of through a "
              "gateway."},
             {"load_format", ""},
             {"routing", ""},
             {"kernels", ""}},
            GatewayFlags())});
  all.push_back(
      {"tokenize",
       "print the token ids a gateway, or a model directory's tokenizer, makes of a text",
       "tandem tokenize --text TEXT [--endpoint HOST:PORT | --model DIR [--messages JSON]]",
       "Through a gateway (--endpoint) by default. With --model, reads the model directory's\n"
       "tokenizer (tokenizer.json, else tokenizer.model) in this process; with --messages (an\n"
       "OpenAI messages list as JSON), renders them with the model's chat template first and\n"
       "prints the prompt on stderr. BOS is added as the tokenizer says, except to a chat prompt\n"
       "(its template writes it).",
       Join({{"text", "The text to tokenize."},
             {"model", "Tokenize in this process with this model directory's tokenizer."},
             {"messages", "With --model: a JSON list of chat messages to render and tokenize."}},
            GatewayFlags())});
  all.push_back({"models", "list the gateway's models", "tandem models [--endpoint HOST:PORT]", "",
                 GatewayFlags()});
  all.push_back({"health", "check the gateway's gRPC health",
                 "tandem health [--endpoint HOST:PORT]",
                 "Prints SERVING and exits 0 when the gateway is serving.", GatewayFlags()});
  all.push_back(
      {"serve",
       "colocated mode: the gateway's APIs on an engine in this process (tandem-serve)",
       "tandem serve --model DIR [tandem-serve flags]",
       "Runs tandem-serve from the same directory with the rest of the arguments; `tandem serve\n"
       "--help` is tandem-serve's own help.",
       {}});
  all.push_back(
      {"perplexity",
       "score a text file with a model, one document a line",
       "tandem perplexity --model DIR --text FILE [--plan PLAN [--overlay FILE]] [--out "
       "RESULT.json]",
       "Windows and scoring follow tools/train/data.py, so the number equals the trainer's.",
       {{"model", "The model directory to score with."},
        {"text", "The text file to score: each non-blank line is a document."},
        {"plan", "Mask the experts this pruning plan drops (conventional pruning)."},
        {"overlay", "With --plan: every token runs this decoder overlay's distilled tensors."},
        {"out",
         "Also write the result as JSON (perplexity, mean nll, tokens, and the summed "
         "log-probability of the scored tokens), at full precision."},
        {"load_format", ""},
        {"routing", ""},
        {"kv_dtype", ""},
        {"kernels", ""}}});
  all.push_back({"calibrate",
                 "per-expert routing statistics of a model over a text",
                 "tandem calibrate --model DIR --text FILE --out STATS",
                 "Frequency, routing mass, EAN, REAP, expert pairs and neuron importance, per\n"
                 "layer (format: common/moe/calibration.h); prune, reorder and tier read them.",
                 {{"model", "The model directory to calibrate."},
                  {"text", "The calibration text file, one document a line."},
                  {"out", "Where the statistics go (JSON)."},
                  {"load_format", ""},
                  {"routing", ""},
                  {"seed", "With --load_format dummy: the seed of the weights and routing."},
                  {"kernels", ""}}});
  all.push_back({"prune",
                 "a pruning plan from calibration statistics",
                 "tandem prune --stats STATS --criterion reap --keep M --out PLAN",
                 "Keeps M experts per layer by the criterion; the plan is proto JSON\n"
                 "(common/moe/pruning_plan.h), for tandem-decode --plan and tandem eval.",
                 {{"stats", "Calibration statistics (from tandem calibrate)."},
                  {"criterion", ""},
                  {"keep", ""},
                  {"out", "Where the plan goes (proto JSON)."}}});
  all.push_back(
      {"eval",
       "the full model against a pruning plan: full, conventional and handoff",
       "tandem eval --model DIR --plan PLAN [--overlay FILE] --text FILE --prompts FILE [--mode "
       "M,...]",
       "Continuation perplexity and accuracy on --text, greedy continuations of --prompts\n"
       "(lengths, budget hits, agreement with the full model); results in docs/pruning.md.",
       {{"model", "The full model's directory."},
        {"plan", "The pruning plan to evaluate."},
        {"overlay",
         "A decoder overlay of the plan (docs/distillation.md): the pruned phases run its "
         "distilled tensors (conventional: prompt and continuation; handoff: continuation)."},
        {"text", "The text file scored, one document a line."},
        {"prompts", ""},
        {"mode", ""},
        {"context", ""},
        {"near_tokens", ""},
        {"stop", ""},
        {"baselines", ""},
        {"max_tokens", "The budget continuations are judged by."},
        {"out", "Where the results go (JSON); empty = stdout only."},
        {"kernels", ""}}});
  all.push_back({"reorder",
                 "a checkpoint with every expert's neurons in importance order",
                 "tandem reorder --model DIR --stats STATS --out DIR2",
                 "For mixed width: a narrower expert is then a prefix of its neurons.",
                 {{"model", "The model directory to reorder."},
                  {"stats", "Calibration statistics holding neuron importance."},
                  {"out", "The directory the reordered checkpoint is written to."}}});
  all.push_back({"tier",
                 "add mixed-width tiers to a pruning plan",
                 "tandem tier --plan PLAN --stats STATS --model DIR --out PLAN2 [--hot_share S "
                 "--warm_share S | --max_accuracy_loss L --text CALIBRATION]",
                 "Each routed expert pair gets a tier, and a token's leading pair gives each of\n"
                 "its router ranks a width: by default Hot runs all whole, Warm narrows rank 1 to\n"
                 "--warm_width, Cold skips it (docs/mixed-width.md). With a budget the cut-offs\n"
                 "and widths are chosen by scoring candidates on --text.",
                 {{"plan", "The pruning plan to add tiers to."},
                  {"stats", "Calibration statistics holding the expert pairs."},
                  {"out", "Where the tiered plan goes (proto JSON)."},
                  {"hot_share", ""},
                  {"warm_share", ""},
                  {"warm_width", ""},
                  {"dominance", ""},
                  {"hot_widths", ""},
                  {"warm_widths", ""},
                  {"cold_widths", ""},
                  {"max_accuracy_loss", ""},
                  {"max_expert_bytes", ""},
                  {"heldout_text", ""},
                  {"context", "Prompt tokens of each scored window (with a budget)."},
                  {"model", "The reordered model directory."},
                  {"text",
                   "The text masking is measured on (--dominance masking), or candidates are "
                   "scored on (a budget): calibration text, not the held-out text."}}});
  all.push_back(
      {"pack",
       "a model's experts as an expert pack",
       "tandem pack --model DIR --out FILE",
       "For tandem-decode --expert_pack: experts streamed from a file into a bounded\n"
       "cache.",
       {{"model", "The model directory to pack."}, {"out", "The expert pack file to write."}}});
  all.push_back(
      {"quantize",
       "a checkpoint with int8 or int4 weights in groups",
       "tandem quantize --model DIR --bits 8|4 --out DIR2 [--group_size G] [--modules M,...]\n"
       "                [--lm_head_bits 8|4]",
       "Each chosen matrix as integer levels with a float16 scale per --group_size input\n"
       "columns per row (docs/quantization.md); every Tandem command and service loads DIR2.",
       {{"model", "The bf16 (or f16 / f32) model directory to quantize."},
        {"bits", ""},
        {"group_size", ""},
        {"modules", ""},
        {"lm_head_bits", ""},
        {"out", "The directory the quantized checkpoint is written to."}}});
  all.push_back(
      {"bench serve",
       "the serving benchmark: TTFT, TPOT, ITL and E2EL against a gateway",
       "tandem bench serve --endpoint HOST:PORT [--backend grpc|http] [--num_prompts N]\n"
       "                          [--request_rate R] [--max_concurrency C] [--out FILE]",
       "Sends --num_prompts requests at --request_rate (Poisson arrivals, or all at once), at\n"
       "most --max_concurrency in flight, and reports as vLLM's benchmark_serving does.",
       {{"endpoint", "The gateway's gRPC address (--backend http: its HTTP address)."},
        {"backend", ""},
        {"dataset", ""},
        {"dataset_path", ""},
        {"input_len", ""},
        {"prefix_len", ""},
        {"turns", ""},
        {"output_len", ""},
        {"logprobs", ""},
        {"num_prompts", ""},
        {"request_rate", ""},
        {"max_concurrency", ""},
        {"goodput", ""},
        {"label", ""},
        {"vocab_size", ""},
        {"model", "Where the vocabulary size of random prompts is read (config.json)."},
        {"model_name", ""},
        {"seed", "The seed of the arrival times and the random prompts; -1 = 0."},
        {"timeout_s", "Deadline of each request, in seconds."},
        {"out", "Where the result goes (JSON, vLLM's shape)."}}});
  return all;
}

// The subcommands that take `flag`, by name.
std::vector<std::string> Owners(const std::string& flag) {
  std::vector<std::string> owners;
  for (const Subcommand& s : Subcommands()) {
    for (const SubcommandFlag& f : s.flags) {
      if (f.name == flag) owners.push_back(s.name);
    }
  }
  return owners;
}

}  // namespace

const std::vector<Subcommand>& Subcommands() {
  static const std::vector<Subcommand>* const all = new std::vector<Subcommand>(MakeSubcommands());
  return *all;
}

const Subcommand* FindSubcommand(const std::vector<std::string>& words) {
  if (words.empty()) return nullptr;
  const std::string two = words.size() >= 2 ? absl::StrCat(words[0], " ", words[1]) : "";
  for (const Subcommand& s : Subcommands()) {
    if (s.name == words[0] || s.name == two) return &s;
  }
  return nullptr;
}

std::string OverviewText() {
  size_t width = 0;
  for (const Subcommand& s : Subcommands()) width = std::max(width, s.name.size());
  std::ostringstream out;
  out << "Tandem's command-line client: talks to a gateway, or runs a model in this process.\n\n"
      << "usage: tandem <command> [flags]\n\ncommands:\n";
  for (const Subcommand& s : Subcommands()) {
    out << "  " << s.name << std::string(width - s.name.size() + 2, ' ') << s.summary << "\n";
  }
  out << "\n`tandem <command> --help` (or `tandem help <command>`) shows a command's flags.\n"
      << "Flags can also come from --config FILE (JSON or flat YAML); the command line wins.\n";
  return out.str();
}

std::string SubcommandHelp(const Subcommand& subcommand) {
  std::ostringstream out;
  out << "tandem " << subcommand.name << ": " << subcommand.summary
      << "\n\nusage: " << subcommand.usage << "\n";
  if (!subcommand.details.empty()) out << "\n" << subcommand.details << "\n";
  std::vector<SubcommandFlag> flags = subcommand.flags;
  std::sort(flags.begin(), flags.end(),
            [](const SubcommandFlag& a, const SubcommandFlag& b) { return a.name < b.name; });
  flags.push_back({"config", "A file of flag values (JSON or flat YAML); the command line wins."});
  flags.push_back({"help", "Print this text and exit."});
  out << "\nflags:\n";
  for (const SubcommandFlag& f : flags) {
    std::string help = f.help;
    out << "  --" << f.name;
    if (const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(f.name);
        flag != nullptr && f.name != "config") {
      if (help.empty()) {
        // Shared flags' own help names their subcommand first ("bench serve: ..."): drop it.
        help = std::string(absl::StripPrefix(flag->Help(), absl::StrCat(subcommand.name, ": ")));
      }
      out << " (default: \"" << flag->DefaultValue() << "\")";
    }
    out << "\n";
    // The help, wrapped at 100 columns under the flag.
    std::string line = "     ";
    for (absl::string_view word : absl::StrSplit(help, ' ', absl::SkipEmpty())) {
      if (line.size() + 1 + word.size() > 100 && line.size() > 5) {
        out << line << "\n";
        line = "     ";
      }
      absl::StrAppend(&line, " ", word);
    }
    if (line.size() > 5) out << line << "\n";
  }
  return out.str();
}

absl::Status CheckFlags(const Subcommand& subcommand,
                        const std::vector<config::CommandLine::Flag>& flags) {
  for (const config::CommandLine::Flag& flag : flags) {
    const std::string& name = flag.name;
    if (name == "config") continue;
    const bool own = std::any_of(subcommand.flags.begin(), subcommand.flags.end(),
                                 [&](const SubcommandFlag& f) { return f.name == name; });
    if (own) continue;
    const std::vector<std::string> owners = Owners(name);
    std::string whose = owners.empty()
                            ? std::string("no tandem command takes it")
                            : absl::StrCat("it is a flag of tandem ", absl::StrJoin(owners, ", "));
    return absl::InvalidArgumentError(absl::StrCat("tandem ", subcommand.name, " takes no --", name,
                                                   " (", whose, "); see tandem ", subcommand.name,
                                                   " --help"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::cli
