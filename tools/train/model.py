"""Mixtral, exactly as Hugging Face's MixtralForCausalLM defines it, in plain PyTorch.

Parameter names follow the Hugging Face checkpoint (model.layers.N.block_sparse_moe...),
so the state dict exports without renaming. Experts are run per expert on the tokens
routed to them (no dense all-expert compute).
"""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab_size: int = 8192
    hidden_size: int = 192
    intermediate_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    num_local_experts: int = 16
    num_experts_per_tok: int = 2
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    router_aux_loss_coef: float = 0.02
    bos_token_id: int = 1
    eos_token_id: int = 2
    dropout: float = 0.0  # training-only residual dropout; not part of the exported architecture

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    def hf_dict(self):
        d = asdict(self)
        d.pop("dropout")
        d.update({
            "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "hidden_act": "silu", "attention_dropout": 0.0, "initializer_range": 0.02,
            "output_router_logits": False, "sliding_window": None, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "use_cache": True, "head_dim": self.head_dim,
        })
        return d


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


def rope_cos_sin(cfg, positions, dtype):
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = c.num_attention_heads // c.num_key_value_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = (q * (1.0 / math.sqrt(c.head_dim))) @ k.transpose(-2, -1).contiguous()
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        y = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class Expert(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)  # gate
        self.w3 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)  # up
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)  # down

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_local_experts, bias=False)
        self.experts = nn.ModuleList([Expert(cfg) for _ in range(cfg.num_local_experts)])

    def forward(self, x, trace=None):
        b, t, d = x.shape
        flat = x.reshape(-1, d)
        logits = self.gate(flat)
        probs = F.softmax(logits, dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(probs, self.cfg.num_experts_per_tok, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(flat.dtype)
        if trace is not None:
            trace.append((chosen.detach(), weights.detach().float(), probs.detach()))
        out = torch.zeros_like(flat)
        for e in range(self.cfg.num_local_experts):
            tok, slot = torch.where(chosen == e)
            if tok.numel() == 0:
                continue
            y = self.experts[e](flat[tok]) * weights[tok, slot, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out.view(b, t, d), logits


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.block_sparse_moe = SparseMoe(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin, trace=None):
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin))
        h, logits = self.block_sparse_moe(self.post_attention_layernorm(x), trace)
        return x + self.drop(h), logits


class Inner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MixtralForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids, trace=None):
        """ids (b,t) -> logits (b,t,vocab), list of router logits (b*t, experts) per layer."""
        t = ids.shape[1]
        x = self.model.embed_tokens(ids)
        cos, sin = rope_cos_sin(self.cfg, torch.arange(t), x.dtype)
        router_logits = []
        for layer in self.model.layers:
            x, rl = layer(x, cos, sin, trace)
            router_logits.append(rl)
        return self.lm_head(self.model.norm(x)), router_logits


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
    d, h, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    hd = cfg.head_dim
    attn = d * hd * (cfg.num_attention_heads * 2 + cfg.num_key_value_heads * 2)
    expert = 3 * d * h
    per_layer_shared = attn + 2 * d + d * cfg.num_local_experts
    total = 2 * v * d + d + cfg.num_hidden_layers * (per_layer_shared + cfg.num_local_experts * expert)
    active = 2 * v * d + d + cfg.num_hidden_layers * (per_layer_shared + cfg.num_experts_per_tok * expert)
    return total, active
