#!/usr/bin/python3
"""Writes small random-weight checkpoints of every architecture option Tandem runs, with the
PyTorch reference's logits, to tests/golden/arch/NAME/ (the engine must match them as it
matches the shipped model's golden references).

Each directory: config.json, model.safetensors (bf16), golden.json (token ids, the sparse
layers, the smallest router gap) and, as .npy (little-endian f4 / i4):
  logits.npy   (tokens, vocab): float32 logits of the whole sequence, computed from the bf16
               weights in float32
  experts.npy  (sparse layers, tokens, top_k): the chosen experts, by weight
  weights.npy  (sparse layers, tokens, top_k): their weights (renormalised or not, as the
               config says)
Deterministic: the weights come from a seeded generator, so the files reproduce exactly.
Run from the repository root: /usr/bin/python3 tools/train/arch_goldens.py [NAME ...] (the
named cases only; all of them without names).
"""
import os
import openblas_core  # noqa: F401  (before numpy and torch load OpenBLAS)

import json
import shutil
import sys

import numpy as np
import torch

import safetensors_io
from model import Config, MoeForCausalLM

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
            num_experts_per_tok=3, max_position_embeddings=64, moe_intermediate_size=32,
            rope_theta=10000.0, rms_norm_eps=1e-6)

# gpt-oss's options at a small shape: its two cases differ in how the experts are stored.
GPT_OSS = dict(model_type="gpt_oss", intermediate_size=32, num_experts_per_tok=4,
               attention_bias=True, sliding_window=7,
               layer_types=["sliding_attention", "full_attention", "sliding_attention"],
               rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "original_max_position_embeddings": 16,
                             "truncate": False})

# Gemma 4's MoE text model at a small shape: sliding and full attention alternating, the full
# layers with their own head dim, one KV head and keys as values, proportional RoPE.
GEMMA4 = dict(model_type="gemma4", num_hidden_layers=4, head_dim_override=16,
              num_key_value_heads=2,
              layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=7,
              global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                               "full_attention": {"rope_type": "proportional",
                                                  "partial_rotary_factor": 0.25,
                                                  "rope_theta": 1000000.0}},
              final_logit_softcapping=3.0, tie_word_embeddings=True, bos_token_id=2,
              eos_token_id=1)

# name -> (config overrides, what it covers)
CASES = {
    "qwen3_moe_norm_dense_tied": (
        dict(model_type="qwen3_moe", norm_topk_prob=True, mlp_only_layers=[1],
             tie_word_embeddings=True, head_dim_override=24),
        "q/k norm, norm_topk_prob true, a dense layer (mlp_only_layers) among sparse ones, "
        "tied embeddings, head_dim not hidden/heads"),
    "qwen3_moe_step2_bias": (
        dict(model_type="qwen3_moe", norm_topk_prob=False, decoder_sparse_step=2,
             num_hidden_layers=4, attention_bias=True),
        "q/k norm, norm_topk_prob false, decoder_sparse_step 2 (layers 1 and 3 sparse), "
        "attention bias on q, k, v and o"),
    "qwen2_moe_shared": (
        dict(model_type="qwen2_moe", norm_topk_prob=False, shared_expert_intermediate_size=48,
             mlp_only_layers=[0]),
        "shared expert with its sigmoid gate, q/k/v bias, norm_topk_prob false (the "
        "default), a dense first layer"),
    "qwen2_moe_norm_tied": (
        dict(model_type="qwen2_moe", norm_topk_prob=True, shared_expert_intermediate_size=48,
             tie_word_embeddings=True, num_experts_per_tok=2),
        "shared expert, norm_topk_prob true, tied embeddings, every layer sparse"),
    "mixtral": (dict(model_type="mixtral", intermediate_size=32), "Mixtral layout"),
    "deepseek_dense_shared": (
        dict(model_type="deepseek", n_shared_experts=2, first_k_dense_replace=1,
             num_key_value_heads=4, norm_topk_prob=False, num_hidden_layers=4),
        "DeepSeek-MoE: two ungated shared experts (one MLP twice the expert width), a dense "
        "first layer (first_k_dense_replace 1), multi-head attention (kv heads = heads), "
        "softmax top-k without renormalisation"),
    "deepseek_freq2_bias_tied": (
        dict(model_type="deepseek", n_shared_experts=1, moe_layer_freq=2, attention_bias=True,
             norm_topk_prob=True, tie_word_embeddings=True),
        "DeepSeek-MoE: moe_layer_freq 2 (layers 0 and 2 sparse, 1 dense), attention bias on "
        "q, k, v and o, norm_topk_prob true, one shared expert, tied embeddings"),
    "qwen3_5_moe_hybrid": (
        dict(model_type="qwen3_5_moe", num_hidden_layers=4, head_dim_override=16,
             layer_types=["linear_attention"] * 3 + ["full_attention"], linear_num_key_heads=2,
             linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
             partial_rotary_factor=0.25, shared_expert_intermediate_size=48,
             norm_topk_prob=True, max_position_embeddings=256, tokens=150),
        "Qwen3.5-MoE as published (text_config, model.language_model.*, stacked experts, "
        "vision and MTP tensors the engine skips): "
        "three Gated DeltaNet layers then gated full attention, value heads grouped two per "
        "key head, partial rotary (a quarter of head_dim), zero-centred norms, a gated shared "
        "expert; 150 tokens, so a prompt crosses the DeltaNet's 64-token chunks"),
    "qwen3_5_moe_text_tied": (
        dict(model_type="qwen3_5_moe_text", num_hidden_layers=3, head_dim_override=16,
             layer_types=["full_attention", "linear_attention", "linear_attention"],
             linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=8,
             linear_value_head_dim=16, partial_rotary_factor=0.5,
             shared_expert_intermediate_size=24, attention_bias=True, norm_topk_prob=True,
             tie_word_embeddings=True),
        "Qwen3.5-MoE text-only layout (model.*) with experts stored one tensor each: full "
        "attention first, with bias, then two DeltaNet layers with as many value heads as key "
        "heads, half of head_dim rotary, tied embeddings"),
    "qwen3_moe_sliding_window": (
        dict(model_type="qwen3_moe", norm_topk_prob=True, sliding_window=6, max_window_layers=1,
             tokens=30),
        "Qwen3-MoE with use_sliding_window: layers 1 and 2 (from max_window_layers 1) attend to "
        "their last 6 positions, layer 0 to the whole context; 30 tokens, so prompt chunks' "
        "queries each start their window elsewhere"),
    "mixtral_sliding_window": (
        dict(model_type="mixtral", intermediate_size=32, sliding_window=11),
        "Mixtral with sliding_window 11 in every layer, shorter than the 24 tokens"),
    "deepseek_v2_latent_yarn": (
        dict(model_type="deepseek_v2", num_hidden_layers=3, num_key_value_heads=4,
             kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
             n_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=False,
             topk_method="group_limited_greedy", n_group=4, topk_group=2,
             routed_scaling_factor=1.5, max_position_embeddings=256,
             rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                           "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                           "mscale_all_dim": 0.707}),
        "DeepSeek-V2 (V2-Lite's form): multi-head latent attention without a query low-rank "
        "step (q_proj), latent 32, nope 16, rotary 8 (interleaved pairs), values 12; YaRN "
        "(factor 4 over 64 positions, mscale_all_dim in the softmax scale); a dense first "
        "layer; an ungated shared expert; softmax routing limited to the best 2 of 4 groups, "
        "weights times routed_scaling_factor 1.5"),
    "deepseek_v3_sigmoid_groups": (
        dict(model_type="deepseek_v3", num_hidden_layers=3, num_key_value_heads=4,
             intermediate_size=64, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
             v_head_dim=16, n_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True,
             topk_method="noaux_tc", n_group=4, topk_group=2, routed_scaling_factor=2.5,
             tokens=40),
        "DeepSeek-V3: latent attention with the query low-rank step (q_a_proj, its norm, "
        "q_b_proj), default RoPE; sigmoid routing chosen by score + e_score_correction_bias "
        "within the best 2 of 4 groups (each scored by its best two), renormalised and scaled "
        "by 2.5; a dense first layer and a shared expert; 40 tokens; every matrix's width a "
        "multiple of 32, so that tandem quantize covers it; a multi-token-prediction layer's "
        "tensors (model.layers.3.*) the engine skips"),
    "gpt_oss_sinks_windows": (
        GPT_OSS,
        "gpt-oss: attention sinks (a learned logit per head in every softmax), q/k/v/o biases, "
        "sliding windows of 7 on layers 0 and 2 and full attention on layer 1, YaRN (factor 4, "
        "not truncated) with its attention factor 1 + 0.1 ln 4 on cos and sin; a router with "
        "bias whose top-4 logits are softmaxed; experts stored stacked as Hugging Face's "
        "GptOssExperts holds them (gate and up in alternate columns, transposed), with biases "
        "and the clamped SwiGLU (gate <= 7, |up| <= 7, (up + 1) g sigmoid(1.702 g)), the gate "
        "weights large enough that the clamp bites"),
    "gpt_oss_mxfp4": (
        GPT_OSS,
        "gpt-oss as published: the experts' matrices stored as MXFP4 (E2M1 nibbles, low "
        "first, with an E8M0 exponent per 32 values: *_blocks and *_scales, quant_method "
        "mxfp4), the reference computing with their exact values"),
    "gemma4_moe": (
        dict(GEMMA4, tokens=300, max_position_embeddings=512),
        "Gemma 4 MoE as published (Gemma4ForConditionalGeneration: text_config, "
        "model.language_model.*, a vision tower's tensors the engine skips): sliding attention "
        "(window 7, head_dim 16, 2 KV heads, default RoPE theta 1e4 over the whole head) on "
        "layers 0 and 2, full attention on 1 and 3 (global_head_dim 32, attention_k_eq_v: one "
        "KV head, no v_proj, the values the raw k_proj output; proportional RoPE theta 1e6 "
        "rotating the first quarter of the pairs, the rest passing through); q/k norms with "
        "weight, v norm without; softmax scale 1; the embedding times sqrt(hidden); plain "
        "(x * w) RMSNorms before and after attention and feed-forward; every layer a dense "
        "GeGLU MLP (gelu tanh, width 80) plus 8 experts (top-3, width 32, stacked "
        "gate_up_proj (E, 2I, H)), routed on the un-normed residual by proj(RMSNorm(x) * scale "
        "/ sqrt(hidden)), softmax, top-3 renormalised then times per_expert_scale; each branch "
        "normed, their sum normed; layer_scalar on each layer's output; tied embeddings; "
        "final_logit_softcapping 3; 300 tokens, past a sliding layer's ring in the engine's "
        "test (its window and a 256-token round: 33 blocks of 8), so the rings wrap"),
    "gemma4_text_moe": (
        dict(GEMMA4, model_type="gemma4_text", num_hidden_layers=3,
             layer_types=["sliding_attention", "sliding_attention", "full_attention"],
             sliding_window=5, num_global_key_value_heads=0, attention_k_eq_v=False,
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                              "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
             final_logit_softcapping=None),
        "Gemma 4 MoE text-only layout (Gemma4ForCausalLM: the config's keys at the top, "
        "model.*): two sliding layers (window 5) then full attention; attention_k_eq_v false, "
        "so every layer has v_proj and the full layer keeps num_key_value_heads (2) with "
        "global_head_dim 32 (twice head_dim); default RoPE (theta 1e6) over the full layer's "
        "whole 32-wide head; no final_logit_softcapping (null); tied embeddings"),
}
TOKENS = 24

# E2M1's sixteen values, by code (Hugging Face's FP4_VALUES).
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4(w):
    """w (..., rows, cols), cols a multiple of 32 -> (blocks (..., rows, cols/32, 16) uint8,
    scales (..., rows, cols/32) uint8, the values they hold): each group of 32 at the power of
    two that brings its largest magnitude within 6, every value the nearest E2M1 one."""
    *prefix, rows, cols = w.shape
    g = w.float().reshape(*prefix, rows, cols // 32, 32)
    top = g.abs().amax(dim=-1, keepdim=True).clamp(min=2.0 ** -100)
    exponent = torch.ceil(torch.log2(top / 6.0)).clamp(-127, 127)
    lut = torch.tensor(FP4_VALUES)
    scaled = g / torch.exp2(exponent)
    codes = (scaled[..., None] - lut).abs().argmin(dim=-1)  # ties: the smaller code
    values = lut[codes] * torch.exp2(exponent)
    codes = codes.to(torch.uint8).reshape(*prefix, rows, cols // 32, 16, 2)
    blocks = codes[..., 0] | (codes[..., 1] << 4)
    scales = (exponent[..., 0] + 127).to(torch.uint8)
    return blocks, scales, values.reshape(w.shape)
SEED = 20261201


def randomise(model, gen):
    """Weights large enough that attention, routing and logits are far from uniform."""
    zero_centred = model.cfg.hybrid  # the weight of x * (1 + w), except the DeltaNet's norm
    gemma4 = model.cfg.gemma4
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("experts.gate_up_proj") and not gemma4:  # past the clamp of 7
                p.copy_(0.6 * torch.randn(p.shape, generator=gen))
            elif name.endswith("norm.weight") and zero_centred and "linear_attn" not in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("conv1d.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith("A_log"):  # decays exp(g) between about 0.2 and 0.9
                p.copy_((0.5 + 0.5 * torch.rand(p.shape, generator=gen)).log())
            elif gemma4 and name.endswith(("layernorm_1.weight", "layernorm_2.weight",
                                           "router.scale", "router.per_expert_scale")):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif gemma4 and name.endswith("layer_scalar"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif gemma4 and name.endswith("embed_tokens.weight"):  # tied logits past the cap
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif gemma4 and name.endswith("router.proj.weight"):  # its input is ~1/sqrt(hidden)
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            p.copy_(p.to(torch.bfloat16).float())  # the reference computes on the bf16 values


@torch.no_grad()
def main():
    torch.set_num_threads(2)
    root = os.path.join("tests", "golden", "arch")
    names = sys.argv[1:] or list(CASES)
    for name in names:
        overrides, covers = CASES[name]
        overrides = dict(overrides)
        tokens = overrides.pop("tokens", TOKENS)
        cfg = Config(**{**BASE, **overrides})
        model = MoeForCausalLM(cfg)
        gen = torch.Generator().manual_seed(SEED)
        randomise(model, gen)
        quantized = {}
        if name == "gpt_oss_mxfp4":  # the reference computes with the values MXFP4 holds
            for l in range(cfg.num_hidden_layers):
                experts = model.model.layers[l].mlp.experts
                for proj in ("gate_up_proj", "down_proj"):
                    p = getattr(experts, proj)
                    blocks, scales, values = mxfp4(p.data.transpose(1, 2))
                    p.data.copy_(values.transpose(1, 2))
                    key = f"model.layers.{l}.mlp.experts.{proj}"
                    quantized[key] = (blocks, scales)
        model.eval()
        ids = torch.randint(0, cfg.vocab_size, (1, tokens), generator=gen)
        trace = []
        logits, _ = model(ids, trace)
        out = os.path.join(root, name)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        tensors = {k: v.to(torch.bfloat16) for k, v in model.export_state_dict().items()}
        for key, (blocks, scales) in quantized.items():
            del tensors[key]
            tensors[key + "_blocks"] = blocks
            tensors[key + "_scales"] = scales
        if name == "qwen3_5_moe_hybrid":
            # As published: the vision tower's and the multi-token-prediction head's tensors,
            # which the engine skips.
            tensors["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3, dtype=torch.bfloat16)
            tensors["mtp.fc.weight"] = torch.zeros(4, 8, dtype=torch.bfloat16)
        if name == "gemma4_moe":  # as published: vision tower tensors, which the engine skips
            tensors["model.vision_tower.patch_embedder.input_proj.weight"] = torch.zeros(
                4, 3, dtype=torch.bfloat16)
            tensors["model.embed_vision.embedding_projection.weight"] = torch.zeros(
                4, 3, dtype=torch.bfloat16)
        if name == "deepseek_v3_sigmoid_groups":
            # As published: a multi-token-prediction layer after the last, which the engine skips.
            mtp = f"model.layers.{cfg.num_hidden_layers}."
            tensors[mtp + "eh_proj.weight"] = torch.zeros(4, 8, dtype=torch.bfloat16)
            tensors[mtp + "shared_head.norm.weight"] = torch.zeros(4, dtype=torch.bfloat16)
        if name == "qwen3_5_moe_text_tied":  # experts stored one tensor each, not stacked
            for l in range(cfg.num_hidden_layers):
                p = f"model.layers.{l}.mlp.experts."
                gate_up, down = tensors.pop(p + "gate_up_proj"), tensors.pop(p + "down_proj")
                for e in range(cfg.num_local_experts):
                    tensors[p + f"{e}.gate_proj.weight"] = gate_up[e, :cfg.moe_intermediate_size]
                    tensors[p + f"{e}.up_proj.weight"] = gate_up[e, cfg.moe_intermediate_size:]
                    tensors[p + f"{e}.down_proj.weight"] = down[e]
        safetensors_io.write(os.path.join(out, "model.safetensors"), tensors, {"format": "pt"})
        hf = cfg.hf_dict()
        if quantized:  # as gpt-oss is published
            hf["quantization_config"] = {
                "quant_method": "mxfp4",
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"]}
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(hf, f, indent=2, sort_keys=True)
        np.save(os.path.join(out, "logits.npy"), logits[0].float().numpy().astype("<f4"))
        experts = torch.stack([c for c, _, _ in trace]).to(torch.int32)
        weights = torch.stack([w for _, w, _ in trace]).float()
        probs = torch.stack([p for _, _, p in trace]).float()
        np.save(os.path.join(out, "experts.npy"), experts.numpy().astype("<i4"))
        np.save(os.path.join(out, "weights.npy"), weights.numpy().astype("<f4"))
        top = torch.topk(probs, cfg.num_experts_per_tok + 1, dim=-1).values
        gap = (top[..., -2] - top[..., -1]).min().item()
        sparse = [l for l in range(cfg.num_hidden_layers) if cfg.is_sparse(l)]
        with open(os.path.join(out, "golden.json"), "w") as f:
            json.dump({"covers": covers, "token_ids": ids[0].tolist(), "sparse_layers": sparse,
                       "min_router_gap": gap, "seed": SEED, "torch_version": torch.__version__,
                       "compute_dtype": "float32", "weights_dtype": "bfloat16"}, f, indent=1)
        print(name, "sparse layers", sparse, "router gap", f"{gap:.2e}",
              "logit std", f"{logits.std().item():.3f}")


if __name__ == "__main__":
    main()
