// Structured outputs on real engines: every case of tests/structured/suite.json (JSON Schemas
// covering each supported keyword, nested and recursive ones; regexes; choices; JSON object
// mode) is generated greedily and sampled, on a random-weight model and on the shipped models
// (one of them with a pruned, half-width decoder), and every output is checked by an
// independent validator, Python's jsonschema (tests/structured/validate.py). Then the cases of
// unsupported.json are refused, each naming its keyword.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/engine/generator.h"
#include "common/engine/kv_cache.h"
#include "common/engine/scheduler.h"
#include "common/moe/pruning_plan.h"
#include "common/moe/width_baselines.h"
#include "common/structured/json_schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

using json = nlohmann::ordered_json;

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

structured::OutputConstraint ConstraintOf(const json& c) {
  using Kind = structured::OutputConstraint::Kind;
  const std::string kind = c["kind"];
  if (kind == "json_schema") return {Kind::kJsonSchema, c["schema"].dump(), {}};
  if (kind == "regex") return {Kind::kRegex, c["pattern"].get<std::string>(), {}};
  if (kind == "choice") return {Kind::kChoice, "", c["choices"].get<std::vector<std::string>>()};
  return {Kind::kJsonObject, "", {}};
}

struct Engine {
  std::string name;
  engine::LoadedModel model;
  std::unique_ptr<engine::KvBlockPool> pool;
  std::unique_ptr<engine::ForwardPass> forward;
  // A pruned decoder's controls, when it has one.
  std::unique_ptr<engine::ExpertMask> mask;
  std::unique_ptr<moe::UniformWidthPolicy> widths;
  engine::MoeOptions decode;
};

std::unique_ptr<Engine> Load(const std::string& name, const std::string& dir,
                             const engine::LoadOptions& options, const std::string& plan) {
  auto e = std::make_unique<Engine>();
  e->name = name;
  auto model_dir = testing::OpenModelDir(dir);
  auto loaded = engine::LoadModelDir(*model_dir, options);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return nullptr;
  e->model = *std::move(loaded);
  const model::ModelConfig& c = e->model.weights->config;
  engine::KvCacheConfig kv{static_cast<int>(c.num_hidden_layers),
                           static_cast<int>(c.num_key_value_heads), static_cast<int>(c.head_dim),
                           16, 4096};
  e->pool = *engine::KvBlockPool::Create(kv);
  e->forward = *engine::ForwardPass::Create(e->model.weights.get(), e->pool.get());
  EXPECT_TRUE(engine::ApplyRouting(options, e->forward.get()).ok());
  if (!plan.empty()) {
    auto mask = moe::LoadPlanMask(dir + "/pruning/" + plan, *model_dir);
    EXPECT_TRUE(mask.ok()) << mask.status();
    if (!mask.ok()) return nullptr;
    e->mask = std::make_unique<engine::ExpertMask>(*std::move(mask));
    const int intermediate = static_cast<int>(c.intermediate_size);
    e->widths = std::make_unique<moe::UniformWidthPolicy>(intermediate / 2, intermediate);
    e->decode = {.mask = e->mask.get(), .widths = e->widths.get()};
  }
  return e;
}

// Generates every case of the suite on `e`, greedy and sampled, appending JSON lines to `out`.
void Generate(Engine* e, const json& suite, std::ofstream* out, int* generated) {
  auto scheduler = engine::Scheduler::Create(
      e->forward.get(), e->model.tokenizer.get(), e->model.tokenizer->eos_id(),
      {.max_running = 64, .max_step_tokens = 512, .decode = e->decode});
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  const model::Tokenizer& tok = *e->model.tokenizer;
  struct Pending {
    std::string name, mode, text;
  };
  absl::flat_hash_map<engine::SequenceId, Pending> running;
  uint64_t seed = 1;
  for (const json& c : suite) {
    for (const char* mode : {"greedy", "sampled"}) {
      const std::string prompt =
          absl::StrCat("Answer in the form asked for. Case ", c["name"].get<std::string>(), ":");
      std::vector<int32_t> ids;
      if (tok.add_bos()) ids.push_back(tok.bos_id());
      auto text = tok.Encode(prompt);
      ASSERT_TRUE(text.ok());
      ids.insert(ids.end(), text->begin(), text->end());
      engine::SequenceRequest r;
      r.prompt_ids = std::move(ids);
      r.params.max_tokens = 200;
      r.params.temperature = std::string(mode) == "greedy" ? 0.0f : 1.0f;
      r.params.seed = seed++;
      r.params.constraint = ConstraintOf(c);
      auto id = (*scheduler)->Add(std::move(r));
      ASSERT_TRUE(id.ok()) << c["name"] << ": " << id.status();
      running[*id] = {c["name"].get<std::string>(), mode, ""};
    }
  }
  std::vector<engine::SequenceOutput> outputs;
  while (!(*scheduler)->idle()) {
    outputs.clear();
    ASSERT_TRUE((*scheduler)->Step(&outputs).ok());
    for (engine::SequenceOutput& o : outputs) {
      Pending& p = running[o.id];
      ASSERT_TRUE(o.status.ok()) << e->name << " " << p.name << " " << p.mode << ": " << o.status;
      p.text += o.text;
      if (o.finish == engine::FinishReason::kNone) continue;
      json line = json::object();
      line["name"] = p.name;
      line["mode"] = p.mode;
      line["model"] = e->name;
      line["text"] = p.text;
      line["finish"] = o.finish == engine::FinishReason::kStop ? "stop" : "length";
      *out << line.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
      ++*generated;
      running.erase(o.id);
    }
  }
  EXPECT_TRUE(running.empty());
  EXPECT_EQ(e->pool->num_free(), e->pool->config().num_blocks);
}

TEST(StructuredSuiteTest, EveryOutputValidatesWithAnIndependentValidator) {
  const std::string root = testing::SourceDir();
  const std::string suite_path = root + "/tests/structured/suite.json";
  const json suite = ReadJson(suite_path);
  ASSERT_GE(suite.size(), 120u);
  const std::string out_path =
      (std::filesystem::temp_directory_path() / absl::StrCat("structured-", getpid(), ".jsonl"))
          .string();
  std::ofstream out(out_path);
  int generated = 0;
  const std::string tiny = root + "/models/tiny-moe", fg = root + "/models/tiny-fg-moe";
  // A random-weight model (tiny-moe's shape and tokenizer), the shipped ones, and tiny-fg-moe
  // decoding pruned (REAP keep-32 of 64) with every expert at half width.
  std::vector<std::unique_ptr<Engine>> engines;
  engines.push_back(Load(
      "random", tiny, {.format = engine::LoadFormat::kDummy, .seed = 7, .routing = "uniform"}, ""));
  engines.push_back(Load("tiny-moe", tiny, {}, ""));
  engines.push_back(Load("tiny-fg-moe-pruned-half-width", fg, {}, "reap-keep32.json"));
  for (auto& e : engines) {
    ASSERT_NE(e, nullptr);
    Generate(e.get(), suite, &out, &generated);
  }
  out.close();
  EXPECT_EQ(generated, static_cast<int>(suite.size() * 2 * engines.size()));
  const auto [output, status] =
      testing::RunCommand(absl::StrCat("/usr/bin/python3 ", root, "/tests/structured/validate.py ",
                                       suite_path, " ", out_path, " 2>&1"));
  EXPECT_EQ(status, 0) << "python3 with jsonschema (scripts/setup.sh installs python3-jsonschema) "
                          "found invalid outputs:\n"
                       << output;
  std::cout << output.substr(output.size() > 2000 ? output.size() - 2000 : 0);
  std::filesystem::remove(out_path);
}

TEST(StructuredSuiteTest, UnsupportedSchemasAreRefusedNamingTheKeyword) {
  const json cases = ReadJson(testing::SourceDir() + "/tests/structured/unsupported.json");
  ASSERT_GE(cases.size(), 20u);
  for (const json& c : cases) {
    absl::StatusOr<structured::Grammar> g = structured::CompileJsonSchema(c["schema"].dump());
    ASSERT_FALSE(g.ok()) << c["name"];
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << c["name"];
    EXPECT_THAT(std::string(g.status().message()),
                ::testing::HasSubstr(c["keyword"].get<std::string>()))
        << c["name"];
  }
}

}  // namespace
}  // namespace tandem
