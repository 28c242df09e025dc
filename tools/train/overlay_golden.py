#!/usr/bin/python3
"""Golden references for decoder overlays (tests/golden/distill): the PyTorch student's
logits, to test the engine's decoder with an overlay against (overlay_golden_test).

For a model, a plan and an overlay distilled for it: the first validation window's first
--tokens tokens, and as little-endian f4 .npy:
  handoff_logits.npy       (tokens - split, vocab): the full model over positions [0, split)
                           (the prefill and its KV cache), the student (the plan's experts, the
                           overlay's tensors) from `split` on, reading that cache
  conventional_logits.npy  (tokens, vocab): the student over every position
with golden.json naming the files, the split and the token ids. The student's weights are the
overlay's exactly as stored (norms F32, matrices BF16), the rest the bf16 checkpoint's.
"""
import os
import openblas_core  # noqa: F401  (before numpy and torch load OpenBLAS)

import argparse
import json

import numpy as np
import sentencepiece as spm
import torch

import data
import safetensors_io
from distill import apply_overlay, load_model, load_plan, make_student


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--overlay", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--split", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(2)

    cfg, teacher = load_model(args.model_dir)
    masks, plan_hash = load_plan(args.plan, cfg)
    student, _ = make_student(teacher, cfg)
    apply_overlay(student, safetensors_io.read(args.overlay))
    student.eval()
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.model_dir, "tokenizer.model"))
    docs = data.encode_docs(sp, os.path.join(args.model_dir, "eval", "valid.txt"))
    inp, _ = next(data.eval_windows(docs))
    ids = torch.tensor([inp[:args.tokens]])
    with torch.no_grad():
        record = []
        teacher(ids, record=record)
        handoff, _ = student(ids, retained=masks, prefix=(torch.tensor([args.split]), record))
        conventional, _ = student(ids, retained=masks)
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "handoff_logits.npy"),
            handoff[0, args.split:].float().numpy().astype("<f4"))
    np.save(os.path.join(args.out, "conventional_logits.npy"),
            conventional[0].float().numpy().astype("<f4"))
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump({"model": os.path.relpath(os.path.abspath(args.model_dir), root),
                   "plan": os.path.relpath(os.path.abspath(args.plan), root),
                   "overlay": os.path.relpath(os.path.abspath(args.overlay), root),
                   "plan_sha256": plan_hash, "split": args.split,
                   "token_ids": ids[0].tolist()}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
