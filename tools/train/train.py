#!/usr/bin/python3
"""Trains the tiny Mixtral on the Brown train split (run prepare_data.py first).

Every sequence starts with BOS (the exported tokenizer_config says add_bos_token: true);
documents are joined with EOS. Keeps the checkpoint with the best validation loss.
"""
import os
import openblas_core  # noqa: F401  (before numpy and torch load OpenBLAS)

import argparse
import json
import math
import random
import time

import sentencepiece as spm
import torch
import torch.nn.functional as F

import data
from model import Config, MoeForCausalLM, load_balancing_loss, param_counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--max-minutes", type=float, default=0,
                    help="stop (after a last evaluation) once training has run this long")
    ap.add_argument("--stop-at-step", type=int, default=0,
                    help="stop after this step's evaluation; the schedule still spans --steps")
    ap.add_argument("--batch", type=int, default=4, help="sequences per micro-batch")
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    ap.add_argument("--autocast", type=int, default=0, help="bf16 autocast (slower on Debian's torch 1.13)")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.05)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--init", default="", help="start from this checkpoint's weights")
    ap.add_argument("--balance", choices=["concat", "per-layer"], default="concat",
                    help="load balancing over all layers' router logits concatenated (Hugging "
                         "Face's rule) or per layer, averaged")
    ap.add_argument("--aux-coef", type=float, default=None,
                    help="load-balancing loss coefficient (default: the config's)")
    ap.add_argument("--tag", default="", help="suffix of this run's log and checkpoint names")
    ap.add_argument("--model-config", default="",
                    help="a Hugging Face config.json of the model to train (default: tiny-moe's "
                         "Mixtral shape)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.work, "tokenizer.model"))
    train_stream = [t for doc in data.encode_docs(sp, os.path.join(args.work, "train.txt")) for t in doc]
    train_stream = torch.tensor(train_stream)
    valid_docs = data.encode_docs(sp, os.path.join(args.work, "valid.txt"))

    if args.model_config:
        with open(args.model_config) as f:
            cfg = Config.from_hf(json.load(f))
        cfg.dropout = args.dropout
    else:
        cfg = Config(dropout=args.dropout)
    model = MoeForCausalLM(cfg)
    if args.init:
        model.load_export(torch.load(args.init)["state_dict"])
    aux_coef = cfg.router_aux_loss_coef if args.aux_coef is None else args.aux_coef
    total, active = param_counts(cfg)
    assert total == sum(p.numel() for p in model.export_state_dict().values())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    log = open(os.path.join(args.work, f"train{args.tag}.log"), "a")

    def say(msg):
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    say(json.dumps({"start": time.strftime("%Y-%m-%dT%H:%M:%S"), "args": vars(args),
                    "train_tokens": len(train_stream), "params_total": total,
                    "params_active": active}))
    best = float("inf")
    t0 = time.time()
    n = args.seq - 1
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / args.warmup) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        lr = max(lr, args.lr * 0.02)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        for _ in range(args.accum):
            starts = [rng.randrange(0, len(train_stream) - n - 1) for _ in range(args.batch)]
            chunk = torch.stack([train_stream[s:s + n + 1] for s in starts])
            bos = torch.full((args.batch, 1), data.BOS, dtype=torch.long)
            inp = torch.cat([bos, chunk[:, :-1]], dim=1)
            tgt = chunk
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(args.autocast)):
                logits, router_logits = model(inp)
            ce = F.cross_entropy(logits.float().view(-1, cfg.vocab_size), tgt.reshape(-1))
            if args.balance == "concat":
                aux = load_balancing_loss([r.float() for r in router_logits],
                                          cfg.num_local_experts, cfg.num_experts_per_tok)
            else:
                aux = sum(load_balancing_loss([r.float()], cfg.num_local_experts,
                                              cfg.num_experts_per_tok)
                          for r in router_logits) / len(router_logits)
            loss = (ce + aux_coef * aux) / args.accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0:
            el = time.time() - t0
            say(f"step {step} loss {ce.item():.4f} aux {aux.item():.3f} lr {lr:.2e} "
                f"tok/s {step * args.accum * args.batch * args.seq / el:.0f} elapsed {el:.0f}s")
        out_of_time = bool(args.max_minutes and time.time() - t0 > args.max_minutes * 60)
        out_of_time = out_of_time or step == args.stop_at_step
        if step % args.eval_every == 0 or step == args.steps or out_of_time:
            nll, count = data.evaluate(model, valid_docs, autocast=bool(args.autocast))
            say(f"eval step {step} valid_nll {nll:.4f} valid_ppl {math.exp(nll):.2f} tokens {count}")
            if nll < best:
                best = nll
                torch.save({"config": cfg.hf_dict(), "state_dict": model.export_state_dict(),
                            "step": step,
                            "valid_nll": nll, "elapsed_s": time.time() - t0, "args": vars(args)},
                           os.path.join(args.work, f"best{args.tag}.pt"))
        if out_of_time:
            why = (f"--stop-at-step {args.stop_at_step}" if step == args.stop_at_step
                   else f"past --max-minutes {args.max_minutes}")
            say(f"stopping at step {step}: {why}")
            break
    say(json.dumps({"done": True, "best_valid_nll": best, "elapsed_s": time.time() - t0}))


if __name__ == "__main__":
    main()
