#include "common/config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"

ABSL_FLAG(int, cfg_test_port, 8000, "A port.");
ABSL_FLAG(std::string, cfg_test_name, "default", "A name.");
ABSL_FLAG(bool, cfg_test_verbose, false, "A switch.");
ABSL_FLAG(double, cfg_test_ratio, 0.5, "A ratio.");
ABSL_FLAG(std::vector<std::string>, cfg_test_peers, {}, "A list.");
ABSL_FLAG(std::string, cfg_test_secret, "", "A secret.");

namespace tandem::config {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const ProgramInfo kProgram{
    "cfg-test", "a test program", "CFGTEST_", {"tests/common/config/config_test.cc"}};

class ConfigTest : public ::testing::Test {
 protected:
  absl::FlagSaver saver_;  // every test starts from the defaults
  std::filesystem::path dir_ =
      std::filesystem::temp_directory_path() / ("tandem_config_test_" + std::to_string(::getpid()));
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    unsetenv("CFGTEST_CFG_TEST_SECRET");
    unsetenv("CFGTEST_CFG_TEST_PORT");
  }
  std::string Write(const std::string& name, const std::string& text) {
    const auto path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  absl::StatusOr<std::vector<std::string>> Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "cfg-test");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return ParseFlags(static_cast<int>(argv.size()), argv.data(), kProgram);
  }
};

TEST_F(ConfigTest, JsonConfigFileSetsFlags) {
  const std::string path = Write("c.json", R"({"cfg_test_port": 9000, "cfg_test_name": "x",
      "cfg_test_verbose": true, "cfg_test_ratio": 0.25, "cfg_test_peers": ["a:1", "b:2"]})");
  auto args = Parse({"--config=" + path});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_test_port), 9000);
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_test_name), "x");
  EXPECT_TRUE(absl::GetFlag(FLAGS_cfg_test_verbose));
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_test_ratio), 0.25);
  EXPECT_THAT(absl::GetFlag(FLAGS_cfg_test_peers), ElementsAre("a:1", "b:2"));
}

TEST_F(ConfigTest, YamlConfigFileSetsFlags) {
  const std::string path = Write("c.yaml",
                                 "# comment\n---\ncfg_test_port: 9100  # inline\n"
                                 "cfg_test_name: \"quoted # not a comment\"\n"
                                 "cfg_test_peers: a:1,b:2\n");
  ASSERT_TRUE(Parse({"--config", path}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_test_port), 9100);
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_test_name), "quoted # not a comment");
  EXPECT_THAT(absl::GetFlag(FLAGS_cfg_test_peers), ElementsAre("a:1", "b:2"));
}

TEST_F(ConfigTest, PrecedenceDefaultsFileEnvironmentCommandLine) {
  const std::string path = Write("c.json", R"({"cfg_test_port": 9000, "cfg_test_name": "file"})");
  setenv("CFGTEST_CFG_TEST_PORT", "9200", 1);
  setenv("CFGTEST_CFG_TEST_SECRET", "s3cret", 1);
  auto args = Parse({"--config=" + path, "--cfg_test_name=cli", "positional"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_test_port), 9200);        // env beats file
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_test_name), "cli");       // command line beats file
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_test_secret), "s3cret");  // secrets from the environment
  EXPECT_THAT(*args, ElementsAre("cfg-test", "positional"));
  ASSERT_TRUE(Parse({"--cfg_test_port=1"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_cfg_test_port), 1);  // command line beats env
}

TEST_F(ConfigTest, BoolFlagForms) {
  ASSERT_TRUE(Parse({"--cfg_test_verbose"}).ok());
  EXPECT_TRUE(absl::GetFlag(FLAGS_cfg_test_verbose));
  ASSERT_TRUE(Parse({"--nocfg_test_verbose"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_cfg_test_verbose));
  ASSERT_TRUE(Parse({"-cfg_test_verbose=true"}).ok());
  EXPECT_TRUE(absl::GetFlag(FLAGS_cfg_test_verbose));
}

TEST_F(ConfigTest, UnknownKeyInFileIsAnErrorNamingKeyAndFile) {
  const std::string path = Write("c.json", R"({"cfg_test_prot": 9000})");
  auto args = Parse({"--config=" + path});
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(args.status().message(), HasSubstr("cfg_test_prot"));
  EXPECT_THAT(args.status().message(), HasSubstr("c.json"));
}

TEST_F(ConfigTest, BadValuesAreErrors) {
  auto a = Parse({"--config=" + Write("a.json", R"({"cfg_test_port": "eighty"})")});
  EXPECT_THAT(a.status().message(), HasSubstr("cfg_test_port"));
  auto b = Parse({"--config=" + Write("b.json", R"({"cfg_test_port": {"nested": 1}})")});
  EXPECT_THAT(b.status().message(), HasSubstr("must be a string, number or boolean"));
  auto c = Parse({"--config=" + Write("c.json", R"({"cfg_test_port": 1,)")});
  EXPECT_THAT(c.status().message(), HasSubstr("not valid JSON"));
  auto d = Parse({"--config=" + Write("d.json", R"([1, 2])")});
  EXPECT_THAT(d.status().message(), HasSubstr("top level must be an object"));
  auto e = Parse({"--config=" + Write("e.yaml", "cfg_test_port: 1\n  nested: 2\n")});
  EXPECT_THAT(e.status().message(), HasSubstr("nested YAML"));
  auto f = Parse({"--config=" + Write("f.yaml", "just words\n")});
  EXPECT_THAT(f.status().message(), HasSubstr("expected 'key: value'"));
  auto g = Parse({"--config=" + Write("g.yaml", "cfg_test_port: 1\ncfg_test_port: 2\n")});
  EXPECT_THAT(g.status().message(), HasSubstr("appears twice"));
  auto h = Parse({"--config=" + (dir_ / "missing.json").string()});
  EXPECT_THAT(h.status().message(), HasSubstr("cannot read config file"));
  auto i = Parse({"--config=" + Write("i.json", R"({"config": "other.json"})")});
  EXPECT_THAT(i.status().message(), HasSubstr("cannot set 'config'"));
}

TEST_F(ConfigTest, BadCommandLineAndEnvironmentAreErrors) {
  EXPECT_THAT(Parse({"--cfg_test_nope=1"}).status().message(), HasSubstr("unknown flag"));
  EXPECT_THAT(Parse({"--cfg_test_port=abc"}).status().message(), HasSubstr("cfg_test_port"));
  EXPECT_THAT(Parse({"--cfg_test_port"}).status().message(), HasSubstr("needs a value"));
  setenv("CFGTEST_CFG_TEST_PORT", "not-a-number", 1);
  EXPECT_THAT(Parse({}).status().message(), HasSubstr("CFGTEST_CFG_TEST_PORT"));
}

TEST_F(ConfigTest, HelpListsTheProgramsFlagsWithDefaults) {
  const std::string help = HelpText(kProgram);
  EXPECT_THAT(help, HasSubstr("cfg-test"));
  EXPECT_THAT(help, HasSubstr("--cfg_test_port  A port. (default: \"8000\")"));
  EXPECT_THAT(help, HasSubstr("--config"));
  EXPECT_THAT(help, HasSubstr("CFGTEST_"));
}

TEST(ParseConfigTextTest, JsonNumbersAndBooleansBecomeFlagText) {
  auto values = ParseConfigText(R"({"a": 1, "b": 2.5, "c": false, "d": "s"})", "t");
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(values->at("a"), "1");
  EXPECT_EQ(values->at("b"), "2.5");
  EXPECT_EQ(values->at("c"), "false");
  EXPECT_EQ(values->at("d"), "s");
}

}  // namespace
}  // namespace tandem::config
