#!/usr/bin/python3
"""Exports the best checkpoint to a model directory (models/tiny-moe, models/tiny-fg-moe) in
the Hugging Face layout (bf16
safetensors), verifies it by reading it back, measures validation/test perplexity and the
routing statistics of the shipped bf16 weights, and writes them to eval/metrics.json."""
import os
import openblas_core  # noqa: F401  (before numpy and torch load OpenBLAS)

import argparse
import itertools
import json
import math
import shutil

import sentencepiece as spm
import torch

import data
import safetensors_io
from model import Config, MoeForCausalLM, param_counts


def load_shipped(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = Config.from_hf(json.load(f))
    model = MoeForCausalLM(cfg)
    tensors = safetensors_io.read(os.path.join(model_dir, "model.safetensors"))
    model.load_export({k: v.float() for k, v in tensors.items()})
    model.eval()
    return cfg, model


@torch.no_grad()
def routing_stats(cfg, model, docs):
    """Per sparse layer: each expert's share of activations; the token's leading pair (its two
    highest-weighted experts: with top-2 its only pair) and how concentrated those pairs are;
    with top-k for k > 2 also how concentrated the whole top-k sets are and how much of the
    routed weight the leading pair carries."""
    e, k = cfg.num_local_experts, cfg.num_experts_per_tok
    layers = [l for l in range(cfg.num_hidden_layers) if cfg.is_sparse(l)]
    freq = torch.zeros(len(layers), e)
    pairs = torch.zeros(len(layers), e, e)
    sets = [dict() for _ in layers]
    lead_weight = [0.0 for _ in layers]
    tokens = 0
    for inp, _ in data.eval_windows(docs):
        trace = []
        model(torch.tensor([inp]), trace)
        tokens += len(inp)
        for i, (chosen, weights, _) in enumerate(trace):
            for row, w in zip(chosen.tolist(), weights.tolist()):
                for x in row:
                    freq[i, x] += 1
                a, b = sorted(row[:2])
                pairs[i, a, b] += 1
                key = tuple(sorted(row))
                sets[i][key] = sets[i].get(key, 0) + 1
                lead_weight[i] += (w[0] + w[1]) / sum(w)
    out = []
    for i, layer in enumerate(layers):
        counts = sorted((pairs[i, a, b].item() for a, b in itertools.combinations(range(e), 2)),
                        reverse=True)
        top = sum(counts[: len(counts) // 4]) / sum(counts)
        f = freq[i] / freq[i].sum()
        row = {"layer": layer, "expert_share": [round(x, 4) for x in f.tolist()],
               "top25_pairs_share": round(top, 4), "pairs_never_used": sum(c == 0 for c in counts)}
        if k > 2:
            by_count = sorted(sets[i].values(), reverse=True)
            row.update({
                "distinct_sets": len(by_count),
                "tokens": tokens,
                "top100_sets_share": round(sum(by_count[:100]) / tokens, 4),
                "tokens_in_repeated_sets_share": round(sum(c for c in by_count if c > 1) / tokens, 4),
                "leading_pair_weight_share": round(lead_weight[i] / tokens, 4),
            })
        out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--checkpoint", default="best.pt", help="file in --work to export")
    args = ap.parse_args()
    torch.set_num_threads(2)
    ckpt = torch.load(os.path.join(args.work, args.checkpoint))
    os.makedirs(args.model_dir, exist_ok=True)
    tensors = {k: v.to(torch.bfloat16) for k, v in ckpt["state_dict"].items()}
    if ckpt["config"].get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)
    path = os.path.join(args.model_dir, "model.safetensors")
    safetensors_io.write(path, tensors, {"format": "pt"})
    back = safetensors_io.read(path)
    assert back.keys() == tensors.keys()
    for k in tensors:
        assert torch.equal(back[k].view(torch.int16), tensors[k].view(torch.int16)), k

    cfg_dict = ckpt["config"]
    with open(os.path.join(args.model_dir, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
    # A chat is written as quoted dialogue (the corpus has no chats): the reply ends at its
    # closing quote (stop_strings), and the Jinja template lives in tokenizer_config.json.
    with open(os.path.join(args.model_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False,
                   "max_new_tokens": 128, "stop_strings": ['"']}, f, indent=2)
        f.write("\n")
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "quoted_dialogue.jinja")) as f:
        chat_template = f.read().replace("MODEL_NAME",
                                         os.path.basename(os.path.normpath(args.model_dir)))
    with open(os.path.join(args.model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True,
                   "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "pad_token": None, "model_max_length": 512,
                   "legacy": False, "chat_template": chat_template}, f, indent=2)
        f.write("\n")
    shutil.copy(os.path.join(args.work, "tokenizer.model"), os.path.join(args.model_dir, "tokenizer.model"))

    cfg, model = load_shipped(args.model_dir)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.model_dir, "tokenizer.model"))
    metrics = {"step": ckpt["step"], "train_elapsed_s": round(ckpt["elapsed_s"]),
               "train_args": ckpt["args"], "checkpoint_valid_nll_in_training": ckpt["valid_nll"]}
    for part in ("valid", "test"):
        docs = data.encode_docs(sp, os.path.join(args.model_dir, "eval", f"{part}.txt"))
        nll, count = data.evaluate(model, docs, autocast=False)
        metrics[part] = {"nll": nll, "perplexity": math.exp(nll), "tokens": count,
                         "documents": len(docs)}
        print(part, metrics[part], flush=True)
    total, active = param_counts(cfg)
    metrics["params_total"], metrics["params_active"] = total, active
    metrics["torch_version"] = torch.__version__
    test_docs = data.encode_docs(sp, os.path.join(args.model_dir, "eval", "test.txt"))
    metrics["routing_test_split"] = routing_stats(cfg, model, test_docs)
    with open(os.path.join(args.model_dir, "eval", "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    print(json.dumps({k: v for k, v in metrics.items() if k != "routing_test_split"}, indent=1))
    for r in metrics["routing_test_split"]:
        print(r["layer"], r["top25_pairs_share"], max(r["expert_share"]), min(r["expert_share"]))


if __name__ == "__main__":
    main()
