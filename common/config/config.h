// Service configuration. Every service is configured on its own, by its flags (declared in
// its main.cc with ABSL_FLAG), optionally by a config file whose keys are the flag names, and
// by environment variables for secrets. Precedence, lowest first:
//   flag defaults < config file (--config=FILE, JSON or flat YAML) < environment
//   (<env_prefix><FLAG_NAME upper-cased>, e.g. TANDEM_GATEWAY_API_KEY) < command line.
// Unknown keys and bad values are errors that name the key and the source.
#pragma once

#include <map>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::config {

struct ProgramInfo {
  std::string name;        // e.g. "tandem-decode"
  std::string summary;     // one line for --help
  std::string env_prefix;  // e.g. "TANDEM_DECODE_"; empty disables environment lookup
  // Flags defined in source files whose path contains one of these are this program's:
  // listed by --help and settable from the environment (e.g. "services/decode/").
  std::vector<std::string> flag_sources;
};

// Parses a config file's text into flag name -> value text. JSON objects (values: strings,
// numbers, booleans, arrays of those joined with ',') and flat YAML ("key: value" lines,
// '#' comments, optional quotes) are accepted; nested objects are an error.
absl::StatusOr<std::map<std::string, std::string>> ParseConfigText(absl::string_view text,
                                                                   absl::string_view source);

// Sets each flag in `values` from its text; the first unknown key or bad value is an
// INVALID_ARGUMENT naming it and `source`.
absl::Status ApplyFlagValues(const std::map<std::string, std::string>& values,
                             absl::string_view source);

// Sets flags from environment variables named env_prefix + upper-cased flag name, for the
// flags whose definition matches `flag_sources`.
absl::Status ApplyEnvironment(const ProgramInfo& program);

// A command line as the flag parser reads it: positional words, then the flags in order
// (`--flag value` and `--flag=value` alike, `--noflag` as flag=false, a bare bool as true).
struct CommandLine {
  struct Flag {
    std::string name;
    std::string value;
  };
  std::vector<std::string> positional;  // argv[0] first
  std::vector<Flag> flags;
  bool help = false;     // --help or -h
  bool version = false;  // --version
};

// Splits argv; INVALID_ARGUMENT for an unknown flag or one without its value (ignored once
// --help or --version came before). Sets nothing.
absl::StatusOr<CommandLine> SplitCommandLine(int argc, const char* const* argv,
                                             const ProgramInfo& program);

// Reads --config, applies the environment, then `line`'s flags (which win).
absl::Status ApplyCommandLine(const CommandLine& line, const ProgramInfo& program);

// The whole start-up sequence: handles --help and --version (prints, exits 0), reads
// --config, applies the environment, then parses the command line (which wins). Returns the
// positional arguments (argv[0] first) or an error to print before exiting with status 2.
absl::StatusOr<std::vector<std::string>> ParseFlags(int argc, char** argv,
                                                    const ProgramInfo& program);

// The --help text: the summary and every flag of program.flag_sources, with defaults.
std::string HelpText(const ProgramInfo& program);

}  // namespace tandem::config
