#include "common/model/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"

#include "nlohmann/json.hpp"

namespace tandem::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// Mixtral-8x7B-v0.1's config.json, verbatim.
constexpr char kMixtral8x7B[] = R"json({
  "architectures": ["MixtralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mixtral",
  "num_attention_heads": 32,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "num_local_experts": 8,
  "output_router_logits": false,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})json";

// A tiny Mixtral-shaped model, the size of the test checkpoints.
Json TinyMixtral() {
  return Json{{"model_type", "mixtral"},  {"vocab_size", 64},       {"hidden_size", 16},
              {"intermediate_size", 24},  {"num_hidden_layers", 2}, {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"num_local_experts", 4}, {"num_experts_per_tok", 2}};
}

void ExpectInvalid(const Json& config, const std::vector<std::string>& needles) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(config.dump());
  ASSERT_FALSE(c.ok()) << "accepted: " << config.dump();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  for (const std::string& needle : needles) {
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(needle)) << config.dump();
  }
}

// Per layer: whether the recipe made it an MoE layer.
std::vector<bool> SparseLayers(const ModelConfig& c) {
  std::vector<bool> sparse;
  for (int l = 0; l < c.num_hidden_layers; ++l) sparse.push_back(c.IsSparseLayer(l));
  return sparse;
}

// The config.json files of Qwen/Qwen3-30B-A3B and Qwen/Qwen1.5-MoE-A2.7B as published.
constexpr char kQwen3_30B_A3B[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
  "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";
constexpr char kQwen15MoeA27B[] = R"({
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
  "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24,
  "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.39.0.dev0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
  "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
  "norm_topk_prob": false, "output_router_logits": false, "router_aux_loss_coef": 0.001})";

TEST(ModelConfigTest, ParsesPublishedQwenMoeConfigs) {
  absl::StatusOr<ModelConfig> q3 = ParseModelConfig(kQwen3_30B_A3B);
  ASSERT_TRUE(q3.ok()) << q3.status();
  EXPECT_EQ(q3->intermediate_size, 768);
  EXPECT_EQ(q3->num_local_experts, 128);
  EXPECT_EQ(q3->num_experts_per_tok, 8);
  EXPECT_EQ(q3->head_dim, 128);  // not hidden / heads (64)
  EXPECT_TRUE(q3->norm_topk_prob);
  EXPECT_TRUE(q3->HasQkNorm());
  EXPECT_FALSE(q3->attention_qkv_bias);
  EXPECT_FALSE(q3->HasSharedExpert());
  EXPECT_FALSE(q3->HasDenseLayers());
  EXPECT_EQ(q3->sliding_window, 0);
  // embed + 48 x (2 norms + 4 attention + 2 q/k norms + router + 128 x 3) + norm + lm_head
  EXPECT_EQ(ExpectedTensors(*q3).size(), 1u + 48 * (2 + 4 + 2 + 1 + 128 * 3) + 2u);

  absl::StatusOr<ModelConfig> q15 = ParseModelConfig(kQwen15MoeA27B);
  ASSERT_TRUE(q15.ok()) << q15.status();
  EXPECT_EQ(q15->intermediate_size, 1408);
  EXPECT_EQ(q15->shared_expert_intermediate_size, 5632);
  EXPECT_EQ(q15->num_local_experts, 60);
  EXPECT_FALSE(q15->norm_topk_prob);
  EXPECT_TRUE(q15->attention_qkv_bias);
  EXPECT_FALSE(q15->HasQkNorm());
  EXPECT_EQ(q15->sliding_window, 0);  // use_sliding_window: false
  // embed + 24 x (2 norms + 4 attention + 3 biases + router + 60 x 3 + shared 3 + its gate)
  // + norm + lm_head
  EXPECT_EQ(ExpectedTensors(*q15).size(), 1u + 24 * (2 + 4 + 3 + 1 + 60 * 3 + 3 + 1) + 2u);
}

// deepseek-ai/deepseek-moe-16b-base's config.json as published (the CRISP method's second
// model), less its auto_map.
constexpr char kDeepseekMoe16B[] = R"({
  "architectures": ["DeepseekForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001,
  "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 4096,
  "model_type": "deepseek", "moe_intermediate_size": 1408, "moe_layer_freq": 1,
  "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false,
  "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 28,
  "num_key_value_heads": 16, "pretraining_tp": 1, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 10000, "scoring_func": "softmax", "seq_aux": true,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.36.0",
  "use_cache": true, "vocab_size": 102400})";

TEST(ModelConfigTest, ParsesPublishedDeepseekMoe16B) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kDeepseekMoe16B);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type(), "deepseek");
  EXPECT_EQ(c->num_local_experts, 64);
  EXPECT_EQ(c->num_experts_per_tok, 6);
  EXPECT_EQ(c->intermediate_size, 1408);
  EXPECT_EQ(c->dense_intermediate_size, 10944);
  EXPECT_EQ(c->shared_expert_intermediate_size, 2 * 1408);  // two shared experts as one MLP
  EXPECT_FALSE(c->shared_expert_gated);
  EXPECT_FALSE(c->norm_topk_prob);
  EXPECT_EQ(c->num_key_value_heads, 16);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_FALSE(c->attention_qkv_bias);
  EXPECT_FALSE(c->IsSparseLayer(0));  // first_k_dense_replace
  for (int l = 1; l < 28; ++l) EXPECT_TRUE(c->IsSparseLayer(l)) << l;
  // embed + dense layer 0 (2 norms + 4 attention + 3 MLP) + 27 x (2 norms + 4 attention +
  // router + 64 x 3 + shared 3, no gate) + norm + lm_head
  const std::vector<TensorSpec> tensors = ExpectedTensors(*c);
  EXPECT_EQ(tensors.size(), 1u + 9 + 27 * (2 + 4 + 1 + 64 * 3 + 3) + 2u);
  EXPECT_TRUE(std::any_of(tensors.begin(), tensors.end(), [](const TensorSpec& t) {
    return t.name == "model.layers.1.mlp.shared_experts.down_proj.weight" &&
           t.shape == std::vector<int64_t>{2048, 2816};
  }));

  // moe_layer_freq 2 with first_k_dense_replace 1: layers 2, 4, ... are MoE.
  Json j = Json::parse(kDeepseekMoe16B);
  j["moe_layer_freq"] = 2;
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(SparseLayers(*c),
            (std::vector<bool>{false, false, true, false, true, false, true, false, true, false,
                               true,  false, true, false, true, false, true, false, true, false,
                               true,  false, true, false, true, false, true, false}));
  j["n_shared_experts"] = nullptr;  // none
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->HasSharedExpert());

  // What the engine does not run is refused, naming the key.
  j = Json::parse(kDeepseekMoe16B);
  j["scoring_func"] = "sigmoid";
  ExpectInvalid(j, {"scoring_func", "sigmoid"});
  j = Json::parse(kDeepseekMoe16B);
  j["moe_layer_freq"] = 0;
  ExpectInvalid(j, {"moe_layer_freq", "at least 1"});
  j = Json::parse(kDeepseekMoe16B);
  j["first_k_dense_replace"] = 28;
  ExpectInvalid(j, {"first_k_dense_replace", "no MoE layer"});
  j = Json::parse(kDeepseekMoe16B);
  j["n_shared_experts"] = -1;
  ExpectInvalid(j, {"n_shared_experts", "negative"});
  j = Json::parse(kDeepseekMoe16B);
  j.erase("n_routed_experts");  // a dense model
  ExpectInvalid(j, {"n_routed_experts", "missing"});
}

// deepseek-ai/DeepSeek-V2-Lite's config.json as published, less its auto_map.
constexpr char kDeepseekV2Lite[] = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 100000,
  "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
  "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
  "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
  "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16,
  "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
  "pretraining_tp": 1, "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                   "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
  "seq_aux": true, "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
  "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 102400})";

// deepseek-ai/DeepSeek-V3's config.json as published, less its auto_map: FP8 weights.
constexpr char kDeepseekV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1,
  "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
  "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
  "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                          "quant_method": "fp8", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "seq_aux": true, "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 129280})";

TEST(ModelConfigTest, ParsesPublishedDeepseekV2LiteAndV3) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kDeepseekV2Lite);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type(), "deepseek_v2");
  EXPECT_EQ(c->mla.q_lora_rank, 0);  // null: q_proj
  EXPECT_EQ(c->mla.kv_lora_rank, 512);
  EXPECT_EQ(c->mla.cache_dim(), 576);  // what a token's cache holds a layer
  EXPECT_EQ(c->head_dim, 192);
  EXPECT_EQ(c->rotary_dim, 64);
  EXPECT_TRUE(c->rope_interleaved);
  EXPECT_EQ(c->NumLayers(MixerKind::kLatentAttention), 27);
  EXPECT_EQ(c->NumKvLayers(), 27);
  const ModelConfig::KvShape kv = c->kv_shape();
  EXPECT_EQ(kv.heads, 1);
  EXPECT_EQ(kv.head_dim, 576);
  EXPECT_TRUE(kv.keys_only);
  EXPECT_FALSE(c->IsSparseLayer(0));
  EXPECT_TRUE(c->IsSparseLayer(26));
  EXPECT_EQ(c->shared_expert_intermediate_size, 2 * 1408);
  EXPECT_FALSE(c->router.sigmoid);
  EXPECT_EQ(c->router.groups, 1);
  EXPECT_EQ(c->router.scaling, 1.0);
  EXPECT_EQ(c->rope_scaling.kind, RopeScaling::Kind::kYarn);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 4096);
  // YaRN: the fastest pairs keep theta^(-2i/64), the slowest are divided by the factor, and
  // the softmax scale is 1/sqrt(192) * (0.1 * 0.707 * ln 40 + 1)^2.
  const std::vector<float> inv_freq = c->RopeFrequencies();
  ASSERT_EQ(inv_freq.size(), 32u);
  EXPECT_FLOAT_EQ(inv_freq[0], 1.0f);
  EXPECT_NEAR(inv_freq[31], std::pow(10000.0f, -62.0f / 64) / 40, 1e-12);
  const double mscale = 0.1 * 0.707 * std::log(40.0) + 1;
  EXPECT_NEAR(c->LatentAttentionScale(), mscale * mscale / std::sqrt(192.0), 1e-12);
  // embed + dense layer 0 (2 norms + q, kv_a, its norm, kv_b, o + 3 MLP) + 26 x (2 norms + 5
  // attention + router + 64 x 3 + shared 3) + norm + lm_head
  const std::vector<TensorSpec> tensors = ExpectedTensors(*c);
  EXPECT_EQ(tensors.size(), 1u + 10 + 26 * (2 + 5 + 1 + 64 * 3 + 3) + 2u);
  EXPECT_TRUE(std::any_of(tensors.begin(), tensors.end(), [](const TensorSpec& t) {
    return t.name == "model.layers.3.self_attn.kv_b_proj.weight" &&
           t.shape == std::vector<int64_t>{16 * (128 + 128), 512};
  }));

  c = ParseModelConfig(kDeepseekV3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type(), "deepseek_v3");
  EXPECT_EQ(c->mla.q_lora_rank, 1536);
  EXPECT_EQ(c->mla.cache_dim(), 576);
  EXPECT_TRUE(c->router.sigmoid);
  EXPECT_TRUE(c->router.selection_bias);
  EXPECT_TRUE(c->router.group_top_two);
  EXPECT_EQ(c->router.groups, 8);
  EXPECT_EQ(c->router.top_groups, 4);
  EXPECT_EQ(c->router.scaling, 2.5);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->quantization.bits, 0);
  EXPECT_EQ(c->quantization.unsupported_method, "fp8");
  for (int l = 0; l < 61; ++l) EXPECT_EQ(c->IsSparseLayer(l), l >= 3) << l;
  // The multi-token-prediction layer, stored after the last, is skipped; the layers are not.
  EXPECT_TRUE(IsIgnoredTensor(*c, "model.layers.61.eh_proj.weight"));
  EXPECT_TRUE(IsIgnoredTensor(*c, "model.layers.61.mlp.experts.3.up_proj.weight"));
  EXPECT_FALSE(IsIgnoredTensor(*c, "model.layers.60.mlp.experts.3.up_proj.weight"));
  EXPECT_FALSE(IsIgnoredTensor(*c, "model.layers.61"));
  EXPECT_FALSE(IsIgnoredTensor(*c, "model.layers.x.eh_proj.weight"));
  EXPECT_FALSE(IsIgnoredTensor(*c, "model.norm.weight"));
  const std::vector<TensorSpec> v3 = ExpectedTensors(*c);
  EXPECT_TRUE(std::any_of(v3.begin(), v3.end(), [](const TensorSpec& t) {
    return t.name == "model.layers.3.mlp.gate.e_score_correction_bias" &&
           t.shape == std::vector<int64_t>{256};
  }));
  EXPECT_TRUE(std::any_of(v3.begin(), v3.end(), [](const TensorSpec& t) {
    return t.name == "model.layers.0.self_attn.q_b_proj.weight" &&
           t.shape == std::vector<int64_t>{128 * 192, 1536};
  }));

  // What the engine does not run is refused, naming the key.
  Json j = Json::parse(kDeepseekV2Lite);
  j["norm_topk_prob"] = true;  // Hugging Face's DeepseekV2Moe ignores it
  ExpectInvalid(j, {"norm_topk_prob"});
  j = Json::parse(kDeepseekV2Lite);
  j["topk_method"] = "noaux_tc";
  ExpectInvalid(j, {"topk_method", "noaux_tc"});
  j = Json::parse(kDeepseekV2Lite);
  j["topk_method"] = "group_limited_greedy";
  j["n_group"] = 3;  // 64 experts in 3 groups
  ExpectInvalid(j, {"n_group", "divide"});
  j = Json::parse(kDeepseekV2Lite);
  j["rope_scaling"]["mscale"] = 1.0;  // cos and sin scaled by mscale / mscale_all_dim
  ExpectInvalid(j, {"rope_scaling.attention_factor"});
  j = Json::parse(kDeepseekV2Lite);
  j["attention_bias"] = true;
  ExpectInvalid(j, {"attention_bias"});
  j = Json::parse(kDeepseekV2Lite);
  j["qk_rope_head_dim"] = 63;
  ExpectInvalid(j, {"qk_rope_head_dim", "even"});
  j = Json::parse(kDeepseekV3);
  j["scoring_func"] = "softmax";
  ExpectInvalid(j, {"scoring_func"});
  j = Json::parse(kDeepseekV3);
  j["topk_group"] = 9;
  ExpectInvalid(j, {"topk_group"});
  j = Json::parse(kDeepseekV3);
  j["rope_interleave"] = false;
  ExpectInvalid(j, {"rope_interleave"});
}

// openai/gpt-oss-20b's config.json as published.
constexpr char kGptOss20b[] = R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
  "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
  "intermediate_size": 2880,
  "layer_types": [
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
  "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
  "num_local_experts": 32, "output_router_logits": false, "pad_token_id": 199999,
  "quantization_config": {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                               "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4"},
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                   "original_max_position_embeddings": 4096, "rope_type": "yarn",
                   "truncate": false},
  "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
  "swiglu_limit": 7.0, "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0",
  "use_cache": true, "vocab_size": 201088
})";

TEST(ModelConfigTest, ParsesPublishedGptOss20b) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kGptOss20b);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type(), "gpt_oss");
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->rotary_dim, 64);
  EXPECT_EQ(c->num_local_experts, 32);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_EQ(c->intermediate_size, 2880);
  EXPECT_TRUE(c->attention_qkv_bias);
  EXPECT_TRUE(c->attention_out_bias);
  EXPECT_TRUE(c->attention_sinks);
  EXPECT_TRUE(c->router.logit_bias);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_TRUE(c->expert_bias);
  EXPECT_EQ(c->swiglu_limit, 7.0);
  for (int l = 0; l < 24; ++l) EXPECT_EQ(c->LayerWindow(l), l % 2 == 0 ? 128 : 0) << l;
  // YaRN factor 32 unscaled by mscale: cos and sin times 1 + 0.1 ln 32, its square on the scale.
  const double a = 0.1 * std::log(32.0) + 1;
  EXPECT_NEAR(c->rope_scaling.attention_factor, a, 1e-12);
  EXPECT_NEAR(c->AttentionScale(), a * a / 8, 1e-6);
  EXPECT_FALSE(c->rope_scaling.truncate);
  EXPECT_TRUE(c->quantization.mxfp4);
  EXPECT_EQ(c->quantization.bits, 8);
  EXPECT_EQ(c->quantization.group_size, 32);
  EXPECT_TRUE(c->quantization.experts);
  EXPECT_FALSE(c->quantization.attention);
  // As published: stacked MXFP4 blocks and scales, the biases stacked too; embed + 24 x (2 norms
  // + q, k, v, o and their 4 biases + sinks + router and its bias + 2 x (blocks, scales) + 2
  // biases) + norm + lm_head.
  const std::vector<TensorSpec> tensors = ExpectedTensors(*c, ExpertLayout::kStacked);
  EXPECT_EQ(tensors.size(), 1u + 24 * (2 + 8 + 1 + 2 + 4 + 2) + 2u);
  auto has = [&](const std::string& name, std::vector<int64_t> shape, TensorStorage storage) {
    return std::any_of(tensors.begin(), tensors.end(), [&](const TensorSpec& t) {
      return t.name == name && t.shape == shape && t.storage == storage;
    });
  };
  EXPECT_TRUE(has("model.layers.5.mlp.experts.gate_up_proj_blocks", {32, 5760, 90, 16},
                  TensorStorage::kMxfp4Blocks));
  EXPECT_TRUE(has("model.layers.5.mlp.experts.down_proj_scales", {32, 2880, 90},
                  TensorStorage::kMxfp4Scales));
  EXPECT_TRUE(
      has("model.layers.5.mlp.experts.gate_up_proj_bias", {32, 5760}, TensorStorage::kFloat));
  EXPECT_TRUE(has("model.layers.5.self_attn.sinks", {64}, TensorStorage::kFloat));
  EXPECT_TRUE(has("model.layers.5.mlp.router.bias", {32}, TensorStorage::kFloat));
  EXPECT_TRUE(has("model.layers.5.self_attn.o_proj.bias", {2880}, TensorStorage::kFloat));
  EXPECT_EQ(DetectExpertLayout(*c, {"model.layers.0.mlp.experts.gate_up_proj_blocks"}),
            ExpertLayout::kStacked);

  // The dequantized layout (bf16, x @ W with gate and up interleaved).
  Json j = Json::parse(kGptOss20b);
  j.erase("quantization_config");
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(TensorShape(*c, TensorKind::kExpertsGateUp), (std::vector<int64_t>{32, 2880, 5760}));
  EXPECT_EQ(TensorShape(*c, TensorKind::kExpertsDown), (std::vector<int64_t>{32, 2880, 2880}));
  EXPECT_EQ(DetectExpertLayout(*c, {"model.layers.0.mlp.experts.gate_up_proj"}),
            ExpertLayout::kStacked);

  // HF's defaults: a window of 128 on the even layers.
  j = Json::parse(kGptOss20b);
  j.erase("layer_types");
  j.erase("sliding_window");
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  for (int l = 0; l < 24; ++l) EXPECT_EQ(c->LayerWindow(l), l % 2 == 0 ? 128 : 0) << l;

  j = Json::parse(kGptOss20b);
  j["swiglu_limit"] = -1;
  ExpectInvalid(j, {"swiglu_limit"});
  j = Json::parse(kGptOss20b);
  j["layer_types"][3] = "chunked_attention";
  ExpectInvalid(j, {"layer_types", "chunked_attention"});
  j = Json::parse(kGptOss20b);
  j["intermediate_size"] = 2890;  // MXFP4's groups of 32
  ExpectInvalid(j, {"mxfp4", "multiples of 32"});
  j = Json::parse(kGptOss20b);
  j["rope_scaling"]["attention_factor"] = -2.0;
  ExpectInvalid(j, {"rope_scaling.attention_factor"});
  // YaRN's attention factor on whole heads of grouped-query attention (latent attention's
  // refusal is ParsesPublishedDeepseekV2LiteAndV3's).
  j = Json::parse(kMixtral8x7B);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();  // whole heads: the softmax takes the square
  EXPECT_NEAR(c->AttentionScale(), std::pow(0.1 * std::log(4.0) + 1, 2) / std::sqrt(128.0), 1e-6);
  // MXFP4 is gpt-oss's.
  j = Json::parse(kMixtral8x7B);
  j["quantization_config"] = {{"quant_method", "mxfp4"}};
  ExpectInvalid(j, {"mxfp4", "mixtral"});
}

// google/gemma-4-26B-A4B-it's config.json: its text_config as published (every key the engine
// reads or refuses), the vision tower's config trimmed (the engine skips the tower).
constexpr char kGemma4_26bA4b[] = R"({
  "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
  "audio_config": null, "boi_token_id": 255999, "eoi_token_id": 258882,
  "image_token_id": 258880, "audio_token_id": 258881, "video_token_id": 258884,
  "tie_word_embeddings": true, "dtype": "bfloat16",
  "vision_config": {"model_type": "gemma4_vision", "hidden_size": 1152, "num_hidden_layers": 27},
  "text_config": {
    "model_type": "gemma4_text", "attention_bias": false, "attention_dropout": 0.0,
    "attention_k_eq_v": true, "bos_token_id": 2, "dtype": "bfloat16", "enable_moe_block": true,
    "eos_token_id": 1, "final_logit_softcapping": 30.0, "global_head_dim": 512, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2816,
    "hidden_size_per_layer_input": 0, "initializer_range": 0.02, "intermediate_size": 2112,
    "layer_types": [
      "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
      "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
      "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
      "sliding_attention", "full_attention"],
    "max_position_embeddings": 262144, "moe_intermediate_size": 704, "num_attention_heads": 16,
    "num_experts": 128, "num_global_key_value_heads": 2, "num_hidden_layers": 30,
    "num_key_value_heads": 8, "num_kv_shared_layers": 0, "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
      "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                         "rope_type": "proportional"},
      "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
    "sliding_window": 1024, "tie_word_embeddings": true, "top_k_experts": 8,
    "use_bidirectional_attention": "vision", "use_cache": true, "use_double_wide_mlp": false,
    "vocab_size": 262144, "vocab_size_per_layer_input": 262144}
})";

TEST(ModelConfigTest, ParsesPublishedGemma4_26bA4b) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kGemma4_26bA4b);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type(), "gemma4");
  EXPECT_EQ(c->num_local_experts, 128);
  EXPECT_EQ(c->num_experts_per_tok, 8);
  EXPECT_EQ(c->intermediate_size, 704);
  EXPECT_EQ(c->dense_intermediate_size, 2112);
  EXPECT_EQ(c->activation, Activation::kGeluTanh);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->sandwich_norms && c->layer_scalar && c->value_norm && c->router.gemma);
  EXPECT_EQ(c->final_logit_softcap, 30.0);
  EXPECT_NEAR(c->embedding_scale, std::sqrt(2816.0), 1e-9);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  for (int l = 0; l < 30; ++l) {
    const bool global = (l + 1) % 6 == 0;
    EXPECT_EQ(c->LayerWindow(l), global ? 0 : 1024) << l;
    EXPECT_EQ(c->Ffn(l), FfnKind::kDenseAndMoe) << l;
    const AttentionShape a = c->LayerAttention(l);
    EXPECT_EQ(a.head_dim, global ? 512 : 256) << l;
    EXPECT_EQ(a.kv_heads, global ? 2 : 8) << l;
    EXPECT_EQ(a.values_from_keys, global) << l;
    EXPECT_EQ(c->AttentionScale(l), 1.0f) << l;
  }
  // The paged layers are the global ones: 2 KV heads of 512.
  EXPECT_EQ(c->kv_shape().heads, 2);
  EXPECT_EQ(c->kv_shape().head_dim, 512);
  // Sliding RoPE: theta 10000 over the 256-wide head; proportional on the global layers: the
  // first 64 of 256 pairs at theta 1e6 over 512, the rest unturned.
  const std::vector<float> local = c->RopeFrequencies(0), global = c->RopeFrequencies(5);
  ASSERT_EQ(local.size(), 128u);
  ASSERT_EQ(global.size(), 256u);
  EXPECT_NEAR(local[1], std::pow(10000.0, -2.0 / 256), 1e-7);
  EXPECT_NEAR(global[1], std::pow(1e6, -2.0 / 512), 1e-7);
  EXPECT_GT(global[63], 0.0f);
  EXPECT_EQ(global[64], 0.0f);
  EXPECT_EQ(global[255], 0.0f);
  // As published: stacked experts under model.language_model; no v_proj on the global layers;
  // embed + 30 x (4 + 3 norms, q, k, [v], o, q/k norms, layer_scalar, dense MLP, router and its
  // two scales, 2 stacked) + norm (tied lm_head).
  const std::vector<TensorSpec> tensors = ExpectedTensors(*c, ExpertLayout::kStacked);
  EXPECT_EQ(tensors.size(), 1u + 30 * (7 + 6 + 1 + 3 + 3 + 2) - 5 + 1u);
  auto has = [&](const std::string& name, std::vector<int64_t> shape) {
    return std::any_of(tensors.begin(), tensors.end(),
                       [&](const TensorSpec& t) { return t.name == name && t.shape == shape; });
  };
  const std::string p = "model.language_model.layers.";
  EXPECT_TRUE(has(p + "0.self_attn.q_proj.weight", {16 * 256, 2816}));
  EXPECT_TRUE(has(p + "0.self_attn.v_proj.weight", {8 * 256, 2816}));
  EXPECT_TRUE(has(p + "5.self_attn.q_proj.weight", {16 * 512, 2816}));
  EXPECT_TRUE(has(p + "5.self_attn.k_proj.weight", {2 * 512, 2816}));
  EXPECT_FALSE(has(p + "5.self_attn.v_proj.weight", {2 * 512, 2816}));
  EXPECT_TRUE(has(p + "5.self_attn.o_proj.weight", {2816, 16 * 512}));
  EXPECT_TRUE(has(p + "5.self_attn.k_norm.weight", {512}));
  EXPECT_TRUE(has(p + "3.experts.gate_up_proj", {128, 2 * 704, 2816}));
  EXPECT_TRUE(has(p + "3.experts.down_proj", {128, 2816, 704}));
  EXPECT_TRUE(has(p + "3.mlp.gate_proj.weight", {2112, 2816}));
  EXPECT_TRUE(has(p + "3.router.per_expert_scale", {128}));
  EXPECT_TRUE(has(p + "3.router.scale", {2816}));
  EXPECT_TRUE(has(p + "3.layer_scalar", {1}));
  EXPECT_TRUE(has(p + "3.post_feedforward_layernorm_2.weight", {2816}));
  EXPECT_TRUE(IsIgnoredTensor(*c, "model.vision_tower.encoder.layers.0.mlp.gate_proj.weight"));

  // The text-only layout reads the same keys at the top level, tensors under model.
  Json text = Json::parse(kGemma4_26bA4b)["text_config"];
  c = ParseModelConfig(text.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type(), "gemma4_text");
  EXPECT_TRUE(c->tie_word_embeddings);  // Gemma4TextConfig's default too
  EXPECT_EQ(TensorName(*c->arch, TensorKind::kRouterScale, 2), "model.layers.2.router.scale");

  // Hugging Face's defaults: every sixth layer global and the last always; RoPE as published.
  text.erase("layer_types");
  text.erase("rope_parameters");
  text["num_hidden_layers"] = 8;
  c = ParseModelConfig(text.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  for (int l = 0; l < 8; ++l) EXPECT_EQ(c->LayerWindow(l), l == 5 || l == 7 ? 0 : 1024) << l;
  EXPECT_EQ(c->LayerAttention(7).rope_pairs, 64);
  EXPECT_EQ(c->LayerAttention(7).rope_theta, 1e6);
  EXPECT_EQ(c->rope_theta, 10000.0);

  // What the engine does not run, refused naming the key.
  const Json published = Json::parse(kGemma4_26bA4b);
  auto refused = [&](const char* key, const Json& value, std::vector<std::string> needles) {
    Json j = published;
    if (value.is_discarded()) {
      j["text_config"].erase(key);
    } else {
      j["text_config"][key] = value;
    }
    ExpectInvalid(j, needles);
  };
  const Json erase = Json(Json::value_t::discarded);
  refused("hidden_size_per_layer_input", 256, {"hidden_size_per_layer_input", "per-layer"});
  refused("hidden_size_per_layer_input", erase, {"hidden_size_per_layer_input", "give 0"});
  refused("num_kv_shared_layers", 10, {"num_kv_shared_layers"});
  refused("use_bidirectional_attention", "all", {"use_bidirectional_attention", "vision"});
  refused("enable_moe_block", false, {"enable_moe_block"});
  refused("hidden_activation", "silu", {"hidden_activation", "gelu_pytorch_tanh"});
  refused("attention_bias", true, {"attention_bias"});
  refused("top_k_experts", 129, {"top_k_experts"});
  refused("final_logit_softcapping", -1.0, {"final_logit_softcapping"});
  refused("num_global_key_value_heads", 3, {"num_global_key_value_heads"});
  refused("global_head_dim", 511, {"global_head_dim"});
  Json j = published;
  j["text_config"]["global_head_dim"] = nullptr;  // Hugging Face: the layers' own head_dim
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->LayerAttention(5).head_dim, 256);
  j = published;
  j["text_config"]["rope_parameters"]["full_attention"]["rope_type"] = "yarn";
  ExpectInvalid(j, {"rope_parameters.full_attention.rope_type", "yarn"});
  j = published;
  j["text_config"]["rope_parameters"]["sliding_attention"]["rope_type"] = "proportional";
  ExpectInvalid(j, {"rope_parameters.sliding_attention.rope_type"});
  j = published;
  j["text_config"]["layer_types"][2] = "chunked_attention";
  ExpectInvalid(j, {"layer_types", "chunked_attention"});
}

// Qwen/Qwen3.6-35B-A3B's config.json as published (the phase-decoupled method's backbone),
// its vision_config abridged.
constexpr char kQwen36_35B_A3B[] = R"({
  "architectures": ["Qwen3_5MoeForConditionalGeneration"], "image_token_id": 248056,
  "model_type": "qwen3_5_moe",
  "text_config": {
    "attention_bias": false, "attention_dropout": 0.0, "attn_output_gate": true,
    "bos_token_id": 248044, "dtype": "bfloat16", "eos_token_id": 248044,
    "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02,
    "layer_types": [
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention",
      "linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_5_moe_text",
    "moe_intermediate_size": 512, "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": false, "num_attention_heads": 16, "num_experts": 256,
    "num_experts_per_tok": 8, "num_hidden_layers": 40, "num_key_value_heads": 2,
    "output_router_logits": false, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
    "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
                        "partial_rotary_factor": 0.25, "rope_theta": 10000000,
                        "rope_type": "default"},
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512, "use_cache": true,
    "vocab_size": 248320},
  "tie_word_embeddings": false, "transformers_version": "4.57.1", "video_token_id": 248057,
  "vision_config": {"model_type": "qwen3_5_moe", "depth": 27, "hidden_size": 1152},
  "vision_end_token_id": 248054, "vision_start_token_id": 248053})";

TEST(ModelConfigTest, ParsesPublishedQwen36_35B_A3B) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen36_35B_A3B);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type(), "qwen3_5_moe");
  EXPECT_EQ(c->vocab_size, 248320);
  EXPECT_EQ(c->num_hidden_layers, 40);
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->rotary_dim, 64);  // a quarter of head_dim turns
  EXPECT_EQ(c->rope_theta, 1e7);
  EXPECT_TRUE(c->attention_output_gate);
  EXPECT_TRUE(c->zero_centred_norms);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->num_local_experts, 256);
  EXPECT_EQ(c->intermediate_size, 512);
  EXPECT_EQ(c->shared_expert_intermediate_size, 512);
  EXPECT_TRUE(c->shared_expert_gated);
  EXPECT_EQ(c->eos_token_id, 248044);
  EXPECT_EQ(c->NumLayers(MixerKind::kGatedDeltaNet), 30);
  EXPECT_EQ(c->NumLayers(MixerKind::kAttention), 10);
  for (int l = 0; l < 40; ++l) {
    EXPECT_EQ(c->Mixer(l), l % 4 == 3 ? MixerKind::kAttention : MixerKind::kGatedDeltaNet) << l;
    EXPECT_TRUE(c->IsSparseLayer(l)) << l;
  }
  EXPECT_EQ(c->linear.conv_dim(), 2 * 16 * 128 + 32 * 128);
  // embed + 40 x (2 norms, router, stacked experts 2, shared 3 + its gate) + 30 DeltaNet x 9
  // + 10 attention x (q, k, v, o, q/k norms) + norm + lm_head
  const std::vector<TensorSpec> tensors = ExpectedTensors(*c, ExpertLayout::kStacked);
  EXPECT_EQ(tensors.size(), 1u + 40 * 9 + 30 * 9 + 10 * 6 + 2u);
  auto has = [&](const std::string& name, std::vector<int64_t> shape) {
    return std::any_of(tensors.begin(), tensors.end(),
                       [&](const TensorSpec& t) { return t.name == name && t.shape == shape; });
  };
  EXPECT_TRUE(has("model.language_model.layers.0.mlp.experts.gate_up_proj", {256, 1024, 2048}));
  EXPECT_TRUE(has("model.language_model.layers.0.linear_attn.conv1d.weight", {8192, 1, 4}));
  EXPECT_TRUE(has("model.language_model.layers.3.self_attn.q_proj.weight", {2 * 16 * 256, 2048}));
  EXPECT_TRUE(has("lm_head.weight", {248320, 2048}));
  EXPECT_TRUE(IsIgnoredTensor(*c, "mtp.layers.0.mlp.gate.weight"));
  EXPECT_TRUE(IsIgnoredTensor(*c, "model.visual.blocks.0.attn.qkv.weight"));
  EXPECT_FALSE(IsIgnoredTensor(*c, "model.language_model.norm.weight"));

  // The text-only layout, the keys at the top level, layer types by interval.
  Json j = Json::parse(kQwen36_35B_A3B)["text_config"];
  j.erase("layer_types");
  j["full_attention_interval"] = 2;
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type(), "qwen3_5_moe_text");
  EXPECT_EQ(c->Mixer(0), MixerKind::kGatedDeltaNet);
  EXPECT_EQ(c->Mixer(1), MixerKind::kAttention);
  EXPECT_EQ(TensorName(*c->arch, TensorKind::kLinearALog, 2), "model.layers.2.linear_attn.A_log");

  // What the engine does not run is refused, naming the key.
  Json bad = Json::parse(kQwen36_35B_A3B);
  bad["text_config"]["mamba_ssm_dtype"] = "bfloat16";
  ExpectInvalid(bad, {"mamba_ssm_dtype", "float32"});
  bad = Json::parse(kQwen36_35B_A3B);
  bad["text_config"]["layer_types"][5] = "sliding_attention";
  ExpectInvalid(bad, {"layer_types", "[5]"});
  bad = Json::parse(kQwen36_35B_A3B);
  bad["text_config"]["linear_num_value_heads"] = 24;
  ExpectInvalid(bad, {"linear_num_value_heads", "multiple"});
  bad = Json::parse(kQwen36_35B_A3B);
  bad["text_config"]["rope_parameters"]["rope_type"] = "yarn";
  ExpectInvalid(bad, {"rope_type", "yarn"});
  bad = Json::parse(kQwen36_35B_A3B);
  bad.erase("text_config");
  ExpectInvalid(bad, {"text_config"});
}

TEST(ModelConfigTest, ParsesMixtral8x7B) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kMixtral8x7B);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type(), "mixtral");
  EXPECT_THAT(c->architectures, ElementsAre("MixtralForCausalLM"));
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 14336);
  EXPECT_EQ(c->num_hidden_layers, 32);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 128);  // derived: 4096 / 32
  EXPECT_EQ(c->num_local_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_id, 2);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
}

TEST(ModelConfigTest, AppliesDefaults) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(TinyMixtral().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_EQ(c->eos_token_id, -1);
  EXPECT_TRUE(c->eos_token_ids.empty());
  EXPECT_EQ(c->torch_dtype, "");
  EXPECT_FALSE(c->tie_word_embeddings);

  Json no_kv = TinyMixtral();
  no_kv.erase("num_key_value_heads");
  c = ParseModelConfig(no_kv.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 4);  // multi-head attention
}

TEST(ModelConfigTest, ExplicitHeadDimNeedNotDivideHidden) {
  Json j = TinyMixtral();
  j["hidden_size"] = 18;  // 4 heads do not divide 18, but head_dim is given
  j["head_dim"] = 8;
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 8);
}

TEST(ModelConfigTest, AcceptsEosList) {
  Json j = TinyMixtral();
  j["eos_token_id"] = {5, 7};
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_id, 5);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(5, 7));
}

TEST(ModelConfigTest, RejectsMissingRequiredFields) {
  for (const char* field :
       {"model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_local_experts", "num_experts_per_tok"}) {
    Json j = TinyMixtral();
    j.erase(field);
    ExpectInvalid(j, {field, "missing"});
    j[field] = nullptr;  // null counts as missing
    ExpectInvalid(j, {field, "missing"});
  }
}

TEST(ModelConfigTest, RejectsWrongTypes) {
  struct Case {
    const char* field;
    Json value;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"hidden_size", "4096", "must be an integer"},
      {"vocab_size", 64.5, "must be an integer"},
      {"num_hidden_layers", true, "must be an integer"},
      {"num_key_value_heads", Json::array({2}), "must be an integer"},
      {"rope_theta", "1e6", "must be a number"},
      {"rms_norm_eps", Json::object(), "must be a number"},
      {"tie_word_embeddings", "false", "must be a boolean"},
      {"torch_dtype", 16, "must be a string"},
      {"model_type", 1, "must be a string"},
      {"architectures", "MixtralForCausalLM", "array of strings"},
      {"eos_token_id", "2", "must be an integer"},
  };
  for (const Case& c : cases) {
    Json j = TinyMixtral();
    j[c.field] = c.value;
    ExpectInvalid(j, {c.field, c.expected});
  }
}

TEST(ModelConfigTest, RejectsBadSizes) {
  for (const char* field :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "num_local_experts", "num_experts_per_tok"}) {
    Json j = TinyMixtral();
    j[field] = 0;
    ExpectInvalid(j, {field, "must be positive"});
    j[field] = -3;
    ExpectInvalid(j, {field, "must be positive"});
  }
  Json j = TinyMixtral();
  j["num_hidden_layers"] = 1000000;
  ExpectInvalid(j, {"num_hidden_layers", "too large"});
  j = TinyMixtral();
  j["vocab_size"] = uint64_t{1} << 63;
  ExpectInvalid(j, {"vocab_size", "out of range"});
  j = TinyMixtral();
  j["rope_theta"] = 0;
  ExpectInvalid(j, {"rope_theta", "positive"});
  j = TinyMixtral();
  j["rms_norm_eps"] = -1e-6;
  ExpectInvalid(j, {"rms_norm_eps", "positive"});
}

TEST(ModelConfigTest, RejectsInconsistentGeometry) {
  Json j = TinyMixtral();
  j["num_attention_heads"] = 3;  // 16 % 3 != 0, no head_dim
  j["num_key_value_heads"] = 1;
  ExpectInvalid(j, {"num_attention_heads", "must divide hidden_size"});

  j = TinyMixtral();
  j["num_key_value_heads"] = 3;  // 4 % 3 != 0
  ExpectInvalid(j, {"num_key_value_heads", "must divide num_attention_heads"});

  j = TinyMixtral();
  j["num_experts_per_tok"] = 5;  // > 4 experts
  ExpectInvalid(j, {"num_experts_per_tok", "must not exceed", "num_local_experts"});

  j = TinyMixtral();
  j["bos_token_id"] = 64;  // == vocab_size
  ExpectInvalid(j, {"bos_token_id", "vocab_size"});
}

TEST(ModelConfigTest, RejectsUnknownModelTypeAndUnsupportedFeatures) {
  Json j = TinyMixtral();
  j["model_type"] = "llama";
  ExpectInvalid(j, {"model_type", "\"llama\"", "mixtral"});

  j = TinyMixtral();
  j["torch_dtype"] = "int8";
  ExpectInvalid(j, {"torch_dtype", "int8"});

  j = TinyMixtral();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ExpectInvalid(j, {"rope_scaling", "not supported"});
}

TEST(ModelConfigTest, RejectsMalformedJson) {
  for (const char* text : {"", "{", "{\"model_type\": \"mixtral\",}", "nonsense", "{'a': 1}"}) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("malformed JSON"));
  }
  absl::StatusOr<ModelConfig> c = ParseModelConfig("[1, 2]");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("must be an object"));
}

// Sliding windows on the layers Hugging Face's code puts them on: every Mixtral layer; Qwen's
// from max_window_layers on, or as layer_types says, only where use_sliding_window lets them;
// none in a layout without them.
TEST(ModelConfigTest, SlidingWindowsAreOnTheLayersHuggingFacePutsThem) {
  Json j = TinyMixtral();
  j["max_position_embeddings"] = 8192;
  j["sliding_window"] = 4096;
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 4096);
  for (int l = 0; l < c->num_hidden_layers; ++l) EXPECT_EQ(c->LayerWindow(l), 4096) << l;
  j["use_sliding_window"] = false;  // Qwen-style switch
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->LayerWindow(0), 0);

  Json q = Json::parse(kQwen3_30B_A3B);
  q["num_hidden_layers"] = 4;
  q["use_sliding_window"] = true;
  q["sliding_window"] = 64;
  q["max_window_layers"] = 2;
  c = ParseModelConfig(q.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(std::vector<int64_t>(
                {c->LayerWindow(0), c->LayerWindow(1), c->LayerWindow(2), c->LayerWindow(3)}),
            std::vector<int64_t>({0, 0, 64, 64}));
  q["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  c = ParseModelConfig(q.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(std::vector<int64_t>(
                {c->LayerWindow(0), c->LayerWindow(1), c->LayerWindow(2), c->LayerWindow(3)}),
            std::vector<int64_t>({64, 0, 64, 0}));
  q["layer_types"] = {"sliding_attention", "chunked_attention", "sliding_attention",
                      "full_attention"};
  ExpectInvalid(q, {"layer_types", "chunked_attention"});
  q["layer_types"] = {"sliding_attention"};
  ExpectInvalid(q, {"layer_types", "4 layers"});

  Json d = Json::parse(kDeepseekMoe16B);
  d["sliding_window"] = 4096;
  d["use_sliding_window"] = true;
  ExpectInvalid(d, {"sliding_window", "no sliding-window layers"});
}

TEST(ModelConfigTest, MixtralRefusesWhatItsLayoutLacks) {
  Json j = TinyMixtral();
  for (auto [key, value] :
       std::vector<std::pair<std::string, Json>>{{"attention_bias", true},
                                                 {"shared_expert_intermediate_size", 64},
                                                 {"n_shared_experts", 2},
                                                 {"decoder_sparse_step", 2},
                                                 {"mlp_only_layers", Json::array({0})},
                                                 {"hidden_act", "gelu"}}) {
    SCOPED_TRACE(key);
    Json bad = j;
    bad[key] = value;
    ExpectInvalid(bad, {key});
  }
  // The same keys saying what Mixtral is anyway are accepted.
  j["attention_bias"] = false;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = Json::array();
  j["hidden_act"] = "silu";
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->HasDenseLayers());
  EXPECT_FALSE(c->HasSharedExpert());
  EXPECT_FALSE(c->attention_qkv_bias);
  EXPECT_TRUE(c->norm_topk_prob);
}

TEST(ModelConfigTest, ArchitectureTable) {
  absl::StatusOr<const ArchitectureSpec*> mixtral = FindArchitecture("mixtral");
  ASSERT_TRUE(mixtral.ok());
  EXPECT_EQ(*mixtral, &MixtralArchitecture());
  EXPECT_TRUE(FindArchitecture("qwen3_moe").ok());
  EXPECT_FALSE(FindArchitecture("gpt2").ok());
  for (const ArchitectureSpec* arch : Architectures()) {
    // Every architecture names the tensors every MoE decoder has.
    for (TensorKind kind : {TensorKind::kTokenEmbedding, TensorKind::kAttnQ, TensorKind::kRouter,
                            TensorKind::kExpertGate, TensorKind::kExpertUp, TensorKind::kExpertDown,
                            TensorKind::kOutputNorm}) {
      EXPECT_FALSE(TensorName(*arch, kind, 0, 0).empty()) << arch->model_type;
    }
  }
  EXPECT_EQ(TensorName(MixtralArchitecture(), TensorKind::kExpertDown, 3, 7),
            "model.layers.3.block_sparse_moe.experts.7.w2.weight");
  EXPECT_EQ(TensorName(MixtralArchitecture(), TensorKind::kAttnQNorm, 0), "");
}

TEST(ModelConfigTest, ExpectedTensorsMixtral) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(TinyMixtral().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<TensorSpec> tensors = ExpectedTensors(*c);
  // embed + per layer (2 norms + 4 attention + router + 4 experts * 3) + norm + lm_head.
  ASSERT_EQ(tensors.size(), 1u + 2u * (2 + 4 + 1 + 4 * 3) + 1u + 1u);

  std::map<std::string, std::vector<int64_t>> by_name;
  for (const TensorSpec& t : tensors) {
    EXPECT_TRUE(by_name.emplace(t.name, t.shape).second) << "duplicate " << t.name;
  }
  auto shape = [&](const std::string& name) {
    auto it = by_name.find(name);
    return it == by_name.end() ? std::vector<int64_t>{-1} : it->second;
  };
  EXPECT_THAT(shape("model.embed_tokens.weight"), ElementsAre(64, 16));
  EXPECT_THAT(shape("model.layers.1.input_layernorm.weight"), ElementsAre(16));
  EXPECT_THAT(shape("model.layers.1.post_attention_layernorm.weight"), ElementsAre(16));
  EXPECT_THAT(shape("model.layers.0.self_attn.q_proj.weight"), ElementsAre(16, 16));
  EXPECT_THAT(shape("model.layers.0.self_attn.k_proj.weight"), ElementsAre(8, 16));  // 2 kv
  EXPECT_THAT(shape("model.layers.0.self_attn.v_proj.weight"), ElementsAre(8, 16));
  EXPECT_THAT(shape("model.layers.0.self_attn.o_proj.weight"), ElementsAre(16, 16));
  EXPECT_THAT(shape("model.layers.1.block_sparse_moe.gate.weight"), ElementsAre(4, 16));
  EXPECT_THAT(shape("model.layers.1.block_sparse_moe.experts.3.w1.weight"), ElementsAre(24, 16));
  EXPECT_THAT(shape("model.layers.1.block_sparse_moe.experts.3.w3.weight"), ElementsAre(24, 16));
  EXPECT_THAT(shape("model.layers.1.block_sparse_moe.experts.3.w2.weight"), ElementsAre(16, 24));
  EXPECT_THAT(shape("model.norm.weight"), ElementsAre(16));
  EXPECT_THAT(shape("lm_head.weight"), ElementsAre(64, 16));

  const TensorSpec& first_expert = tensors[1 + 7];  // after embed and layer 0's 7 dense tensors
  EXPECT_EQ(first_expert.kind, TensorKind::kExpertGate);
  EXPECT_EQ(first_expert.layer, 0);
  EXPECT_EQ(first_expert.expert, 0);

  ModelConfig tied = *c;
  tied.tie_word_embeddings = true;
  const std::vector<TensorSpec> tied_tensors = ExpectedTensors(tied);
  EXPECT_EQ(tied_tensors.size(), tensors.size() - 1);
  for (const TensorSpec& t : tied_tensors) EXPECT_NE(t.name, "lm_head.weight");
}

TEST(ModelConfigTest, Qwen3MoeEntry) {
  Json j = {{"model_type", "qwen3_moe"},
            {"vocab_size", 100},
            {"hidden_size", 32},
            {"intermediate_size", 64},  // dense width; unused when every layer is MoE
            {"moe_intermediate_size", 12},
            {"num_hidden_layers", 1},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"head_dim", 16},
            {"num_experts", 8},
            {"num_experts_per_tok", 4},
            {"norm_topk_prob", true},
            {"decoder_sparse_step", 1},
            {"mlp_only_layers", Json::array()},
            {"tie_word_embeddings", true}};
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type(), "qwen3_moe");
  EXPECT_EQ(c->intermediate_size, 12);
  EXPECT_EQ(c->num_local_experts, 8);
  EXPECT_TRUE(c->norm_topk_prob);
  const std::vector<TensorSpec> tensors = ExpectedTensors(*c);
  // embed + (2 norms + 4 attention + 2 qk norms + router + 8 experts * 3) + norm; tied.
  EXPECT_EQ(tensors.size(), 1u + (2 + 4 + 2 + 1 + 8 * 3) + 1u);
  bool saw_q_norm = false, saw_expert = false;
  for (const TensorSpec& t : tensors) {
    if (t.name == "model.layers.0.self_attn.q_norm.weight") {
      saw_q_norm = true;
      EXPECT_THAT(t.shape, ElementsAre(16));
    }
    if (t.name == "model.layers.0.mlp.experts.7.down_proj.weight") {
      saw_expert = true;
      EXPECT_THAT(t.shape, ElementsAre(32, 12));
    }
    if (t.name == "model.layers.0.self_attn.q_proj.weight") {
      EXPECT_THAT(t.shape, ElementsAre(64, 32));  // 4 heads * 16 != hidden
    }
  }
  EXPECT_TRUE(saw_q_norm);
  EXPECT_TRUE(saw_expert);

  j.erase("norm_topk_prob");
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->norm_topk_prob);  // Hugging Face's default for qwen3_moe

  EXPECT_EQ(c->rope_theta, 10000.0);  // Hugging Face's Qwen defaults
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_FALSE(c->attention_qkv_bias);
  EXPECT_FALSE(c->HasSharedExpert());

  j["mlp_only_layers"] = {0};  // the only layer dense: no MoE left
  ExpectInvalid(j, {"no MoE layer"});
  j["mlp_only_layers"] = Json::array();
  j["decoder_sparse_step"] = 2;
  ExpectInvalid(j, {"decoder_sparse_step"});
  j["decoder_sparse_step"] = 0;
  ExpectInvalid(j, {"decoder_sparse_step", "at least 1"});
  j["decoder_sparse_step"] = 1;
  j["shared_expert_intermediate_size"] = 16;  // Qwen3-MoE has no shared expert
  ExpectInvalid(j, {"shared_expert_intermediate_size"});
  j.erase("shared_expert_intermediate_size");
  j["use_sliding_window"] = true;
  j["sliding_window"] = 8;
  ExpectInvalid(j, {"sliding_window"});
  j.erase("use_sliding_window");
  j.erase("sliding_window");
  j.erase("moe_intermediate_size");
  ExpectInvalid(j, {"moe_intermediate_size", "missing"});
}

// Four Qwen3-MoE layers: which are dense follows Hugging Face's rule, and their tensors are a
// dense MLP's, without router or experts.
TEST(ModelConfigTest, Qwen3MoeSparseStepAndMlpOnlyLayers) {
  Json j = {{"model_type", "qwen3_moe"},
            {"vocab_size", 100},
            {"hidden_size", 32},
            {"intermediate_size", 64},
            {"moe_intermediate_size", 12},
            {"num_hidden_layers", 4},
            {"num_attention_heads", 4},
            {"head_dim", 8},
            {"num_experts", 8},
            {"num_experts_per_tok", 2},
            {"decoder_sparse_step", 2}};
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(SparseLayers(*c), ElementsAre(false, true, false, true));
  EXPECT_EQ(c->dense_intermediate_size, 64);
  j["mlp_only_layers"] = {3};
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(SparseLayers(*c), ElementsAre(false, true, false, false));
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = {0, 2};
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(SparseLayers(*c), ElementsAre(false, true, false, true));
  int routers = 0;
  for (const TensorSpec& t : ExpectedTensors(*c)) {
    if (t.kind == TensorKind::kRouter) {
      ++routers;
      EXPECT_TRUE(t.layer == 1 || t.layer == 3) << t.name;
    }
    if (t.kind == TensorKind::kExpertGate) {
      EXPECT_TRUE(t.layer == 1 || t.layer == 3) << t.name;
    }
    if (t.name == "model.layers.0.mlp.gate_proj.weight") {
      EXPECT_THAT(t.shape, ElementsAre(64, 32));
    }
    if (t.name == "model.layers.2.mlp.down_proj.weight") {
      EXPECT_THAT(t.shape, ElementsAre(32, 64));
    }
    if (t.kind == TensorKind::kDenseGate) {
      EXPECT_TRUE(t.layer == 0 || t.layer == 2) << t.name;
    }
  }
  EXPECT_EQ(routers, 2);
  j["mlp_only_layers"] = {4};
  ExpectInvalid(j, {"mlp_only_layers", "layer 4"});
  j["mlp_only_layers"] = {"0"};
  ExpectInvalid(j, {"mlp_only_layers", "integer"});
  j["mlp_only_layers"] = {0};
  j.erase("intermediate_size");  // dense layers need their width
  ExpectInvalid(j, {"intermediate_size", "missing"});

  // attention_bias: q, k, v and o have bias.
  j["intermediate_size"] = 64;
  j["attention_bias"] = true;
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention_qkv_bias);
  EXPECT_TRUE(c->attention_out_bias);
  int biases = 0;
  for (const TensorSpec& t : ExpectedTensors(*c)) {
    if (t.layer == 0 && absl::EndsWith(t.name, ".bias")) ++biases;
    if (t.name == "model.layers.0.self_attn.k_proj.bias") {
      EXPECT_THAT(t.shape, ElementsAre(32));
    }
    if (t.name == "model.layers.0.self_attn.o_proj.bias") {
      EXPECT_THAT(t.shape, ElementsAre(32));
    }
  }
  EXPECT_EQ(biases, 4);
}

TEST(ModelConfigTest, Qwen2MoeEntry) {
  Json j = {{"model_type", "qwen2_moe"},   {"vocab_size", 100},
            {"hidden_size", 32},           {"intermediate_size", 64},
            {"moe_intermediate_size", 12}, {"shared_expert_intermediate_size", 48},
            {"num_hidden_layers", 2},      {"num_attention_heads", 4},
            {"num_key_value_heads", 2},    {"num_experts", 8},
            {"num_experts_per_tok", 4}};
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type(), "qwen2_moe");
  EXPECT_FALSE(c->norm_topk_prob);     // Hugging Face's default for qwen2_moe
  EXPECT_TRUE(c->attention_qkv_bias);  // Qwen2's q/k/v projections have bias
  EXPECT_FALSE(c->attention_out_bias);
  EXPECT_FALSE(c->HasQkNorm());
  EXPECT_EQ(c->shared_expert_intermediate_size, 48);
  EXPECT_EQ(c->head_dim, 8);
  const std::vector<TensorSpec> tensors = ExpectedTensors(*c);
  // embed + per layer (2 norms + 4 attention + 3 biases + router + 8 experts * 3 + shared
  // expert 3 + its gate) + norm + lm_head.
  EXPECT_EQ(tensors.size(), 1u + 2 * (2 + 4 + 3 + 1 + 8 * 3 + 3 + 1) + 2u);
  bool saw_gate = false, saw_shared = false, saw_bias = false;
  for (const TensorSpec& t : tensors) {
    if (t.name == "model.layers.1.mlp.shared_expert_gate.weight") {
      saw_gate = true;
      EXPECT_THAT(t.shape, ElementsAre(1, 32));
    }
    if (t.name == "model.layers.1.mlp.shared_expert.down_proj.weight") {
      saw_shared = true;
      EXPECT_THAT(t.shape, ElementsAre(32, 48));
    }
    if (t.name == "model.layers.0.self_attn.q_proj.bias") {
      saw_bias = true;
      EXPECT_THAT(t.shape, ElementsAre(32));
    }
  }
  EXPECT_TRUE(saw_gate);
  EXPECT_TRUE(saw_shared);
  EXPECT_TRUE(saw_bias);

  j["qkv_bias"] = false;
  j["norm_topk_prob"] = true;
  j["shared_expert_intermediate_size"] = 0;  // no shared expert
  c = ParseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_FALSE(c->attention_qkv_bias);
  EXPECT_FALSE(c->HasSharedExpert());
  EXPECT_EQ(ExpectedTensors(*c).size(), 1u + 2 * (2 + 4 + 1 + 8 * 3) + 2u);
  j["shared_expert_intermediate_size"] = -1;
  ExpectInvalid(j, {"shared_expert_intermediate_size", "negative"});
  j["shared_expert_intermediate_size"] = 48;
  j["attention_bias"] = true;  // Qwen2-MoE's switch is qkv_bias
  ExpectInvalid(j, {"attention_bias", "qwen2_moe"});
}

TEST(ModelNameFromDirTest, LastComponentWithOrWithoutTrailingSlash) {
  EXPECT_EQ(ModelNameFromDir("models/tiny-moe"), "tiny-moe");
  EXPECT_EQ(ModelNameFromDir("models/tiny-moe/"), "tiny-moe");
  EXPECT_EQ(ModelNameFromDir("/srv/models/./mixtral"), "mixtral");
}

}  // namespace
}  // namespace tandem::model

namespace tandem::model {
namespace {

// A Mixtral shape whose widths all divide by 32 and 64 (hidden 64, experts 96, attention 64).
Json QuantizableMixtral() {
  Json j = Json{{"model_type", "mixtral"},  {"vocab_size", 64},       {"hidden_size", 64},
                {"intermediate_size", 96},  {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                {"num_key_value_heads", 2}, {"num_local_experts", 4}, {"num_experts_per_tok", 2}};
  j["quantization_config"] = {{"quant_method", "tandem"},
                              {"bits", 4},
                              {"group_size", 32},
                              {"symmetric", true},
                              {"modules", {"experts", "attention"}}};
  return j;
}

TEST(QuantizationConfigTest, ParsedAndListedInTheExpectedTensors) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(QuantizableMixtral().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.bits, 4);
  EXPECT_EQ(c->quantization.group_size, 32);
  EXPECT_TRUE(c->quantization.experts);
  EXPECT_TRUE(c->quantization.attention);
  EXPECT_FALSE(c->quantization.shared_expert);
  EXPECT_TRUE(c->quantization.Quantizes(TensorKind::kExpertDown));
  EXPECT_TRUE(c->quantization.Quantizes(TensorKind::kAttnOut));
  EXPECT_FALSE(c->quantization.Quantizes(TensorKind::kRouter));
  EXPECT_FALSE(c->quantization.Quantizes(TensorKind::kOutput));
  EXPECT_FALSE(c->quantization.Quantizes(TensorKind::kTokenEmbedding));
  std::map<std::string, TensorSpec> specs;
  for (const TensorSpec& spec : ExpectedTensors(*c)) specs[spec.name] = spec;
  const TensorSpec& w2 = specs.at("model.layers.1.block_sparse_moe.experts.3.w2.weight");
  EXPECT_EQ(w2.storage, TensorStorage::kInt4);
  EXPECT_EQ(w2.shape, (std::vector<int64_t>{64, 48}));  // two int4 levels a byte
  const TensorSpec& scale = specs.at("model.layers.1.block_sparse_moe.experts.3.w2.weight_scale");
  EXPECT_EQ(scale.storage, TensorStorage::kScale);
  EXPECT_EQ(scale.shape, (std::vector<int64_t>{64, 3}));
  EXPECT_EQ(specs.at("model.layers.0.self_attn.q_proj.weight").storage, TensorStorage::kInt4);
  EXPECT_EQ(specs.at("model.layers.0.block_sparse_moe.gate.weight").storage, TensorStorage::kFloat);
  EXPECT_EQ(specs.count("lm_head.weight_scale"), 0u);
  Json with_head = QuantizableMixtral();
  with_head["quantization_config"]["modules"] = {"experts", "lm_head"};
  c = ParseModelConfig(with_head.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->quantization.Quantizes(TensorKind::kOutput));
  EXPECT_FALSE(c->quantization.Quantizes(TensorKind::kAttnQ));
  EXPECT_FALSE(c->quantization.Quantizes(TensorKind::kTokenEmbedding));
  // The lm_head at its own bits (8 beside 4-bit experts), as listed in the expected tensors.
  with_head["quantization_config"]["lm_head_bits"] = 8;
  c = ParseModelConfig(with_head.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.BitsOf(TensorKind::kOutput), 8);
  EXPECT_EQ(c->quantization.BitsOf(TensorKind::kExpertUp), 4);
  specs.clear();
  for (const TensorSpec& spec : ExpectedTensors(*c)) specs[spec.name] = spec;
  EXPECT_EQ(specs.at("lm_head.weight").storage, TensorStorage::kInt8);
  EXPECT_EQ(specs.at("lm_head.weight").shape, (std::vector<int64_t>{64, 64}));  // a level a byte
  EXPECT_EQ(specs.at("model.layers.1.block_sparse_moe.experts.3.w2.weight").storage,
            TensorStorage::kInt4);

  Json eight = QuantizableMixtral();
  eight["quantization_config"]["bits"] = 8;
  c = ParseModelConfig(eight.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  for (const TensorSpec& spec : ExpectedTensors(*c)) {
    if (spec.name == "model.layers.0.block_sparse_moe.experts.0.w1.weight") {
      EXPECT_EQ(spec.storage, TensorStorage::kInt8);
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{96, 64}));
    }
  }
  // null is no quantization.
  Json none = QuantizableMixtral();
  none["quantization_config"] = nullptr;
  c = ParseModelConfig(none.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.bits, 0);
}

TEST(QuantizationConfigTest, RefusedNamingTheKey) {
  auto with = [](const char* key, const Json& value) {
    Json j = QuantizableMixtral();
    j["quantization_config"][key] = value;
    return j;
  };
  ExpectInvalid(with("quant_method", "gptq"), {"quantization_config.quant_method", "gptq"});
  ExpectInvalid(with("bits", 3), {"quantization_config.bits", "8 or 4"});
  ExpectInvalid(with("bits", "4"), {"quantization_config.bits"});
  ExpectInvalid(with("group_size", 16), {"quantization_config.group_size", "32, 64 or 128"});
  ExpectInvalid(with("symmetric", false), {"quantization_config.symmetric"});
  ExpectInvalid(with("modules", Json::array()), {"quantization_config.modules"});
  ExpectInvalid(with("modules", {"experts", "router"}), {"unknown module", "router"});
  ExpectInvalid(with("lm_head_bits", 8), {"quantization_config.lm_head_bits", "lm_head"});
  Json head_bits = with("modules", {"experts", "lm_head"});
  head_bits["quantization_config"]["lm_head_bits"] = 6;
  ExpectInvalid(head_bits, {"quantization_config.lm_head_bits", "8 or 4"});
  Json tied = with("modules", {"experts", "lm_head"});
  tied["tie_word_embeddings"] = true;
  ExpectInvalid(tied, {"quantization_config.modules", "lm_head", "tie_word_embeddings"});
  // 64 does not divide the expert width 96.
  ExpectInvalid(with("group_size", 64), {"group_size", "(64) must divide the expert width (96)"});
  Json not_object = QuantizableMixtral();
  not_object["quantization_config"] = "int4";
  ExpectInvalid(not_object, {"quantization_config", "object"});
  Json no_method = QuantizableMixtral();
  no_method["quantization_config"].erase("quant_method");
  ExpectInvalid(no_method, {"quant_method", "missing"});
}

}  // namespace
}  // namespace tandem::model
