// `tandem`'s subcommands: what each is for, how it is called and which flags it takes. The CLI
// defines all its flags in one flag namespace (several subcommands share --model, --out...);
// this table says which belong to which, so `tandem SUB --help` shows that subcommand's flags
// only and a flag of another subcommand is an error that says whose it is.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config/config.h"

namespace tandem::cli {

struct SubcommandFlag {
  std::string name;
  // What the flag means for this subcommand, when the flag's own help text (written for all
  // the subcommands that share it) says more than that; empty: the flag's help.
  std::string help;
};

struct Subcommand {
  std::string name;     // "generate", "bench serve"
  std::string summary;  // one line for `tandem help`
  std::string usage;    // "tandem generate --prompt TEXT [--endpoint HOST:PORT | --model DIR]"
  std::string details;  // more lines for `tandem SUB --help`; may be empty
  std::vector<SubcommandFlag> flags;
};

// Every subcommand, in the order `tandem help` lists them.
const std::vector<Subcommand>& Subcommands();

// The subcommand named by the leading words ("bench serve" takes two); null if none.
const Subcommand* FindSubcommand(const std::vector<std::string>& words);

// `tandem help`: the subcommands, one line each.
std::string OverviewText();

// `tandem SUB --help`: purpose, usage, and the subcommand's flags with their defaults.
std::string SubcommandHelp(const Subcommand& subcommand);

// OK if every flag in `flags` is one of `subcommand`'s (or --config, which every one takes);
// else INVALID_ARGUMENT naming the first stray flag and the subcommands it belongs to.
absl::Status CheckFlags(const Subcommand& subcommand,
                        const std::vector<config::CommandLine::Flag>& flags);

}  // namespace tandem::cli
