#include "common/config/config.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/util/status.h"
#include "nlohmann/json.hpp"
#include "tandem/version.h"

ABSL_FLAG(std::string, config, "",
          "Config file (JSON, or flat YAML 'key: value' lines) whose keys are flag names; "
          "command-line flags override it.");

namespace tandem::config {
namespace {

absl::StatusOr<std::string> JsonScalarText(const nlohmann::json& value, absl::string_view key,
                                           absl::string_view source) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_boolean()) return std::string(value.get<bool>() ? "true" : "false");
  if (value.is_number_integer()) return std::to_string(value.get<long long>());
  if (value.is_number()) return value.dump();
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": value of '", key, "' must be a string, number or boolean"));
}

absl::StatusOr<std::map<std::string, std::string>> ParseJson(absl::string_view text,
                                                             absl::string_view source) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": top level must be an object"));
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : doc.items()) {
    if (value.is_array()) {
      std::vector<std::string> parts;
      for (const auto& item : value) {
        ASSIGN_OR_RETURN(std::string part, JsonScalarText(item, key, source));
        parts.push_back(std::move(part));
      }
      out[key] = absl::StrJoin(parts, ",");
    } else {
      ASSIGN_OR_RETURN(out[key], JsonScalarText(value, key, source));
    }
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::string>> ParseFlatYaml(absl::string_view text,
                                                                 absl::string_view source) {
  std::map<std::string, std::string> out;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    absl::string_view stripped = absl::StripAsciiWhitespace(line);
    if (stripped.empty() || stripped.front() == '#' || stripped == "---") continue;
    if (line.front() == ' ' || line.front() == '\t') {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", line_number, ": nested YAML is not supported (keys are flag names)"));
    }
    const size_t colon = stripped.find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_number, ": expected 'key: value'"));
    }
    std::string key(absl::StripAsciiWhitespace(stripped.substr(0, colon)));
    absl::string_view value = absl::StripAsciiWhitespace(stripped.substr(colon + 1));
    if (!value.empty() && (value.front() == '"' || value.front() == '\'')) {
      const char quote = value.front();
      const size_t end = value.find(quote, 1);
      if (end == absl::string_view::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ":", line_number, ": unterminated quote"));
      }
      value = value.substr(1, end - 1);
    } else if (const size_t hash = value.find(" #"); hash != absl::string_view::npos) {
      value = absl::StripAsciiWhitespace(value.substr(0, hash));
    }
    if (key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_number, ": empty key"));
    }
    if (out.count(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_number, ": key '", key, "' appears twice"));
    }
    out[key] = std::string(value);
  }
  return out;
}

bool IsProgramFlag(const absl::CommandLineFlag& flag, const ProgramInfo& program) {
  for (const std::string& source : program.flag_sources) {
    if (!source.empty() && absl::StrContains(flag.Filename(), source)) return true;
  }
  return false;
}

absl::Status SetFlag(absl::string_view name, absl::string_view value, absl::string_view source) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr || flag->IsRetired()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": unknown flag '", name, "'"));
  }
  std::string error;
  if (!flag->ParseFrom(value, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": bad value '", value, "' for '", name, "': ", error));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseConfigText(absl::string_view text,
                                                                   absl::string_view source) {
  absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(text);
  if (!trimmed.empty() && (trimmed.front() == '{' || trimmed.front() == '[')) {
    return ParseJson(text, source);
  }
  return ParseFlatYaml(text, source);
}

absl::Status ApplyFlagValues(const std::map<std::string, std::string>& values,
                             absl::string_view source) {
  for (const auto& [key, value] : values) {
    if (key == "config") {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": a config file cannot set 'config'"));
    }
    RETURN_IF_ERROR(SetFlag(key, value, source));
  }
  return absl::OkStatus();
}

absl::Status ApplyEnvironment(const ProgramInfo& program) {
  if (program.env_prefix.empty()) return absl::OkStatus();
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsProgramFlag(*flag, program)) continue;
    const std::string var = absl::StrCat(program.env_prefix, absl::AsciiStrToUpper(name));
    if (const char* value = std::getenv(var.c_str()); value != nullptr) {
      RETURN_IF_ERROR(SetFlag(name, value, absl::StrCat("environment ", var)));
    }
  }
  return absl::OkStatus();
}

std::string HelpText(const ProgramInfo& program) {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsProgramFlag(*flag, program) || name == "config") flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(), [](auto* a, auto* b) { return a->Name() < b->Name(); });
  std::ostringstream out;
  out << program.name << " " << kVersion << ": " << program.summary << "\n\n"
      << "Usage: " << program.name << " [--flag=value ...]\n\nFlags:\n";
  for (const auto* flag : flags) {
    out << "  --" << flag->Name() << "  " << flag->Help() << " (default: \"" << flag->DefaultValue()
        << "\")\n";
  }
  out << "  --help  Print this text and exit.\n  --version  Print the version and exit.\n";
  if (!program.env_prefix.empty()) {
    out << "\nEvery flag can also be set by the environment variable " << program.env_prefix
        << "<FLAG NAME IN UPPER CASE> (use it for secrets);\nprecedence: defaults < --config "
           "file < environment < command line.\n";
  }
  return out.str();
}

absl::StatusOr<CommandLine> SplitCommandLine(int argc, const char* const* argv,
                                             const ProgramInfo& program) {
  CommandLine line;
  line.positional = {argc > 0 ? argv[0] : program.name};
  bool only_positional = false;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (only_positional || !absl::StartsWith(arg, "-") || arg == "-") {
      line.positional.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    arg = absl::StripPrefix(absl::StripPrefix(arg, "-"), "-");
    if (arg == "help" || arg == "h") {
      line.help = true;
      continue;
    }
    if (arg == "version") {
      line.version = true;
      continue;
    }
    // Once --help or --version is asked for, nothing else is applied: what follows is not
    // held against the caller.
    const bool lenient = line.help || line.version;
    const size_t eq = arg.find('=');
    CommandLine::Flag parsed{std::string(arg.substr(0, eq)), ""};
    const bool has_value = eq != absl::string_view::npos;
    if (has_value) parsed.value = std::string(arg.substr(eq + 1));
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(parsed.name);
    if (flag == nullptr && !has_value && absl::StartsWith(parsed.name, "no")) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(parsed.name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        line.flags.push_back({parsed.name.substr(2), "false"});
        continue;
      }
    }
    if (flag == nullptr || flag->IsRetired()) {
      if (lenient) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", parsed.name, " (see ", program.name, " --help)"));
    }
    if (!has_value) {
      if (flag->IsOfType<bool>()) {
        parsed.value = "true";
      } else if (i + 1 < argc) {
        parsed.value = argv[++i];
      } else {
        if (lenient) continue;
        return absl::InvalidArgumentError(absl::StrCat("flag --", parsed.name, " needs a value"));
      }
    }
    line.flags.push_back(std::move(parsed));
  }
  return line;
}

absl::Status ApplyCommandLine(const CommandLine& line, const ProgramInfo& program) {
  const std::vector<CommandLine::Flag>& command_line = line.flags;
  std::string config_path;
  for (const auto& flag : command_line) {
    if (flag.name == "config") config_path = flag.value;
  }
  if (!config_path.empty()) {
    std::ifstream in(config_path);
    if (!in) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read config file ", config_path));
    }
    std::stringstream text;
    text << in.rdbuf();
    ASSIGN_OR_RETURN(auto values, ParseConfigText(text.str(), config_path));
    RETURN_IF_ERROR(ApplyFlagValues(values, config_path));
  }
  RETURN_IF_ERROR(ApplyEnvironment(program));
  for (const auto& flag : command_line) {
    RETURN_IF_ERROR(SetFlag(flag.name, flag.value, "command line"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ParseFlags(int argc, char** argv,
                                                    const ProgramInfo& program) {
  ASSIGN_OR_RETURN(CommandLine line, SplitCommandLine(argc, argv, program));
  if (line.help) {
    std::cout << HelpText(program);
    std::exit(0);
  }
  if (line.version) {
    std::cout << program.name << " " << kVersion << "\n";
    std::exit(0);
  }
  RETURN_IF_ERROR(ApplyCommandLine(line, program));
  return line.positional;
}

}  // namespace tandem::config
