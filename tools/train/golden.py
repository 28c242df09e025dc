#!/usr/bin/python3
"""Writes the golden references in tests/golden/MODEL/ (tiny-moe, tiny-fg-moe) from the
shipped bf16 weights, computed by the PyTorch model in float32 (no autocast).

Files (numpy .npy, little-endian, C order; read in C++ by common/model/npy.h):
  manifest.json               prompts, token ids, stored positions, greedy continuations,
                              test-split perplexity, and provenance
  prompt_K_logits.npy         f4 (positions, vocab): full logits at the stored positions
  prompt_K_router_probs.npy   f4 (sparse layers, tokens, experts): softmax router probabilities
  prompt_K_experts.npy        i4 (sparse layers, tokens, top_k): chosen experts, by weight
  prompt_K_expert_weights.npy f4 (sparse layers, tokens, top_k): their weights (renormalised
                              where the config's norm_topk_prob says)
  test_logprobs.npy           f4 (tokens,): log-probability of every scored token of the
                              test split under the evaluation protocol of data.py
"""
import os
import openblas_core  # noqa: F401  (before numpy and torch load OpenBLAS)

import argparse
import hashlib
import json
import math

import numpy as np
import sentencepiece as spm
import torch

import data
from export import load_shipped

PROMPTS = [
    "The jury said it did find that",
    "In the beginning of the year, the company",
    "She opened the door and",
    "The president of the United States",
    "Mrs. Grinsfelder is chairman of the committee, and she said that",
    "1961 was a year in which",
    "He looked at the old man for a long time before he",
    None,  # the first 200 tokens of the first test document (a long prompt)
]
GREEDY_TOKENS = 64


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    os.makedirs(args.out, exist_ok=True)
    cfg, model = load_shipped(args.model_dir)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.model_dir, "tokenizer.model"))
    test_path = os.path.join(args.model_dir, "eval", "test.txt")
    test_docs = data.encode_docs(sp, test_path)

    name = os.path.basename(os.path.normpath(args.model_dir))
    manifest = {"model": name, "compute_dtype": "float32", "weights_dtype": "bfloat16",
                "torch_version": torch.__version__, "greedy_tokens": GREEDY_TOKENS,
                "greedy_rule": "argmax of float32 logits; stops after EOS (included) or "
                               f"{GREEDY_TOKENS} tokens; full recompute, no KV cache",
                "prompts": []}
    with open(os.path.join(args.model_dir, "model.safetensors"), "rb") as f:
        manifest["weights_sha256"] = hashlib.sha256(f.read()).hexdigest()

    for k, text in enumerate(PROMPTS):
        if text is None:
            ids = [data.BOS] + test_docs[0][:200]
            text = sp.decode(test_docs[0][:200])
        else:
            ids = [data.BOS] + sp.encode(text)
        trace = []
        logits, _ = model(torch.tensor([ids]), trace)
        logits = logits[0].float()
        n = len(ids)
        positions = sorted({0, n // 3, (2 * n) // 3, n - 1})
        np.save(os.path.join(args.out, f"prompt_{k}_logits.npy"),
                logits[positions].numpy().astype("<f4"))
        probs = torch.stack([p for _, _, p in trace]).float()          # (layers, n, experts)
        experts = torch.stack([c for c, _, _ in trace]).to(torch.int32)  # (layers, n, k)
        weights = torch.stack([w for _, w, _ in trace]).float()        # (layers, n, k)
        np.save(os.path.join(args.out, f"prompt_{k}_router_probs.npy"), probs.numpy().astype("<f4"))
        np.save(os.path.join(args.out, f"prompt_{k}_experts.npy"), experts.numpy().astype("<i4"))
        np.save(os.path.join(args.out, f"prompt_{k}_expert_weights.npy"),
                weights.numpy().astype("<f4"))
        # Smallest gap between the k-th and (k+1)-th router probability, per layer: where it is
        # tiny, an independent implementation may legitimately pick the other expert.
        top = torch.topk(probs, cfg.num_experts_per_tok + 1, dim=-1).values
        gap = (top[..., -2] - top[..., -1]).min().item()

        seq = list(ids)
        greedy = []
        for _ in range(GREEDY_TOKENS):
            step_logits, _ = model(torch.tensor([seq]))
            nxt = int(torch.argmax(step_logits[0, -1].float()))
            greedy.append(nxt)
            seq.append(nxt)
            if nxt == data.EOS:
                break
        manifest["prompts"].append({
            "text": text, "token_ids": ids, "logit_positions": positions,
            "greedy_token_ids": greedy, "greedy_text": sp.decode(greedy),
            "min_router_gap": gap,
        })
        print(k, repr(text[:40]), "->", repr(sp.decode(greedy)[:60]), f"gap {gap:.2e}", flush=True)

    logprobs = []
    for inp, tgt in data.eval_windows(test_docs):
        lg, _ = model(torch.tensor([inp]))
        lp = torch.log_softmax(lg[0, :len(tgt)].float(), dim=-1)
        logprobs.append(lp[torch.arange(len(tgt)), torch.tensor(tgt)])
    logprobs = torch.cat(logprobs).numpy().astype("<f4")
    np.save(os.path.join(args.out, "test_logprobs.npy"), logprobs)
    nll = -float(np.mean(logprobs.astype(np.float64)))
    manifest["test_split"] = {"file": f"models/{name}/eval/test.txt", "tokens": int(len(logprobs)),
                              "nll": nll, "perplexity": math.exp(nll),
                              "protocol": "tools/train/data.py (eval_windows)"}
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print("test perplexity (float32)", math.exp(nll))


if __name__ == "__main__":
    main()
