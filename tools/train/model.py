"""Mixtral, Qwen2-MoE, Qwen3-MoE and DeepSeek-MoE, exactly as Hugging Face's
MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM and DeepseekForCausalLM
(deepseek-ai's modeling_deepseek.py) define them, in plain PyTorch.

One Config carries every architecture's fields; `model_type` picks the layout. Parameter
names follow the Hugging Face checkpoints (Mixtral: model.layers.N.block_sparse_moe.experts.E.w1;
Qwen: model.layers.N.mlp.experts.E.gate_proj, mlp.shared_expert, mlp.shared_expert_gate), so
a state dict exports without renaming. Experts are run per expert on the tokens routed to
them (no dense all-expert compute).

What the Qwen layouts add to Mixtral (Hugging Face's modeling_qwen2_moe.py / modeling_qwen3_moe.py):
  qwen2_moe  q/k/v projections with bias (qkv_bias); a shared expert of width
             shared_expert_intermediate_size added to every token's routed output, scaled by
             sigmoid(shared_expert_gate(x)); norm_topk_prob (default false).
  qwen3_moe  per-head RMSNorm of q and k (q_norm, k_norm, over head_dim) before RoPE;
             explicit head_dim; attention_bias (default false); norm_topk_prob (default false).
  both       routed experts of width moe_intermediate_size; layer i is sparse iff i is not in
             mlp_only_layers and (i + 1) % decoder_sparse_step == 0, else a dense SwiGLU MLP of
             width intermediate_size; tie_word_embeddings.
  qwen3_5_moe (Qwen3.5 / Qwen3.6-MoE, Hugging Face's Qwen3_5MoeForConditionalGeneration text
             part; qwen3_5_moe_text: the text-only layout, Qwen3_5MoeForCausalLM): a hybrid of
             Gated DeltaNet layers (linear attention with a per-sequence recurrent state) and
             gated full attention (layer_types, or every full_attention_interval-th layer);
             zero-centred RMSNorm (x * (1 + w)) everywhere but the DeltaNet's inner norm;
             q_proj emits [q | gate] per head, the attention output scaled by sigmoid(gate);
             q/k norm; partial rotary (partial_rotary_factor of head_dim, rotate_half); every
             layer an MoE with renormalised softmax top-k and a sigmoid-gated shared expert;
             experts stored stacked (mlp.experts.gate_up_proj (E, 2I, H), down_proj (E, H, I)).
  deepseek   n_routed_experts of width moe_intermediate_size; n_shared_experts always-on
             experts as one MLP of width n_shared_experts * moe_intermediate_size
             (mlp.shared_experts), added without a gate; layer i is sparse iff
             i >= first_k_dense_replace and i % moe_layer_freq == 0, else a dense MLP of width
             intermediate_size; softmax top-k, renormalised by norm_topk_prob (default false);
             attention_bias on q, k, v and o (default false).
  deepseek_v2 / deepseek_v3 (Hugging Face's DeepseekV2ForCausalLM / DeepseekV3ForCausalLM):
             DeepSeek's MoE layout with multi-head latent attention: q from q_proj, or
             q_b_proj(RMSNorm(q_a_proj(x))) where q_lora_rank is set, each head [q_nope | q_pe]
             (qk_nope_head_dim, qk_rope_head_dim); kv_a_proj_with_mqa(x) = [c | k_pe], the latent
             c RMS-normed and expanded by kv_b_proj to each head's [k_nope | v]; k_pe one rotary
             key for every head; RoPE on q_pe and k_pe with pairs interleaved (2i, 2i + 1), its
             frequencies YaRN's where rope_scaling says; the softmax scale 1/sqrt(qk_head_dim)
             times YaRN's mscale(factor, mscale_all_dim)^2. Routers: deepseek_v2 softmax, top-k
             greedy or group-limited (groups scored by their best), weights times
             routed_scaling_factor; deepseek_v3 sigmoid, chosen by score + e_score_correction_bias
             within the best topk_group groups (each scored by its best two), weights the chosen
             scores renormalised (norm_topk_prob) and scaled. Layer i sparse iff
             i >= first_k_dense_replace (and i % moe_layer_freq == 0).
  gpt_oss    (Hugging Face's GptOssForCausalLM): q/k/v/o with bias (attention_bias); a learned
             sink logit per head in every softmax (self_attn.sinks, dropped after the softmax);
             sliding windows on the layers layer_types calls sliding_attention; YaRN whose
             attention factor scales cos and sin; a router with bias (mlp.router) whose top-k
             logits are softmaxed; experts stacked as x @ W (mlp.experts.gate_up_proj (E, H, 2I),
             gate and up in alternate columns, down_proj (E, I, H), each with a bias) and the
             clamped SwiGLU (up + 1) * g * sigmoid(1.702 g), gate <= swiglu_limit,
             |up| <= swiglu_limit; every layer sparse.
  gemma4     (Gemma 4's MoE text model, Hugging Face's Gemma4ForConditionalGeneration text part,
             modeling_gemma4.py; gemma4_text: the text-only layout, Gemma4ForCausalLM): the
             embedding times sqrt(hidden_size); plain RMSNorm (x * w) before and after attention
             and the feed-forward; layer_types picks sliding_attention (head_dim,
             num_key_value_heads, a window of sliding_window positions, RoPE "default" over the
             whole head) or full_attention (global_head_dim; with attention_k_eq_v,
             num_global_key_value_heads KV heads and no v_proj, the values the raw k_proj output;
             RoPE "proportional": theta^(-2i/global_head_dim) for the first
             partial_rotary_factor of the pairs, zero for the rest, rotate_half over the whole
             head); q/k norm (with weight) and v norm (without) per head, softmax scale 1; each
             layer a dense GeGLU MLP (gelu tanh, mlp.*) plus routed experts (router.proj on
             RMSNorm(x) * router.scale / sqrt(hidden) of the residual stream, softmax, top-k
             renormalised and times router.per_expert_scale; experts.gate_up_proj (E, 2I, H),
             gate rows first, experts.down_proj (E, H, I)), each normed after, their sum normed
             again; the layer's output times layer_scalar; tied lm_head; the logits soft-capped
             as cap * tanh(logits / cap) (final_logit_softcapping).
"""
import math
from dataclasses import dataclass, asdict, field

import torch
import torch.nn as nn
import torch.nn.functional as F

ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "deepseek": "DeepseekForCausalLM",
                 "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
                 "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
                 "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
                 "gpt_oss": "GptOssForCausalLM",
                 "gemma4": "Gemma4ForConditionalGeneration", "gemma4_text": "Gemma4ForCausalLM"}
DEEPSEEK = ("deepseek", "deepseek_v2", "deepseek_v3")
LATENT = ("deepseek_v2", "deepseek_v3")
HYBRID = ("qwen3_5_moe", "qwen3_5_moe_text")
GEMMA4 = ("gemma4", "gemma4_text")
# Gemma4TextConfig's rope_parameters when the config has none
GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                  "rope_theta": 1000000.0}}


@dataclass
class Config:
    model_type: str = "mixtral"
    vocab_size: int = 8192
    hidden_size: int = 192
    intermediate_size: int = 384  # Mixtral: the experts' width; Qwen: the dense MLP layers'
    num_hidden_layers: int = 6
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    num_local_experts: int = 16  # Mixtral's key; Qwen's is num_experts (see hf_dict)
    num_experts_per_tok: int = 2
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    router_aux_loss_coef: float = 0.02
    bos_token_id: int = 1
    eos_token_id: int = 2
    # Qwen layouts only
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # qwen2_moe; 0: no shared expert
    decoder_sparse_step: int = 1
    mlp_only_layers: list = field(default_factory=list)
    norm_topk_prob: bool = True  # Mixtral always renormalises
    tie_word_embeddings: bool = False
    qkv_bias: bool = True  # qwen2_moe
    attention_bias: bool = False  # qwen3_moe (q, k, v and o)
    head_dim_override: int = 0  # qwen3_moe's explicit head_dim; 0: hidden / heads
    # A sliding window (0: none): every layer's in Mixtral; in the Qwen layouts the layers from
    # max_window_layers on (Hugging Face's use_sliding_window)
    sliding_window: int = 0
    max_window_layers: int = 0
    # qwen3_5_moe only: which layers are Gated DeltaNet ("linear_attention") and which full
    # attention; the DeltaNet's shape; the rotary share of head_dim
    layer_types: list = field(default_factory=list)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    partial_rotary_factor: float = 1.0
    # deepseek only
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    # deepseek_v2 / deepseek_v3: latent attention's shape (q_lora_rank 0: q_proj), YaRN, routing
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_scaling: dict = None
    topk_method: str = "greedy"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    # gpt_oss only: the experts' clamp (swiglu_limit); layer_types says which layers slide
    swiglu_limit: float = 7.0
    # gemma4 only: the full-attention layers' head dim and (with attention_k_eq_v) KV heads,
    # keys as values on those layers, RoPE per layer type, the logits' soft cap (None: none)
    global_head_dim: int = 0
    num_global_key_value_heads: int = 0
    attention_k_eq_v: bool = False
    rope_parameters: dict = None
    final_logit_softcapping: float = None
    dropout: float = 0.0  # training-only residual dropout; not part of the exported architecture

    @property
    def head_dim(self):
        if self.latent:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim_override or self.hidden_size // self.num_attention_heads

    @property
    def latent(self):
        """Multi-head latent attention (deepseek_v2, deepseek_v3)."""
        return self.model_type in LATENT

    @property
    def qwen(self):
        return self.model_type in ("qwen2_moe", "qwen3_moe")

    @property
    def hybrid(self):
        return self.model_type in HYBRID

    @property
    def gemma4(self):
        return self.model_type in GEMMA4

    @property
    def gemma4_rope(self):
        """gemma4's rope_parameters, per layer type."""
        return self.rope_parameters or GEMMA4_ROPE

    def layer_head_dim(self, layer):
        """gemma4: global_head_dim on full-attention layers (where set), else head_dim."""
        if self.gemma4 and self.layer_types[layer] != "sliding_attention" and self.global_head_dim:
            return self.global_head_dim
        return self.head_dim

    def keys_are_values(self, layer):
        """gemma4 with attention_k_eq_v: a full-attention layer has no v_proj."""
        return (self.gemma4 and self.attention_k_eq_v
                and self.layer_types[layer] != "sliding_attention")

    def layer_kv_heads(self, layer):
        """gemma4: num_global_key_value_heads where keys are values (and it is set)."""
        if self.keys_are_values(layer) and self.num_global_key_value_heads:
            return self.num_global_key_value_heads
        return self.num_key_value_heads

    @property
    def rotary_dim(self):
        if self.latent:
            return self.qk_rope_head_dim
        return int(self.head_dim * self.partial_rotary_factor)

    def window(self, layer):
        """Layer `layer`'s sliding window: it attends to its last `window` positions (0: all)."""
        if not self.sliding_window:
            return 0
        if self.model_type == "mixtral":
            return self.sliding_window
        if self.model_type == "gpt_oss" or self.gemma4:
            return self.sliding_window if self.layer_types[layer] == "sliding_attention" else 0
        if self.qwen and layer >= self.max_window_layers:
            return self.sliding_window
        return 0

    def is_linear(self, layer):
        """Whether layer `layer` is a Gated DeltaNet (qwen3_5_moe's linear_attention)."""
        return self.hybrid and self.layer_types[layer] == "linear_attention"

    @property
    def mlp_layout(self):
        """Experts named mlp.experts.E.gate_proj, of width moe_intermediate_size, and dense
        layers of width intermediate_size (every layout but Mixtral's)."""
        return self.model_type != "mixtral"

    @property
    def expert_size(self):
        if self.model_type == "gpt_oss":
            return self.intermediate_size
        return self.moe_intermediate_size if self.mlp_layout else self.intermediate_size

    @property
    def shared_size(self):
        """The always-on shared expert's width (0: none)."""
        if self.model_type in DEEPSEEK:
            return self.n_shared_experts * self.moe_intermediate_size
        return self.shared_expert_intermediate_size

    @property
    def attention_biases(self):
        """(q/k/v have bias, o has bias)."""
        if self.model_type == "qwen2_moe":
            return self.qkv_bias, False
        if self.model_type in ("qwen3_moe", "deepseek", "gpt_oss") or self.hybrid:
            return self.attention_bias, self.attention_bias
        return False, False

    def is_sparse(self, layer):
        if self.model_type in DEEPSEEK:
            return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0
        if not self.qwen:
            return True  # Mixtral, qwen3_5_moe, gpt_oss
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    def hf_dict(self):
        """config.json as Hugging Face writes it for this architecture."""
        d = {
            "architectures": [ARCHITECTURES[self.model_type]], "model_type": self.model_type,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "num_experts_per_tok": self.num_experts_per_tok,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta, "rms_norm_eps": self.rms_norm_eps,
            "router_aux_loss_coef": self.router_aux_loss_coef,
            "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
            "hidden_act": "silu", "attention_dropout": 0.0, "initializer_range": 0.02,
            "output_router_logits": False, "sliding_window": None,
            "tie_word_embeddings": self.tie_word_embeddings, "torch_dtype": "bfloat16",
            "use_cache": True, "head_dim": self.head_dim,
        }
        if self.hybrid:
            return self._hybrid_hf_dict(d)
        if self.gemma4:
            return self._gemma4_hf_dict()
        if self.model_type == "mixtral":
            d["num_local_experts"] = self.num_local_experts
            if self.sliding_window:
                d["sliding_window"] = self.sliding_window
        elif self.model_type == "gpt_oss":
            d.update({"num_local_experts": self.num_local_experts,
                      "experts_per_token": self.num_experts_per_tok,
                      "layer_types": list(self.layer_types),
                      "sliding_window": self.sliding_window, "attention_bias": self.attention_bias,
                      "swiglu_limit": self.swiglu_limit, "rope_scaling": self.rope_scaling,
                      "initial_context_length": self.max_position_embeddings,
                      "pad_token_id": self.vocab_size - 1})
        elif self.model_type == "deepseek":
            d.update({"n_routed_experts": self.num_local_experts,
                      "n_shared_experts": self.n_shared_experts,
                      "moe_intermediate_size": self.moe_intermediate_size,
                      "first_k_dense_replace": self.first_k_dense_replace,
                      "moe_layer_freq": self.moe_layer_freq,
                      "norm_topk_prob": self.norm_topk_prob, "scoring_func": "softmax",
                      "attention_bias": self.attention_bias, "aux_loss_alpha": 0.001,
                      "seq_aux": True, "pretraining_tp": 1, "rope_scaling": None})
            del d["router_aux_loss_coef"], d["sliding_window"], d["head_dim"]
        elif self.latent:
            d.update({"n_routed_experts": self.num_local_experts,
                      "n_shared_experts": self.n_shared_experts,
                      "moe_intermediate_size": self.moe_intermediate_size,
                      "first_k_dense_replace": self.first_k_dense_replace,
                      "moe_layer_freq": self.moe_layer_freq,
                      "norm_topk_prob": self.norm_topk_prob,
                      "q_lora_rank": self.q_lora_rank or None,
                      "kv_lora_rank": self.kv_lora_rank,
                      "qk_nope_head_dim": self.qk_nope_head_dim,
                      "qk_rope_head_dim": self.qk_rope_head_dim,
                      "v_head_dim": self.v_head_dim, "rope_scaling": self.rope_scaling,
                      "topk_method": self.topk_method, "n_group": self.n_group,
                      "topk_group": self.topk_group,
                      "routed_scaling_factor": self.routed_scaling_factor,
                      "scoring_func": "sigmoid" if self.model_type == "deepseek_v3" else "softmax",
                      "attention_bias": False, "aux_loss_alpha": 0.001})
            if self.model_type == "deepseek_v3":
                d["rope_interleave"] = True
            del d["router_aux_loss_coef"], d["sliding_window"], d["head_dim"]
        else:
            d.update({"num_experts": self.num_local_experts,
                      "moe_intermediate_size": self.moe_intermediate_size,
                      "decoder_sparse_step": self.decoder_sparse_step,
                      "mlp_only_layers": list(self.mlp_only_layers),
                      "norm_topk_prob": self.norm_topk_prob,
                      "use_sliding_window": bool(self.sliding_window),
                      "max_window_layers": (self.max_window_layers if self.sliding_window
                                            else self.num_hidden_layers)})
            if self.sliding_window:
                d["sliding_window"] = self.sliding_window
        if self.model_type == "qwen2_moe":
            d["shared_expert_intermediate_size"] = self.shared_expert_intermediate_size
            d["qkv_bias"] = self.qkv_bias
        if self.model_type == "qwen3_moe":
            d["attention_bias"] = self.attention_bias
        return d

    def _hybrid_hf_dict(self, d):
        """qwen3_5_moe's config.json: the text model's keys nested in text_config (the
        published layout) or at the top (qwen3_5_moe_text)."""
        for key in ("intermediate_size", "sliding_window", "rope_theta", "torch_dtype",
                    "architectures", "model_type", "tie_word_embeddings", "bos_token_id"):
            d.pop(key)
        d.update({"model_type": "qwen3_5_moe_text", "num_experts": self.num_local_experts,
                  "moe_intermediate_size": self.moe_intermediate_size,
                  "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
                  "layer_types": list(self.layer_types),
                  "linear_num_key_heads": self.linear_num_key_heads,
                  "linear_num_value_heads": self.linear_num_value_heads,
                  "linear_key_head_dim": self.linear_key_head_dim,
                  "linear_value_head_dim": self.linear_value_head_dim,
                  "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
                  "attention_bias": self.attention_bias, "attn_output_gate": True,
                  "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 0,
                  "partial_rotary_factor": self.partial_rotary_factor,
                  "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta,
                                      "partial_rotary_factor": self.partial_rotary_factor,
                                      "mrope_interleaved": True,
                                      "mrope_section": self._mrope_section()},
                  "dtype": "bfloat16"})
        top = {"architectures": [ARCHITECTURES[self.model_type]],
               "tie_word_embeddings": self.tie_word_embeddings}
        if self.model_type == "qwen3_5_moe_text":
            return {**d, **top}
        return {**top, "model_type": "qwen3_5_moe", "text_config": d,
                "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 1},
                "image_token_id": self.vocab_size - 1}

    def _gemma4_hf_dict(self):
        """gemma4's config.json: the text model's keys in text_config (the published layout,
        Gemma4ForConditionalGeneration) or at the top (gemma4_text, Gemma4ForCausalLM)."""
        t = {"model_type": "gemma4_text", "vocab_size": self.vocab_size,
             "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
             "moe_intermediate_size": self.moe_intermediate_size,
             "num_experts": self.num_local_experts, "top_k_experts": self.num_experts_per_tok,
             "enable_moe_block": True, "num_hidden_layers": self.num_hidden_layers,
             "num_attention_heads": self.num_attention_heads,
             "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
             "global_head_dim": self.global_head_dim or self.head_dim,
             "attention_k_eq_v": self.attention_k_eq_v, "layer_types": list(self.layer_types),
             "sliding_window": self.sliding_window, "rope_parameters": self.gemma4_rope,
             "final_logit_softcapping": self.final_logit_softcapping,
             "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": self.rms_norm_eps,
             "max_position_embeddings": self.max_position_embeddings,
             "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": self.vocab_size,
             "num_kv_shared_layers": 0, "use_double_wide_mlp": False,
             "use_bidirectional_attention": None, "attention_bias": False,
             "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
             "tie_word_embeddings": self.tie_word_embeddings,
             "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
             "pad_token_id": 0, "dtype": "bfloat16"}
        if self.num_global_key_value_heads:
            t["num_global_key_value_heads"] = self.num_global_key_value_heads
        top = {"architectures": [ARCHITECTURES[self.model_type]],
               "tie_word_embeddings": self.tie_word_embeddings}
        if self.model_type == "gemma4_text":
            return {**t, **top}
        return {**top, "model_type": "gemma4", "text_config": t,
                "vision_config": {"model_type": "gemma4_vision"}, "audio_config": None}

    def checkpoint_name(self, name):
        """A parameter's name in the checkpoint (the published qwen3_5_moe and gemma4 layouts
        keep the text model under model.language_model.); module_name is the inverse."""
        if self.model_type in ("qwen3_5_moe", "gemma4") and name.startswith("model."):
            return "model.language_model." + name[len("model."):]
        return name

    def module_name(self, name):
        prefix = "model.language_model."
        if self.model_type in ("qwen3_5_moe", "gemma4") and name.startswith(prefix):
            return "model." + name[len(prefix):]
        return name

    def _mrope_section(self):
        """The published split of the rotary pairs over (text, height, width) positions,
        [11, 11, 10] of 32, scaled to this rotary width (a text model uses only the first)."""
        half = self.rotary_dim // 2
        width = half // 3
        height = (half - width) // 2
        return [half - height - width, height, width]

    @staticmethod
    def from_hf(d):
        """The inverse of hf_dict, with Hugging Face's defaults for absent keys."""
        mt = d["model_type"]
        if mt in HYBRID:
            t = d.get("text_config", d)
            rope = t.get("rope_parameters") or {}
            return Config(
                model_type=mt, vocab_size=t["vocab_size"], hidden_size=t["hidden_size"],
                num_hidden_layers=t["num_hidden_layers"],
                num_attention_heads=t["num_attention_heads"],
                num_key_value_heads=t["num_key_value_heads"],
                num_local_experts=t["num_experts"], num_experts_per_tok=t["num_experts_per_tok"],
                max_position_embeddings=t.get("max_position_embeddings", 32768),
                rope_theta=rope.get("rope_theta", t.get("rope_theta", 10000.0)),
                rms_norm_eps=t.get("rms_norm_eps", 1e-6),
                eos_token_id=t.get("eos_token_id", 2),
                moe_intermediate_size=t["moe_intermediate_size"],
                shared_expert_intermediate_size=t["shared_expert_intermediate_size"],
                tie_word_embeddings=d.get("tie_word_embeddings", False),
                attention_bias=t.get("attention_bias", False),
                head_dim_override=t.get("head_dim", 256),
                layer_types=list(t["layer_types"]),
                linear_num_key_heads=t["linear_num_key_heads"],
                linear_num_value_heads=t["linear_num_value_heads"],
                linear_key_head_dim=t["linear_key_head_dim"],
                linear_value_head_dim=t["linear_value_head_dim"],
                linear_conv_kernel_dim=t.get("linear_conv_kernel_dim", 4),
                partial_rotary_factor=rope.get("partial_rotary_factor",
                                               t.get("partial_rotary_factor", 0.25)),
                norm_topk_prob=True)
        if mt in GEMMA4:
            return Config._gemma4_from_hf(d)
        if mt not in ARCHITECTURES:
            raise ValueError(f"unsupported model_type {mt}")
        qwen = mt in ("qwen2_moe", "qwen3_moe")
        heads = d["num_attention_heads"]
        if mt in DEEPSEEK:
            common = dict(
                model_type=mt, vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
                intermediate_size=d["intermediate_size"],
                num_hidden_layers=d["num_hidden_layers"], num_attention_heads=heads,
                num_key_value_heads=d.get("num_key_value_heads") or heads,
                num_local_experts=d["n_routed_experts"],
                num_experts_per_tok=d["num_experts_per_tok"],
                max_position_embeddings=d.get("max_position_embeddings", 2048),
                rope_theta=d.get("rope_theta", 10000.0), rms_norm_eps=d.get("rms_norm_eps", 1e-6),
                router_aux_loss_coef=d.get("aux_loss_alpha", 0.001),
                bos_token_id=d.get("bos_token_id", 100000),
                eos_token_id=d.get("eos_token_id", 100001),
                moe_intermediate_size=d["moe_intermediate_size"],
                n_shared_experts=d.get("n_shared_experts") or 0,
                first_k_dense_replace=d.get("first_k_dense_replace", 0),
                moe_layer_freq=d.get("moe_layer_freq", 1),
                norm_topk_prob=d.get("norm_topk_prob", mt == "deepseek_v3"),
                tie_word_embeddings=d.get("tie_word_embeddings", False))
            if mt == "deepseek":
                return Config(**common, attention_bias=d.get("attention_bias", False))
            return Config(
                **common, q_lora_rank=d.get("q_lora_rank") or 0, kv_lora_rank=d["kv_lora_rank"],
                qk_nope_head_dim=d["qk_nope_head_dim"], qk_rope_head_dim=d["qk_rope_head_dim"],
                v_head_dim=d["v_head_dim"], rope_scaling=d.get("rope_scaling"),
                topk_method=d.get("topk_method", "greedy"), n_group=d.get("n_group") or 1,
                topk_group=d.get("topk_group") or 1,
                routed_scaling_factor=d.get("routed_scaling_factor", 1.0))
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        if mt == "gpt_oss":
            return Config(
                model_type=mt, vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
                intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
                num_attention_heads=heads, num_key_value_heads=d["num_key_value_heads"],
                num_local_experts=d["num_local_experts"],
                num_experts_per_tok=d["num_experts_per_tok"],
                max_position_embeddings=d.get("max_position_embeddings", 131072),
                rope_theta=d.get("rope_theta", 150000.0), rms_norm_eps=d.get("rms_norm_eps", 1e-5),
                router_aux_loss_coef=d.get("router_aux_loss_coef", 0.9),
                bos_token_id=d.get("bos_token_id", 1), eos_token_id=d.get("eos_token_id", 2),
                tie_word_embeddings=d.get("tie_word_embeddings", False),
                attention_bias=d.get("attention_bias", True),
                head_dim_override=head_dim if head_dim != d["hidden_size"] // heads else 0,
                layer_types=list(d["layer_types"]), sliding_window=d.get("sliding_window") or 0,
                swiglu_limit=d.get("swiglu_limit", 7.0), rope_scaling=d.get("rope_scaling"))
        return Config(
            model_type=mt, vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            num_local_experts=d["num_experts" if qwen else "num_local_experts"],
            num_experts_per_tok=d["num_experts_per_tok"],
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            rope_theta=d.get("rope_theta", 10000.0 if qwen else 1e6),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6 if qwen else 1e-5),
            router_aux_loss_coef=d.get("router_aux_loss_coef", 0.001 if qwen else 0.02),
            bos_token_id=d.get("bos_token_id", 1), eos_token_id=d.get("eos_token_id", 2),
            moe_intermediate_size=d.get("moe_intermediate_size", 0) if qwen else 0,
            shared_expert_intermediate_size=(d.get("shared_expert_intermediate_size", 0)
                                             if mt == "qwen2_moe" else 0),
            decoder_sparse_step=d.get("decoder_sparse_step", 1),
            mlp_only_layers=list(d.get("mlp_only_layers") or []),
            norm_topk_prob=d.get("norm_topk_prob", False) if qwen else True,
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            qkv_bias=d.get("qkv_bias", True), attention_bias=d.get("attention_bias", False),
            head_dim_override=head_dim if head_dim != d["hidden_size"] // heads else 0,
            sliding_window=((d.get("sliding_window") or 0)
                            if d.get("use_sliding_window", not qwen) else 0),
            max_window_layers=d.get("max_window_layers", 28) if qwen else 0)


    @staticmethod
    def _gemma4_from_hf(d):
        """gemma4 / gemma4_text, with Gemma4TextConfig's defaults (layer_types: every sixth
        layer full attention; the last always full). The options the reference does not
        implement are refused."""
        t = d.get("text_config", d)
        refused = {"hidden_size_per_layer_input": t.get("hidden_size_per_layer_input", 256),
                   "num_kv_shared_layers": t.get("num_kv_shared_layers", 0),
                   # "vision" (as published): text tokens attend causally
                   "use_bidirectional_attention": (t.get("use_bidirectional_attention")
                                                   not in (None, "vision")),
                   "attention_bias": t.get("attention_bias", False),
                   "enable_moe_block": not t.get("enable_moe_block", False)}
        for key, value in refused.items():
            if value:
                raise ValueError(f"gemma4: {key} {t.get(key)} is not supported")
        if t.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ValueError(f"gemma4: hidden_activation {t['hidden_activation']}")
        n = t.get("num_hidden_layers", 30)
        layer_types = list(t.get("layer_types") or
                           ["sliding_attention" if (i + 1) % 6 else "full_attention"
                            for i in range(n)])
        if layer_types:
            layer_types[-1] = "full_attention"
        k_eq_v = t.get("attention_k_eq_v", False)
        return Config(
            model_type=d["model_type"], vocab_size=t.get("vocab_size", 262144),
            hidden_size=t.get("hidden_size", 2304), intermediate_size=t.get("intermediate_size", 9216),
            num_hidden_layers=n, num_attention_heads=t.get("num_attention_heads", 8),
            num_key_value_heads=t.get("num_key_value_heads", 4),
            num_local_experts=t["num_experts"], num_experts_per_tok=t["top_k_experts"],
            moe_intermediate_size=t["moe_intermediate_size"],
            max_position_embeddings=t.get("max_position_embeddings", 131072),
            rms_norm_eps=t.get("rms_norm_eps", 1e-6), bos_token_id=t.get("bos_token_id", 2),
            eos_token_id=t.get("eos_token_id", 1),
            tie_word_embeddings=d.get("tie_word_embeddings", True), attention_bias=False,
            head_dim_override=t.get("head_dim", 256), layer_types=layer_types,
            sliding_window=t.get("sliding_window", 512),
            global_head_dim=t.get("global_head_dim", 512),
            num_global_key_value_heads=(t.get("num_global_key_value_heads") or 0) if k_eq_v else 0,
            attention_k_eq_v=k_eq_v, rope_parameters=t.get("rope_parameters") or None,
            final_logit_softcapping=t.get("final_logit_softcapping"), norm_topk_prob=True)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class ZeroCenteredRMSNorm(nn.Module):
    """qwen3_5_moe's RMSNorm: x * (1 + w), the weight stored centred on zero."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class Gemma4RMSNorm(nn.Module):
    """Gemma 4's RMSNorm: x * (mean(x^2) + eps)^-0.5 * w (plain w, unlike Gemma 3's 1 + w);
    with_scale=False: no weight (the v norm, the router's norm)."""

    def __init__(self, dim, eps, with_scale=True):
        super().__init__()
        self.eps = eps
        if with_scale:
            self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        out = x.float()
        out = out * torch.pow(out.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if hasattr(self, "weight"):
            out = out * self.weight.float()
        return out.type_as(x)


def make_norm(cfg, dim):
    if cfg.gemma4:
        return Gemma4RMSNorm(dim, cfg.rms_norm_eps)
    return (ZeroCenteredRMSNorm if cfg.hybrid else RMSNorm)(dim, cfg.rms_norm_eps)


def rope_inv_freq(cfg, dim):
    """RoPE's frequencies over `dim` rotary dimensions: theta^(-2i/dim), or YaRN's blend of those
    and those divided by its factor (Hugging Face's _compute_yarn_parameters)."""
    pos_freqs = cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    scaling = cfg.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0 / pos_freqs
    factor = scaling["factor"]
    original = scaling.get("original_max_position_embeddings") or cfg.max_position_embeddings

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(cfg.rope_theta))

    low, high = correction_dim(scaling.get("beta_fast") or 32), correction_dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def yarn_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(cfg):
    """YaRN's scale of cos and sin (Hugging Face's _compute_yarn_parameters): attention_factor,
    else mscale(factor, mscale) / mscale(factor, mscale_all_dim) where both are given, else
    mscale(factor); 1 without YaRN."""
    scaling = cfg.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return scaling["attention_factor"]
    factor, mscale, mscale_all_dim = (scaling["factor"], scaling.get("mscale"),
                                      scaling.get("mscale_all_dim"))
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor, 1)


def rope_cos_sin(cfg, positions, dtype):
    """cos, sin (t, rotary_dim): RoPE over the first rotary_dim of a head (all of it but in
    qwen3_5_moe, whose partial_rotary_factor rotates a quarter, and in latent attention, whose
    rotary part is qk_rope_head_dim)."""
    dim = cfg.rotary_dim if (cfg.hybrid or cfg.latent) else cfg.head_dim
    inv_freq = rope_inv_freq(cfg, dim)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    a = yarn_attention_factor(cfg)
    return (emb.cos() * a).to(dtype), (emb.sin() * a).to(dtype)


def gemma4_cos_sin(cfg, layer, positions, dtype):
    """cos, sin (t, layer head dim) of gemma4's layer `layer` (Hugging Face's
    Gemma4TextRotaryEmbedding): rope_parameters[layer type]; "default": theta^(-2i/dim) over
    the layer's whole head; "proportional": those of the first int(partial_rotary_factor * dim
    // 2) pairs, zero for the others (which then pass through), divided by factor."""
    params = cfg.gemma4_rope[cfg.layer_types[layer]]
    dim = cfg.layer_head_dim(layer)
    base = params["rope_theta"]
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    elif rope_type == "proportional":
        angles = int(params.get("partial_rotary_factor", 1.0) * dim // 2)
        inv_freq = 1.0 / (base ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / dim))
        inv_freq = torch.cat([inv_freq, torch.zeros(dim // 2 - angles)])
        inv_freq = inv_freq / params.get("factor", 1.0)
    else:
        raise ValueError(f"gemma4: rope_type {rope_type} is not supported")
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def causal_attention(cfg, q, k, v, window=0, sinks=None):
    """q (b, heads, t, head_dim), k and v (b, kv heads, t, head_dim) after RoPE -> the causal
    attention output (b, t, heads * head_dim), KV heads shared by heads / kv heads queries; with
    a sliding window each query attends to its last `window` positions (its own included); with
    sinks (heads,), each head's softmax has one more logit, its sink, whose share of the mass is
    dropped (gpt-oss, as Hugging Face's eager_attention_forward)."""
    b, _, t, _ = q.shape
    rep = cfg.num_attention_heads // cfg.num_key_value_heads
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    scores = (q * (1.0 / math.sqrt(cfg.head_dim))) @ k.transpose(-2, -1).contiguous()
    causal = torch.ones(t, t, dtype=torch.bool).triu(1)
    if window:
        causal = causal | torch.ones(t, t, dtype=torch.bool).tril(-window)
    scores = scores.masked_fill(causal, float("-inf"))
    if sinks is not None:
        sink = sinks.reshape(1, -1, 1, 1).expand(b, -1, t, 1)
        logits = torch.cat([scores, sink.to(scores.dtype)], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        y = torch.softmax(logits.float(), dim=-1)[..., :-1].to(v.dtype) @ v
    else:
        y = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
    return y.transpose(1, 2).reshape(b, t, -1)


class Attention(nn.Module):
    def __init__(self, cfg, layer=0):
        super().__init__()
        self.cfg = cfg
        self.window = cfg.window(layer)
        hd = cfg.head_dim
        qkv_bias, o_bias = cfg.attention_biases
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * hd, bias=qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=qkv_bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=o_bias)
        if cfg.model_type == "qwen3_moe":
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        if cfg.model_type == "gpt_oss":
            self.sinks = nn.Parameter(torch.zeros(cfg.num_attention_heads))

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim)
        if c.model_type == "qwen3_moe":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return self.o_proj(causal_attention(c, q, k, v, self.window,
                                            getattr(self, "sinks", None)))


class Gemma4Attention(nn.Module):
    """Gemma 4's attention (Hugging Face's Gemma4TextAttention): the layer's head dim and KV
    heads (Config.layer_head_dim, layer_kv_heads); q = RoPE(q_norm(q)), k = RoPE(k_norm(k)),
    v = v_norm(v) (no weight), v the raw k_proj output where keys are values (no v_proj);
    softmax scale 1; a sliding window on sliding_attention layers."""

    def __init__(self, cfg, layer):
        super().__init__()
        self.cfg = cfg
        self.window = cfg.window(layer)
        self.head_dim = hd = cfg.layer_head_dim(layer)
        self.kv_heads = cfg.layer_kv_heads(layer)
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * hd, bias=False)
        self.q_norm = Gemma4RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = Gemma4RMSNorm(hd, cfg.rms_norm_eps)
        self.v_norm = Gemma4RMSNorm(hd, cfg.rms_norm_eps, with_scale=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * hd, bias=False)
        if not cfg.keys_are_values(layer):
            self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        hd, heads = self.head_dim, self.cfg.num_attention_heads
        q = self.q_norm(self.q_proj(x).view(b, t, heads, hd)).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, hd)
        v = self.v_proj(x).view(b, t, self.kv_heads, hd) if hasattr(self, "v_proj") else k
        k = self.k_norm(k).transpose(1, 2)
        v = self.v_norm(v).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = q @ k.transpose(-2, -1)  # scaling 1.0
        masked = torch.ones(t, t, dtype=torch.bool).triu(1)
        if self.window:  # a query sees itself and the window - 1 positions before it
            masked = masked | torch.ones(t, t, dtype=torch.bool).tril(-self.window)
        scores = scores.masked_fill(masked, float("-inf"))
        y = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, heads * hd))


def rope_interleaved(x, cos, sin):
    """RoPE with pairs (2i, 2i + 1) (DeepSeek's complex form; Hugging Face's
    apply_rotary_pos_emb_interleave, whose output is the same values de-interleaved)."""
    b, h, t, d = x.shape
    x = x.view(b, h, t, d // 2, 2).transpose(4, 3).reshape(b, h, t, d)
    y = x * cos + rotate_half(x) * sin
    return y.view(b, h, t, 2, d // 2).transpose(4, 3).reshape(b, h, t, d)


class LatentAttention(nn.Module):
    """Multi-head latent attention as Hugging Face's DeepseekV2Attention / DeepseekV3Attention
    compute it (each head's keys and values made from the latent), with the softmax scale of
    DeepSeek's own code (times YaRN's mscale_all_dim factor squared)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.num_attention_heads, cfg.hidden_size
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if cfg.q_lora_rank:
            self.q_a_proj = nn.Linear(d, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, h * qk, bias=False)
        else:
            self.q_proj = nn.Linear(d, h * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, h * (cfg.qk_nope_head_dim + cfg.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(h * cfg.v_head_dim, d, bias=False)
        self.scale = qk ** -0.5
        scaling = cfg.rope_scaling or {}
        if scaling.get("mscale_all_dim"):
            self.scale *= yarn_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        c = self.cfg
        h, nope, rope, vd = (c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim,
                             c.v_head_dim)
        if c.q_lora_rank:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = q.view(b, t, h, nope + rope).transpose(1, 2)
        q_nope, q_pe = q.split([nope, rope], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, t, h, nope + vd).transpose(1, 2)
        k_nope, v = kv.split([nope, vd], dim=-1)
        k_pe = k_pe.view(b, 1, t, rope)
        q_pe, k_pe = rope_interleaved(q_pe, cos, sin), rope_interleaved(k_pe, cos, sin)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(b, h, t, rope)], dim=-1)
        scores = (q @ k.transpose(-2, -1)) * self.scale
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        y = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, h * vd))


class GatedAttention(nn.Module):
    """qwen3_5_moe's full attention: q_proj emits [q | gate] per head; zero-centred q/k norms;
    RoPE over the first rotary_dim of each head; the output scaled by sigmoid(gate)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hd, bias = cfg.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * hd * 2, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=bias)
        self.q_norm = ZeroCenteredRMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(hd, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        c = self.cfg
        q, gate = torch.chunk(self.q_proj(x).view(b, t, c.num_attention_heads, 2 * c.head_dim), 2,
                              dim=-1)
        gate = gate.reshape(b, t, -1)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        r = c.rotary_dim
        q = torch.cat([q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]], dim=-1)
        k = torch.cat([k[..., :r] * cos + rotate_half(k[..., :r]) * sin, k[..., r:]], dim=-1)
        return self.o_proj(causal_attention(c, q, k, v) * torch.sigmoid(gate))


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_recurrent(q, k, v, g, beta, state=None):
    """The gated delta rule one token at a time, in float32. q, k (b, t, heads, dk) already
    L2-normalised, v (b, t, heads, dv), g and beta (b, t, heads); state (b, heads, dk, dv).
    Returns the outputs (b, t, heads, dv) and the final state."""
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    q = q.float() / math.sqrt(dk)
    k, v, g, beta = k.float(), v.float(), g.float(), beta.float()
    s = torch.zeros(b, h, dk, dv) if state is None else state.float()
    out = torch.zeros(b, t, h, dv)
    for i in range(t):
        s = s * g[:, i].exp()[..., None, None]
        kv_mem = (s * k[:, i, :, :, None]).sum(dim=-2)
        delta = (v[:, i] - kv_mem) * beta[:, i, :, None]
        s = s + k[:, i, :, :, None] * delta[:, :, None, :]
        out[:, i] = (s * q[:, i, :, :, None]).sum(dim=-2)
    return out, s


def gated_delta_chunked(q, k, v, g, beta, state=None, chunk=64):
    """The same rule in chunks of `chunk` tokens (the WY / UT form: a chunk is matrix products
    and one triangular solve), as Hugging Face's torch_chunk_gated_delta_rule computes it."""
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    q = q.float().transpose(1, 2) / math.sqrt(dk)
    k, v = k.float().transpose(1, 2), v.float().transpose(1, 2)
    g, beta = g.float().transpose(1, 2), beta.float().transpose(1, 2)
    pad = (chunk - t % chunk) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t + pad) // chunk
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(b, h, n, chunk).cumsum(dim=-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(upper, float("-inf")).exp()
    system = (k_beta @ k.transpose(-1, -2)) * decay
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * g.exp()[..., None], upper=False,
                                      unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * decay
    s = torch.zeros(b, h, dk, dv) if state is None else state.float()
    out = torch.zeros(b, h, n, chunk, dv)
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ s
        out[:, :, i] = (q[:, :, i] * g[:, :, i, :, None].exp()) @ s + intra[:, :, i] @ v_new
        tail = (g[:, :, i, -1:] - g[:, :, i]).exp()[..., None]
        s = s * g[:, :, i, -1].exp()[..., None, None] + (k[:, :, i] * tail).transpose(-1, -2) @ v_new
    out = out.reshape(b, h, -1, dv)[:, :, :t].transpose(1, 2)
    return out, s


class GatedDeltaNet(nn.Module):
    """qwen3_5_moe's linear attention (Hugging Face's Qwen3_5MoeGatedDeltaNet): a causal
    depthwise conv (kernel linear_conv_kernel_dim, SiLU) over [Q | K | V]; q and k L2-normed
    per head; beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias); each key head
    serves linear_num_value_heads / linear_num_key_heads consecutive value heads; the output
    out_proj(norm(o) * silu(z)) with a plain (not zero-centred) RMSNorm per value head."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.key_dim = nk * cfg.linear_key_head_dim
        self.value_dim = nv * cfg.linear_value_head_dim
        conv_dim = 2 * self.key_dim + self.value_dim
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, cfg.linear_conv_kernel_dim, groups=conv_dim,
                                bias=False, padding=cfg.linear_conv_kernel_dim - 1)
        self.dt_bias = nn.Parameter(torch.ones(nv))
        self.A_log = nn.Parameter(torch.log(torch.empty(nv).uniform_(1, 16)))
        self.norm = RMSNorm(cfg.linear_value_head_dim, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, cfg.hidden_size, bias=False)
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, nv, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, nv, bias=False)

    def forward(self, x, chunked=None):
        """chunked: the chunked form (default while training: a 512-token window is then
        matrix products, not a token loop) or one token at a time (the default in eval mode,
        the reference the engine's logits are checked against)."""
        if chunked is None:
            chunked = self.training
        b, t, _ = x.shape
        c = self.cfg
        mixed = F.silu(self.conv1d(self.in_proj_qkv(x).transpose(1, 2))[:, :, :t]).transpose(1, 2)
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2norm(q.reshape(b, t, -1, c.linear_key_head_dim).float())
        k = l2norm(k.reshape(b, t, -1, c.linear_key_head_dim).float())
        v = v.reshape(b, t, -1, c.linear_value_head_dim)
        rep = c.linear_num_value_heads // c.linear_num_key_heads
        q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
        beta = torch.sigmoid(self.in_proj_b(x))
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        o, _ = (gated_delta_chunked if chunked else gated_delta_recurrent)(q, k, v, g, beta)
        z = self.in_proj_z(x).reshape(b, t, -1, c.linear_value_head_dim)
        o = self.norm(o.to(x.dtype)) * F.silu(z.float()).to(x.dtype)
        return self.out_proj(o.reshape(b, t, -1))


def routed_sum(x, chosen, weights, num_experts, expert):
    """x (tokens, hidden), chosen and weights (tokens, k): sum over each token's experts of
    weight * expert(e, its rows), the (token, slot) pairs grouped by expert once (experts in
    index order) rather than scanned per expert."""
    out = torch.zeros_like(x)
    k = chosen.shape[-1]
    flat_chosen = chosen.reshape(-1)
    order = torch.argsort(flat_chosen, stable=True)
    counts = torch.bincount(flat_chosen, minlength=num_experts).tolist()
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        idx = order[start:start + n]
        start += n
        tok = idx // k
        y = expert(e, x[tok]) * weights.reshape(-1)[idx, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


class Expert(nn.Module):
    """Mixtral's expert: w1 (gate), w3 (up), w2 (down)."""

    def __init__(self, hidden, width):
        super().__init__()
        self.w1 = nn.Linear(hidden, width, bias=False)
        self.w3 = nn.Linear(hidden, width, bias=False)
        self.w2 = nn.Linear(width, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Mlp(nn.Module):
    """Qwen's SwiGLU MLP (routed expert, shared expert or dense layer)."""

    def __init__(self, hidden, width):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class GptOssExperts(nn.Module):
    """gpt-oss's experts as Hugging Face's GptOssExperts stores and runs them: gate_up_proj
    (experts, hidden, 2 * width) with gate and up in alternate columns, down_proj (experts,
    width, hidden), each with a bias; the clamped SwiGLU (up + 1) * g * sigmoid(1.702 g), g the
    gate clamped to at most swiglu_limit and up to +-swiglu_limit."""

    def __init__(self, cfg):
        super().__init__()
        e, d, w = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
        self.limit = cfg.swiglu_limit
        self.gate_up_proj = nn.Parameter(torch.zeros(e, d, 2 * w))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(e, 2 * w))
        self.down_proj = nn.Parameter(torch.zeros(e, w, d))
        self.down_proj_bias = nn.Parameter(torch.zeros(e, d))

    def forward(self, x, e):
        gate_up = x @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        gate = gate.clamp(min=None, max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        glu = gate * torch.sigmoid(gate * 1.702)
        return ((up + 1) * glu) @ self.down_proj[e] + self.down_proj_bias[e]


def gelu_tanh(x):
    """Hugging Face's gelu_pytorch_tanh."""
    return F.gelu(x, approximate="tanh")


class GeGluMlp(Mlp):
    """Gemma 4's dense MLP: down(gelu_tanh(gate(x)) * up(x))."""

    def forward(self, x):
        return self.down_proj(gelu_tanh(self.gate_proj(x)) * self.up_proj(x))


class Gemma4Router(nn.Module):
    """Hugging Face's Gemma4TextRouter: proj(RMSNorm(x) * scale / sqrt(hidden)) (the norm
    without weight), softmax, top-k renormalised to sum 1, times per_expert_scale[expert]."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.norm = Gemma4RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, with_scale=False)
        self.proj = nn.Linear(cfg.hidden_size, cfg.num_local_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(cfg.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(cfg.num_local_experts))

    def forward(self, x, retained=None):
        """x (tokens, hidden) -> (probs, weights, chosen, logits); chosen by descending
        probability. retained, when given: the other experts' logits are -inf."""
        h = self.norm(x) * self.scale * self.cfg.hidden_size ** -0.5
        logits = self.proj(h)
        if retained is not None:
            logits = logits.masked_fill(~retained, float("-inf"))
        probs = F.softmax(logits, dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(probs, self.cfg.num_experts_per_tok, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights * self.per_expert_scale[chosen]
        return probs, weights, chosen, logits


class Gemma4Experts(nn.Module):
    """Hugging Face's Gemma4TextExperts: gate_up_proj (E, 2I, H) (gate rows, then up rows),
    down_proj (E, H, I); each expert down(gelu_tanh(gate) * up)."""

    def __init__(self, cfg):
        super().__init__()
        e, d, w = cfg.num_local_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * w, d).normal_(std=0.02))
        self.down_proj = nn.Parameter(torch.empty(e, d, w).normal_(std=0.02))

    def forward(self, x, chosen, weights):
        """x (tokens, hidden), chosen and weights (tokens, k): experts in order, each on the
        tokens routed to it, the outputs weighted and summed."""
        def expert(e, rows):
            gate, up = F.linear(rows, self.gate_up_proj[e]).chunk(2, dim=-1)
            return F.linear(gelu_tanh(gate) * up, self.down_proj[e])
        return routed_sum(x, chosen, weights, self.gate_up_proj.shape[0], expert)


class SparseMoe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        if cfg.model_type == "gpt_oss":  # mlp.router (with bias), mlp.experts stacked
            self.router = nn.Linear(cfg.hidden_size, cfg.num_local_experts, bias=True)
            self.experts = GptOssExperts(cfg)
            return
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_local_experts, bias=False)
        make = Mlp if cfg.mlp_layout else Expert
        self.experts = nn.ModuleList([make(cfg.hidden_size, cfg.expert_size)
                                      for _ in range(cfg.num_local_experts)])
        if cfg.model_type == "deepseek_v3":
            self.gate.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.num_local_experts))
        if cfg.model_type in DEEPSEEK and cfg.shared_size:
            self.shared_experts = Mlp(cfg.hidden_size, cfg.shared_size)  # no gate
        elif cfg.shared_size:
            self.shared_expert = Mlp(cfg.hidden_size, cfg.shared_size)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x, trace=None, retained=None):
        """retained (experts,) bool, when given: the experts a pruning plan keeps; the others'
        router logits are -inf before the softmax (top-k stays k), as the engine masks them."""
        b, t, d = x.shape
        flat = x.reshape(-1, d)
        oss = self.cfg.model_type == "gpt_oss"
        logits = self.router(flat) if oss else self.gate(flat)
        if retained is not None:
            logits = logits.masked_fill(~retained, float("-inf"))
        if oss:  # GptOssTopKRouter: the top-k logits, then a softmax over them
            probs = F.softmax(logits, dim=-1, dtype=torch.float)
            top, chosen = torch.topk(logits, self.cfg.num_experts_per_tok, dim=-1)
            weights = F.softmax(top, dim=1, dtype=top.dtype)
        elif self.cfg.latent:
            probs, weights, chosen = self._deepseek_route(logits, retained)
        else:
            probs = F.softmax(logits, dim=-1, dtype=torch.float)
            weights, chosen = torch.topk(probs, self.cfg.num_experts_per_tok, dim=-1)
            if self.cfg.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(flat.dtype)
        if trace is not None:
            trace.append((chosen.detach(), weights.detach().float(), probs.detach()))
        out = routed_sum(flat, chosen, weights, self.cfg.num_local_experts,
                         lambda e, x: self.experts(x, e) if oss else self.experts[e](x))
        if hasattr(self, "shared_experts"):
            out = out + self.shared_experts(flat)
        elif hasattr(self, "shared_expert"):
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.view(b, t, d), logits


    def _deepseek_route(self, logits, retained):
        """DeepSeek-V2's router (softmax; greedy or group_limited_greedy, groups scored by their
        best) and DeepSeek-V3's (sigmoid; chosen by score + e_score_correction_bias within the
        best groups, each scored by its best two), as Hugging Face's DeepseekV2Moe and
        DeepseekV3TopkRouter compute them; experts ordered by their choice value."""
        c = self.cfg
        n, e = logits.shape
        v3 = c.model_type == "deepseek_v3"
        probs = logits.sigmoid() if v3 else F.softmax(logits, dim=-1, dtype=torch.float)
        choice = probs + self.gate.e_score_correction_bias if v3 else probs
        if v3 or c.topk_method == "group_limited_greedy":
            grouped = choice.view(n, c.n_group, e // c.n_group)
            group_scores = grouped.topk(2, dim=-1)[0].sum(-1) if v3 else grouped.max(-1).values
            group_idx = torch.topk(group_scores, k=c.topk_group, dim=-1)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
            score_mask = group_mask.unsqueeze(-1).expand(n, c.n_group, e // c.n_group).reshape(n, e)
            choice = choice.masked_fill(~score_mask.bool(), 0.0)
        if retained is not None:
            choice = choice.masked_fill(~retained, float("-inf"))
        chosen = torch.topk(choice, c.num_experts_per_tok, dim=-1)[1]
        weights = probs.gather(1, chosen)
        if v3 and c.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return probs, weights * c.routed_scaling_factor, chosen


class Block(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        self.input_layernorm = make_norm(cfg, cfg.hidden_size)
        if cfg.is_linear(layer):
            self.linear_attn = GatedDeltaNet(cfg)
        elif cfg.hybrid:
            self.self_attn = GatedAttention(cfg)
        elif cfg.latent:
            self.self_attn = LatentAttention(cfg)
        else:
            self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size)
        self.sparse = cfg.is_sparse(layer)
        if not cfg.mlp_layout:
            self.block_sparse_moe = SparseMoe(cfg)
        elif self.sparse:
            self.mlp = SparseMoe(cfg)
        else:
            self.mlp = Mlp(cfg.hidden_size, cfg.intermediate_size)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin, trace=None, retained=None, prefix=None, record=None):
        """prefix, when given, is (keep (b,t,1) bool, a (b,t,hidden)): where keep is true the
        attention input is a instead of this block's normalised x (a student continuing from
        a teacher's KV cache reads the teacher's keys and values there). record, when given,
        gets this block's attention input."""
        a = self.input_layernorm(x)
        if prefix is not None:
            a = torch.where(prefix[0], prefix[1], a)
        if record is not None:
            record.append(a.detach())
        if hasattr(self, "linear_attn"):
            # With a prefix, the positions before the split run on the teacher's inputs, so the
            # state (and the convolution's tail) at the split is the teacher's: what a decoder
            # continuing from a full prefill's handoff holds.
            x = x + self.drop(self.linear_attn(a))
        else:
            x = x + self.drop(self.self_attn(a, cos, sin))
        h = self.post_attention_layernorm(x)
        if not self.sparse:
            return x + self.drop(self.mlp(h)), None
        moe = self.mlp if hasattr(self, "mlp") else self.block_sparse_moe
        h, logits = moe(h, trace, retained)
        return x + self.drop(h), logits


class Gemma4Block(nn.Module):
    """Hugging Face's Gemma4TextDecoderLayer with enable_moe_block: attention between
    input_layernorm and post_attention_layernorm; then, from the residual x, the dense MLP
    (pre_feedforward_layernorm, post_feedforward_layernorm_1) and the experts
    (pre_feedforward_layernorm_2, post_feedforward_layernorm_2; routed on x itself), their sum
    normed by post_feedforward_layernorm and added; the layer's output times layer_scalar."""

    def __init__(self, cfg, layer):
        super().__init__()
        d = cfg.hidden_size
        self.self_attn = Gemma4Attention(cfg, layer)
        self.mlp = GeGluMlp(d, cfg.intermediate_size)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "post_feedforward_layernorm_1",
                     "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
            setattr(self, name, make_norm(cfg, d))
        self.router = Gemma4Router(cfg)
        self.experts = Gemma4Experts(cfg)
        # a buffer in Hugging Face's module; a parameter here, so the goldens can set it
        self.layer_scalar = nn.Parameter(torch.ones(1))
        self.sparse = True
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin, trace=None, retained=None, prefix=None, record=None):
        """As Block.forward (prefix, record: the attention's input)."""
        a = self.input_layernorm(x)
        if prefix is not None:
            a = torch.where(prefix[0], prefix[1], a)
        if record is not None:
            record.append(a.detach())
        x = x + self.drop(self.post_attention_layernorm(self.self_attn(a, cos, sin)))
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
        flat = x.reshape(-1, x.shape[-1])
        probs, weights, chosen, logits = self.router(flat, retained)
        weights = weights.to(flat.dtype)
        if trace is not None:
            trace.append((chosen.detach(), weights.detach().float(), probs.detach()))
        routed = self.experts(self.pre_feedforward_layernorm_2(flat), chosen, weights)
        routed = self.post_feedforward_layernorm_2(routed.view(x.shape))
        x = x + self.drop(self.post_feedforward_layernorm(dense + routed))
        return x * self.layer_scalar, logits


class Inner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        block = Gemma4Block if cfg.gemma4 else Block
        self.layers = nn.ModuleList([block(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = make_norm(cfg, cfg.hidden_size)


class MoeForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.apply(self._init)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def export_state_dict(self):
        """The checkpoint's tensors: the state dict without lm_head when it is tied; for
        qwen3_5_moe, experts stacked per layer (mlp.experts.gate_up_proj (E, 2I, H) with each
        expert's gate rows then its up rows, mlp.experts.down_proj (E, H, I)) and, in the
        published layout, the text model under model.language_model."""
        sd = self.state_dict()
        if self.cfg.tie_word_embeddings:
            sd.pop("lm_head.weight")
        if self.cfg.gemma4:  # experts already stacked as published
            return {self.cfg.checkpoint_name(k): v for k, v in sd.items()}
        if not self.cfg.hybrid:
            return sd
        out = {}
        for l in range(self.cfg.num_hidden_layers):
            p = f"model.layers.{l}.mlp.experts."
            n = self.cfg.num_local_experts
            out[p + "gate_up_proj"] = torch.stack([
                torch.cat([sd.pop(p + f"{e}.gate_proj.weight"), sd.pop(p + f"{e}.up_proj.weight")])
                for e in range(n)])
            out[p + "down_proj"] = torch.stack([sd.pop(p + f"{e}.down_proj.weight")
                                                for e in range(n)])
        out.update(sd)
        return {self.cfg.checkpoint_name(k): v for k, v in out.items()}

    def load_export(self, tensors):
        if self.cfg.gemma4:  # the published layout's vision and audio towers
            tensors = {k: v for k, v in tensors.items()
                       if not k.startswith(("model.vision_tower.", "model.embed_vision.",
                                            "model.audio_tower.", "model.embed_audio."))}
        tensors = {self.cfg.module_name(k): v for k, v in tensors.items()}
        if self.cfg.hybrid:
            inter = self.cfg.moe_intermediate_size
            for l in range(self.cfg.num_hidden_layers):
                p = f"model.layers.{l}.mlp.experts."
                gate_up, down = tensors.pop(p + "gate_up_proj"), tensors.pop(p + "down_proj")
                for e in range(self.cfg.num_local_experts):
                    tensors[p + f"{e}.gate_proj.weight"] = gate_up[e, :inter]
                    tensors[p + f"{e}.up_proj.weight"] = gate_up[e, inter:]
                    tensors[p + f"{e}.down_proj.weight"] = down[e]
        if self.cfg.tie_word_embeddings:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
        self.load_state_dict(tensors, strict=True)

    def forward(self, ids, trace=None, retained=None, prefix=None, record=None):
        """ids (b,t) -> logits (b,t,vocab), router logits (b*t, experts) of each sparse layer.

        trace, when given, gets (chosen, weights, probs) of each sparse layer, in order.
        retained, when given: per layer, the (experts,) bool mask of a pruning plan (None for
        a dense layer). prefix, when given: (split (b,) positions, per-layer attention inputs
        (b,t,hidden) of a teacher, as `record` collects them): positions before a row's split
        attend with the teacher's keys and values, as a decoder continuing from a full
        prefill's KV cache does (tools/train/distill.py)."""
        t = ids.shape[1]
        x = self.model.embed_tokens(ids)
        if self.cfg.gemma4:
            # Gemma4TextScaledWordEmbedding: times sqrt(hidden_size) in the weights' dtype
            x = x * torch.tensor(self.cfg.hidden_size ** 0.5).to(x.dtype)
            ropes = [gemma4_cos_sin(self.cfg, l, torch.arange(t), x.dtype)
                     for l in range(self.cfg.num_hidden_layers)]
        else:
            cos, sin = rope_cos_sin(self.cfg, torch.arange(t), x.dtype)
        keep = None
        if prefix is not None:
            keep = (torch.arange(t)[None, :] < prefix[0][:, None])[:, :, None]
        router_logits = []
        for i, layer in enumerate(self.model.layers):
            if self.cfg.gemma4:
                cos, sin = ropes[i]
            x, rl = layer(x, cos, sin, trace, None if retained is None else retained[i],
                          None if prefix is None else (keep, prefix[1][i]), record)
            if rl is not None:
                router_logits.append(rl)
        logits = self.lm_head(self.model.norm(x))
        cap = self.cfg.final_logit_softcapping if self.cfg.gemma4 else None
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits, router_logits


MixtralForCausalLM = MoeForCausalLM  # the name tiny-moe's scripts were written against


def load_balancing_loss(router_logits, num_experts, top_k):
    """Hugging Face's load_balancing_loss_func: experts * sum(token fraction * mean prob)."""
    logits = torch.cat(router_logits, dim=0)
    probs = F.softmax(logits, dim=-1, dtype=torch.float)
    _, chosen = torch.topk(probs, top_k, dim=-1)
    mask = F.one_hot(chosen, num_experts).float()
    tokens_per_expert = mask.mean(dim=0)
    prob_per_expert = probs.mean(dim=0)
    return num_experts * torch.sum(tokens_per_expert * prob_per_expert.unsqueeze(0))


def param_counts(cfg):
    """(total, active per token) parameters, as the checkpoint stores them."""
    if cfg.gemma4:
        return _gemma4_param_counts(cfg)
    d, v, hd = cfg.hidden_size, cfg.vocab_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    q_rows = 2 * q if cfg.hybrid else q  # qwen3_5_moe's q_proj emits [q | gate]
    attn = d * (q_rows + q + 2 * kv)
    qkv_bias, o_bias = cfg.attention_biases
    attn += (q_rows + 2 * kv if qkv_bias else 0) + (d if o_bias else 0)
    if cfg.model_type == "qwen3_moe" or cfg.hybrid:
        attn += 2 * hd  # q and k norms
    if cfg.latent:  # q (or q_a, its norm, q_b), kv_a, its norm, kv_b, o
        h, lora = cfg.num_attention_heads, cfg.kv_lora_rank
        q_params = (d * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * h * hd
                    if cfg.q_lora_rank else d * h * hd)
        attn = (q_params + d * (lora + cfg.qk_rope_head_dim) + lora
                + lora * h * (cfg.qk_nope_head_dim + cfg.v_head_dim) + h * cfg.v_head_dim * d)
    nv, kd = cfg.linear_num_value_heads, cfg.linear_num_key_heads * cfg.linear_key_head_dim
    vd = nv * cfg.linear_value_head_dim
    conv_dim = 2 * kd + vd
    # in_proj_qkv, in_proj_z, in_proj_b and _a, out_proj, conv1d, A_log, dt_bias, norm
    delta_net = (d * conv_dim + d * vd + 2 * d * nv + vd * d + conv_dim * cfg.linear_conv_kernel_dim
                 + 2 * nv + cfg.linear_value_head_dim)
    if cfg.model_type == "gpt_oss":
        attn += cfg.num_attention_heads  # sinks
    total = v * d * (1 if cfg.tie_word_embeddings else 2) + d
    active = total
    expert = 3 * d * cfg.expert_size
    if cfg.model_type == "gpt_oss":
        expert += 2 * cfg.expert_size + d  # the experts' biases
    for layer in range(cfg.num_hidden_layers):
        base = (delta_net if cfg.is_linear(layer) else attn) + 2 * d
        if not cfg.is_sparse(layer):
            total += base + 3 * d * cfg.intermediate_size
            active += base + 3 * d * cfg.intermediate_size
            continue
        base += d * cfg.num_local_experts
        if cfg.shared_size:
            base += 3 * d * cfg.shared_size + (0 if cfg.model_type in DEEPSEEK else d)
        if cfg.model_type in ("deepseek_v3", "gpt_oss"):
            base += cfg.num_local_experts  # e_score_correction_bias, gpt-oss's router bias
        total += base + cfg.num_local_experts * expert
        active += base + cfg.num_experts_per_tok * expert
    return total, active


def _gemma4_param_counts(cfg):
    d, heads = cfg.hidden_size, cfg.num_attention_heads
    total = cfg.vocab_size * d * (1 if cfg.tie_word_embeddings else 2) + d
    active = total
    expert = 3 * d * cfg.moe_intermediate_size
    for layer in range(cfg.num_hidden_layers):
        hd, kv = cfg.layer_head_dim(layer), cfg.layer_kv_heads(layer)
        attn = 2 * d * heads * hd + d * kv * hd * (1 if cfg.keys_are_values(layer) else 2) + 2 * hd
        # seven norms, layer_scalar, the dense MLP, the router (proj, scale, per_expert_scale)
        base = attn + 7 * d + 1 + 3 * d * cfg.intermediate_size + d * cfg.num_local_experts + d
        base += cfg.num_local_experts
        total += base + cfg.num_local_experts * expert
        active += base + cfg.num_experts_per_tok * expert
    return total, active
