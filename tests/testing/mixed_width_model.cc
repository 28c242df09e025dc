#include "tests/testing/mixed_width_model.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/subprocess.h"

namespace tandem::testing {

MixedWidthModel::~MixedWidthModel() {
  if (!pack.empty()) std::filesystem::remove(pack);
}

MixedWidthModel::MixedWidthModel(MixedWidthModel&& other) noexcept
    : model_dir(std::move(other.model_dir)),
      plan(std::move(other.plan)),
      pack(std::move(other.pack)) {
  other.pack.clear();
}

absl::StatusOr<MixedWidthModel> MakeMixedWidthModel(const std::string& work_dir,
                                                    const std::string& model,
                                                    const std::string& plan, int bits,
                                                    const std::string& tier_flags) {
  const std::string tandem = BinDir() + "/tandem";
  const std::string source = SourceDir() + "/models/" + model;
  const std::string stats = source + "/pruning/calibration-valid.json";
  MixedWidthModel out;
  const std::string reordered = work_dir + "/reordered";
  out.model_dir = bits == 0 ? reordered : absl::StrCat(work_dir, "/reordered-int", bits);
  out.plan = work_dir + "/tiered.json";
  const std::string pack = absl::StrCat(BinDir(), "/mixed_width_model.", getpid(), ".pack");
  const std::string log = work_dir + "/cli.log";
  std::vector<std::string> commands = {tandem + " reorder --model " + source + " --stats " + stats +
                                       " --out " + reordered};
  if (bits != 0) {
    commands.push_back(absl::StrCat(tandem, " quantize --model ", reordered, " --bits ", bits,
                                    " --out ", out.model_dir));
  }
  commands.push_back(tandem + " tier --plan " + source + "/pruning/" + plan + " --stats " + stats +
                     " --model " + out.model_dir + " " + tier_flags + " --out " + out.plan);
  commands.push_back(tandem + " pack --model " + out.model_dir + " --out " + pack);
  for (const std::string& command : commands) {
    if (std::system((command + " >> " + log + " 2>&1").c_str()) != 0) {
      std::ifstream in(log);
      std::stringstream text;
      text << in.rdbuf();
      std::filesystem::remove(pack);
      return absl::InternalError(absl::StrCat(command, " failed:\n", text.str()));
    }
  }
  out.pack = pack;
  return out;
}

}  // namespace tandem::testing
