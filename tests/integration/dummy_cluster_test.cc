// The benchmark-only path of the services: random weights at a config's shape
// (--load_format dummy) with a stated routing, so the big shapes can be served without a
// checkpoint. Refused unless asked for in full; a dummy cluster (full prefill, pruned decode)
// answers, every instance running the same model from the same --seed, exactly as colocated
// tandem-serve does; and with --memory_bytes the pruned decoder turns the expert memory it does
// not hold into KV blocks. The hybrid and latent-attention layouts run here too, at small shapes
// with the tiny model's tokenizer: their handoffs carry recurrent state, or only the latent.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tandem/client.h"
#include "tests/testing/cluster_client.h"
#include "tests/testing/hybrid_model.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kTokens = 12;
constexpr int64_t kMemoryBytes = int64_t{64} << 20;  // the tiny model's weights are ~50 MB

// The tiny model's directory without its checkpoint: config, tokenizer, generation defaults.
class DummyClusterTest : public ::testing::Test {
 public:
  void SetUp() override {
    const fs::path tiny = testing::SourceDir() + "/models/tiny-moe";
    for (const char* file :
         {"config.json", "tokenizer.model", "tokenizer_config.json", "generation_config.json"}) {
      fs::create_symlink(tiny / file, fs::path(dir_.path()) / file);
    }
    plan_ = "--plan=" + (tiny / "pruning/reap-keep4.json").string();
  }

  static std::vector<std::string> Dummy(std::vector<std::string> flags) {
    for (const char* flag : {"--load_format=dummy", "--routing=zipf:1", "--seed=7"}) {
      flags.push_back(flag);
    }
    return flags;
  }

  // Greedy continuations of the golden prompts, EOS ignored (random weights may pick it).
  static std::vector<std::vector<int32_t>> Generate(const testing::Ports& ports) {
    auto client = testing::ConnectClient(ports);
    if (client == nullptr) return {};
    return testing::GreedyContinuations(client.get(), testing::LoadGoldenManifest(), kTokens,
                                        /*ignore_eos=*/true);
  }

  // Why `binary` with `flags` did not start (its log), or "" when it started.
  std::string Refusal(const std::string& model_dir, const std::string& binary,
                      const std::vector<std::string>& flags) {
    testing::ServiceSet set(model_dir);
    auto started = set.Start(binary, flags);
    return started.ok() ? "" : std::string(started.status().message());
  }

  testing::TempDir dir_;
  std::string plan_;
};

TEST_F(DummyClusterTest, RandomWeightsAreRefusedUnlessAskedForInFull) {
  const std::string tiny = testing::SourceDir() + "/models/tiny-moe";
  for (const char* binary : {"tandem-prefill", "tandem-decode", "tandem-serve"}) {
    SCOPED_TRACE(binary);
    // No checkpoint and no dummy flag: the missing weights, not random ones.
    EXPECT_THAT(Refusal(dir_.path(), binary, {}), HasSubstr("model.safetensors"));
    EXPECT_THAT(Refusal(dir_.path(), binary, {"--load_format=dummy"}), HasSubstr("--routing"));
    // A synthetic routing would replace a trained router.
    EXPECT_THAT(Refusal(tiny, binary, {"--routing=zipf:1"}), HasSubstr("--load_format dummy"));
    EXPECT_THAT(Refusal(dir_.path(), binary, {"--load_format=dummy", "--routing=zipf"}),
                HasSubstr("zipf:S"));
  }
  EXPECT_THAT(
      Refusal(dir_.path(), "tandem-decode",
              Dummy({"--overlay=" + tiny + "/distill/reap-keep4-handoff.safetensors", plan_})),
      HasSubstr("not dummy weights"));
  EXPECT_THAT(Refusal(dir_.path(), "tandem-decode", Dummy({"--memory_bytes=1000000"})),
              HasSubstr("not one KV block fits"));
}

TEST_F(DummyClusterTest, ADummyClusterAnswersAsColocatedServingAndPruningBuysKvBlocks) {
  testing::ServiceSet set(dir_.path());
  const std::string memory = absl::StrCat("--memory_bytes=", kMemoryBytes);
  auto cluster = set.StartCluster(Dummy({}), Dummy({plan_, memory}));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<std::vector<int32_t>> disaggregated = Generate(cluster->gateway);

  testing::ServiceSet colocated_set(dir_.path());
  auto serve = colocated_set.Start("tandem-serve", Dummy({plan_}));
  ASSERT_TRUE(serve.ok()) << serve.status();
  testing::ExpectSameContinuations(disaggregated, Generate(*serve), kTokens);

  // The same memory for a decoder holding every expert: fewer blocks.
  testing::ServiceSet full_set(dir_.path());
  auto full = full_set.Start("tandem-decode", Dummy({memory}));
  ASSERT_TRUE(full.ok()) << full.status();
  const double pruned_blocks =
      testing::MetricValue(cluster->decode.http_port, "tandem_kv_blocks", "free");
  const double full_blocks = testing::MetricValue(full->http_port, "tandem_kv_blocks", "free");
  EXPECT_GT(full_blocks, 0);
  EXPECT_GT(pruned_blocks, 1.5 * full_blocks);
  for (int port : {cluster->decode.http_port, full->http_port}) {
    const double kv = testing::MetricValue(port, "tandem_kv_cache_bytes");
    EXPECT_GT(kv, 0);
    EXPECT_LE(kv, static_cast<double>(kMemoryBytes));
  }
}

// A hybrid model (Qwen3.5-MoE's layout: three Gated DeltaNet layers, then gated attention) at
// a small shape with the tiny model's tokenizer: the handoff carries each sequence's recurrent
// state after its blocks, so the disaggregated cluster answers as colocated serving does (the
// prefix cache, which keeps no state yet, is off for it, as vLLM turns it off for hybrids).
TEST_F(DummyClusterTest, AHybridModelsStateTravelsWithItsKv) {
  testing::TempDir hybrid;
  testing::WriteDummyHybridModel(hybrid.path());
  testing::ServiceSet set(hybrid.path());
  auto cluster = set.StartCluster(Dummy({}), Dummy({}));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<std::vector<int32_t>> disaggregated = Generate(cluster->gateway);
  testing::ServiceSet colocated_set(hybrid.path());
  auto serve = colocated_set.Start("tandem-serve", Dummy({}));
  ASSERT_TRUE(serve.ok()) << serve.status();
  testing::ExpectSameContinuations(disaggregated, Generate(*serve), kTokens);
}

// A model of `config_json` (8 experts, 3 sparse-capable layers, the tiny model's vocabulary)
// with the tiny model's tokenizer: a full cluster, and a full prefill feeding a decoder that keeps
// half the experts, each answer as colocated serving does, again when prefill resumes the
// prompts from its prefix cache.
// A model directory of `config_json` with the tiny model's tokenizer.
void WriteDummyModel(const std::string& dir, const std::string& config_json) {
  const fs::path tiny = testing::SourceDir() + "/models/tiny-moe";
  for (const char* file : {"tokenizer.model", "tokenizer_config.json", "generation_config.json"}) {
    fs::create_symlink(tiny / file, fs::path(dir) / file);
  }
  std::ofstream(fs::path(dir) / "config.json") << config_json;
}

void ExpectClustersAnswerAsColocatedServing(const std::string& config_json) {
  testing::TempDir model;
  WriteDummyModel(model.path(), config_json);
  nlohmann::json plan = {{"model", "dummy"}, {"numLayers", 3}, {"numExperts", 8}};
  for (int l = 0; l < 3; ++l) {
    plan["layers"].push_back({{"layer", l}, {"retainedExperts", {0, 2, 3, 5}}});
  }
  const std::string plan_path = model.path() + "/keep4.json";
  std::ofstream(plan_path) << plan.dump();
  for (const bool pruned : {false, true}) {
    SCOPED_TRACE(pruned ? "pruned decoder" : "full decoder");
    const std::vector<std::string> decode = DummyClusterTest::Dummy(
        pruned ? std::vector<std::string>{"--plan=" + plan_path} : std::vector<std::string>{});
    testing::ServiceSet set(model.path());
    auto cluster = set.StartCluster(DummyClusterTest::Dummy({}), decode);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    const std::vector<std::vector<int32_t>> disaggregated =
        DummyClusterTest::Generate(cluster->gateway);
    ASSERT_FALSE(disaggregated.empty());
    // The prompts again: prefill resumes them from its prefix cache's blocks.
    EXPECT_EQ(DummyClusterTest::Generate(cluster->gateway), disaggregated);
    EXPECT_GT(
        testing::MetricValue(cluster->prefill.http_port, "tandem_prefix_cache_hit_tokens_total"),
        0);
    testing::ServiceSet colocated_set(model.path());
    auto serve = colocated_set.Start("tandem-serve", decode);
    ASSERT_TRUE(serve.ok()) << serve.status();
    testing::ExpectSameContinuations(disaggregated, DummyClusterTest::Generate(*serve), kTokens);
  }
}

// DeepSeek-V3's layout at a small shape (latent attention with the query's low-rank step and
// YaRN, sigmoid routing within groups, a dense first layer and a shared expert): the KV blocks
// the handoff carries are the latent and the rotary key alone (one pool a layer).
TEST_F(DummyClusterTest, ALatentAttentionModelsHandoffIsItsLatent) {
  ExpectClustersAnswerAsColocatedServing(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 8192, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
    "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
    "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2,
    "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 128,
                     "mscale": 1.0, "mscale_all_dim": 1.0}})");
}

// gpt-oss's layout at a small shape: attention sinks, biases on q, k, v and o, a window of 8 on
// the even layers and YaRN with its attention factor, experts with biases and the clamped SwiGLU
// stored as MXFP4 (int8 in memory); the handoff carries every layer's K/V, windowed or not.
TEST_F(DummyClusterTest, AGptOssModelsWindowedLayersHandOffTheirKv) {
  ExpectClustersAnswerAsColocatedServing(R"({
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
    "vocab_size": 8192, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_local_experts": 8, "num_experts_per_tok": 4, "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2,
    "quantization_config": {"quant_method": "mxfp4"},
    "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 64, "truncate": false}})");
}

// Gemma 4's layout as published (text_config, model.language_model) at a small shape: sliding
// layers of 2 KV heads of 16 beside a global layer of 1 KV head of 64 whose values are its keys'
// projection, proportional RoPE, a dense GeGLU MLP beside the MoE in every layer, soft-capped
// logits: the sliding layers keep rings of their own shape in the state slot, which the handoff
// carries with the global layer's paged blocks. A memory budget the state slots do not fit in is
// refused naming them.
TEST_F(DummyClusterTest, AGemma4ModelsRingsOfTheirOwnShapeHandOff) {
  constexpr char kGemma4[] = R"({
    "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
    "tie_word_embeddings": true,
    "text_config": {
      "model_type": "gemma4_text", "vocab_size": 8192, "hidden_size": 64,
      "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 8,
      "top_k_experts": 2, "enable_moe_block": true, "num_hidden_layers": 3,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "global_head_dim": 64, "num_global_key_value_heads": 1, "attention_k_eq_v": true,
      "sliding_window": 8, "hidden_size_per_layer_input": 0,
      "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
      "final_logit_softcapping": 30.0, "max_position_embeddings": 512, "bos_token_id": 1,
      "eos_token_id": 2}})";
  ExpectClustersAnswerAsColocatedServing(kGemma4);
  testing::TempDir model;
  WriteDummyModel(model.path(), kGemma4);
  EXPECT_THAT(Refusal(model.path(), "tandem-serve",
                      Dummy({"--memory_bytes=4000000", "--prefix_state_snapshots=100"})),
              AllOf(HasSubstr("not one KV block fits"), HasSubstr("--prefix_state_snapshots")));
}

}  // namespace
}  // namespace tandem
