#!/usr/bin/python3
"""Low-cost distillation of a pruned decoder (docs/distillation.md): teaches a pruning plan's
decoder to continue from the full model's KV cache, and writes the result as a decoder overlay.

The recipe (phase-decoupled pruning's third part, docs/design.md):
- Teacher: the full model (every expert). Student: the plan's pruned model (pruned experts
  masked out of the router, top-k unchanged), sharing every frozen tensor with the teacher.
- Trained: only the always-on parameters (`always_on_names`): each layer's two RMSNorm
  weights and router, the shared expert and its gate or the dense MLP where the model has
  them, and the final norm; the routers at --router-lr-scale (1/10) of the others' rate.
  Attention (and a hybrid's Gated DeltaNet), the routed experts, the embedding and the lm_head
  stay frozen.
- Split points: each training sequence gets a split s drawn uniformly from [0, T); positions
  before s are the teacher's (the student attends to the teacher's keys and values there, as a
  decoder reads a full prefill's KV cache) and the loss is over the positions from s on, whose
  hidden states and keys and values are the student's own. s = 0 everywhere (`--split zero`)
  is ordinary distillation, the baseline for conventional pruning.
- Loss: alpha * CE(data) + (1 - alpha) * KL(teacher || student), alpha = 0.1, where the KL is
  over the teacher's top 64 tokens plus one residual bucket holding the rest of each side's
  probability mass. Why alpha weights CE by a tenth: the student's goal is the full model's
  behaviour on the handed-off cache (its distribution, which also carries the teacher's
  lengths: where it ends sentences), not the data the full model already fits; the small CE
  term keeps the student anchored to real tokens where the teacher's 64 tokens say little.

Deterministic given --seed (sequence starts, split points; one thread order). Progress every
10 steps and the validation loss (handoff at position 128, and from position 0) as it goes.

Output: a safetensors file with only the trained tensors (norms as F32, matrices as BF16 as
the engine holds them) and metadata naming the format, the base checkpoint (SHA-256 of its
model.safetensors), the plan (`plan_sha256`) and the recipe (`tandem-decode --overlay`).
"""
import os
import openblas_core  # noqa: F401  (before numpy and torch load OpenBLAS)

import argparse
import hashlib
import json
import math
import random
import time

import sentencepiece as spm
import torch
import torch.nn.functional as F

import data
import safetensors_io
from export import load_shipped as load_model  # the shipped bf16 weights, in float32
from model import DEEPSEEK, MoeForCausalLM

OVERLAY_FORMAT = "tandem-decoder-overlay"
OVERLAY_VERSION = "1"


def router_name(cfg, layer):
    if cfg.gemma4:
        return f"model.layers.{layer}.router.proj.weight"
    if cfg.model_type == "gpt_oss":  # its bias stays the checkpoint's, as the engine runs it
        return f"model.layers.{layer}.mlp.router.weight"
    block = "mlp" if cfg.mlp_layout else "block_sparse_moe"
    return f"model.layers.{layer}.{block}.gate.weight"


def always_on_names(cfg):
    """The always-on parameters, by checkpoint name: what distillation may train."""
    names = []
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        if cfg.gemma4:  # its sandwich and side-by-side norms, dense MLP, router scales, scalar
            names += [p + n + ".weight" for n in (
                "pre_feedforward_layernorm", "post_feedforward_layernorm",
                "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
                "post_feedforward_layernorm_2")]
            names += [p + f"mlp.{m}.weight" for m in ("gate_proj", "up_proj", "down_proj")]
            names += [router_name(cfg, l), p + "router.scale", p + "router.per_expert_scale",
                      p + "layer_scalar"]
            continue
        if not cfg.is_sparse(l):
            names += [p + f"mlp.{m}.weight" for m in ("gate_proj", "up_proj", "down_proj")]
            continue
        names.append(router_name(cfg, l))
        if cfg.model_type in DEEPSEEK and cfg.shared_size:  # ungated
            names += [p + f"mlp.shared_experts.{m}.weight"
                      for m in ("gate_proj", "up_proj", "down_proj")]
        elif cfg.shared_size:
            names += [p + f"mlp.shared_expert.{m}.weight"
                      for m in ("gate_proj", "up_proj", "down_proj")]
            names.append(p + "mlp.shared_expert_gate.weight")
    names.append("model.norm.weight")
    return names


def load_plan(path, cfg):
    """(per-layer retained masks (None for dense layers), the plan's SHA-256 as the engine
    computes it: of one line per layer, its retained experts ascending, comma-separated)."""
    with open(path) as f:
        plan = json.load(f)
    if plan.get("numLayers") != cfg.num_hidden_layers or plan.get("numExperts") != cfg.num_local_experts:
        raise SystemExit(f"{path}: a plan for {plan.get('numLayers')} layers of "
                         f"{plan.get('numExperts')} experts, not this model's")
    kept = {}
    for entry in plan["layers"]:
        kept[entry.get("layer", 0)] = sorted(entry["retainedExperts"])
    masks, lines = [], []
    for l in range(cfg.num_hidden_layers):
        experts = kept.get(l, list(range(cfg.num_local_experts)))
        lines.append(",".join(str(e) for e in experts) + "\n")
        if not cfg.is_sparse(l):
            masks.append(None)
            continue
        m = torch.zeros(cfg.num_local_experts, dtype=torch.bool)
        m[experts] = True
        masks.append(m)
    return masks, hashlib.sha256("".join(lines).encode()).hexdigest()


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def make_student(teacher, cfg):
    """A copy of the teacher whose frozen tensors are the teacher's own (shared storage) and
    whose always-on tensors are trainable copies."""
    student = MoeForCausalLM(cfg)
    student.load_state_dict(teacher.state_dict())
    trained = set(always_on_names(cfg))
    teacher_params = dict(teacher.named_parameters())
    params = {}
    for name, p in student.named_parameters():
        if name in trained:
            params[name] = p
        else:
            p.data = teacher_params[name].data
            p.requires_grad_(False)
    missing = trained - set(params)
    assert not missing, missing
    return student, params


def apply_overlay(student, tensors):
    own = dict(student.named_parameters())
    with torch.no_grad():
        for name, t in tensors.items():
            own[student.cfg.module_name(name)].copy_(t.float())


def topk_kl(student_logits, teacher_logits, k):
    """KL(teacher || student) over the teacher's top-k tokens and one bucket for the rest,
    per row."""
    t_logp = F.log_softmax(teacher_logits.float(), dim=-1)
    top_logp, top = torch.topk(t_logp, k, dim=-1)
    top_p = top_logp.exp()
    rest_p = (1 - top_p.sum(-1)).clamp_min(1e-12)
    s_lse = torch.logsumexp(student_logits, dim=-1)
    s_top = student_logits.gather(-1, top) - s_lse[:, None]
    s_rest = torch.logsumexp(student_logits.scatter(-1, top, float("-inf")), dim=-1) - s_lse
    return (top_p * (top_logp - s_top)).sum(-1) + rest_p * (rest_p.log() - s_rest)


def distill_loss(teacher, student, masks, inp, tgt, split, alpha, k):
    """(loss, ce, kl, scored tokens) of the student continuing from position `split` (b,)."""
    record = []
    with torch.no_grad():
        teacher_logits, _ = teacher(inp, record=record)
    logits, _ = student(inp, retained=masks, prefix=(split, record))
    scored = torch.arange(inp.shape[1])[None, :] >= split[:, None]
    s = logits[scored]
    ce = F.cross_entropy(s, tgt[scored])
    kl = topk_kl(s, teacher_logits[scored], k).mean()
    return alpha * ce + (1 - alpha) * kl, ce, kl, int(scored.sum())


@torch.no_grad()
def validate(teacher, student, masks, windows, split_at):
    """Mean NLL of the student's continuation from position split_at (the teacher's before it)
    over `windows`, and the teacher's over the same tokens."""
    total_s = total_t = 0.0
    count = 0
    for inp, tgt in windows:
        if len(tgt) <= split_at:
            continue
        ids = torch.tensor([inp])
        record = []
        t_logits, _ = teacher(ids, record=record)
        s_logits, _ = student(ids, retained=masks, prefix=(torch.tensor([split_at]), record))
        y = torch.tensor(tgt)[split_at:]
        end = len(tgt)  # the input's last position predicts nothing
        total_s += F.cross_entropy(s_logits[0, split_at:end], y, reduction="sum").item()
        total_t += F.cross_entropy(t_logits[0, split_at:end], y, reduction="sum").item()
        count += len(y)
    return total_s / count, total_t / count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="the base model (config.json, model.safetensors)")
    ap.add_argument("--plan", required=True, help="the pruning plan (proto JSON) of the decoder")
    ap.add_argument("--train-text", required=True, help="training split, one document per line")
    ap.add_argument("--valid-text", default="", help="default: MODEL_DIR/eval/valid.txt")
    ap.add_argument("--out", required=True, help="the overlay (.safetensors) to write")
    ap.add_argument("--split", choices=["uniform", "zero"], default="uniform",
                    help="split points: uniform in [0, seq) (continuing from the teacher's KV), "
                         "or 0 (ordinary distillation)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--router-lr-scale", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=0.1, help="weight of cross-entropy; 1 - alpha of the KL")
    ap.add_argument("--topk", type=int, default=64, help="teacher tokens kept beside the residual bucket")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--valid-windows", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    t0 = time.time()
    cfg, teacher = load_model(args.model_dir)
    for p in teacher.parameters():
        p.requires_grad_(False)
    # A hybrid's DeltaNet runs its chunked form in training mode (a 512-token window as matrix
    # products, not a token loop); the exported config has no dropout, so that is all it changes.
    teacher.train()
    masks, plan_hash = load_plan(args.plan, cfg)
    student, params = make_student(teacher, cfg)
    student.train()  # no dropout in an exported config; train() only for clarity

    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.model_dir, "tokenizer.model"))
    stream = torch.tensor([t for doc in data.encode_docs(sp, args.train_text) for t in doc])
    valid_text = args.valid_text or os.path.join(args.model_dir, "eval", "valid.txt")
    windows = list(data.eval_windows(data.encode_docs(sp, valid_text)))[:args.valid_windows]

    routers = {router_name(cfg, l) for l in range(cfg.num_hidden_layers) if cfg.is_sparse(l)}
    groups = [{"params": [p for n, p in params.items() if n not in routers], "scale": 1.0},
              {"params": [p for n, p in params.items() if n in routers],
               "scale": args.router_lr_scale}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    trained = sum(p.numel() for p in params.values())
    total = sum(p.numel() for p in teacher.export_state_dict().values())

    def say(msg):
        print(msg, flush=True)

    say(json.dumps({"start": time.strftime("%Y-%m-%dT%H:%M:%S"), "args": vars(args),
                    "train_tokens": len(stream), "params_trained": trained, "params_total": total,
                    "trained_share": trained / total, "plan_sha256": plan_hash}))

    def report(step):
        v_handoff, t_handoff = validate(teacher, student, masks, windows, 128)
        v_zero, t_zero = validate(teacher, student, masks, windows, 0)
        say(f"eval step {step} valid_nll handoff@128 {v_handoff:.4f} (full {t_handoff:.4f}) "
            f"from 0 {v_zero:.4f} (full {t_zero:.4f})")
        return {"step": step, "handoff_nll": v_handoff, "from_zero_nll": v_zero,
                "full_nll": t_handoff, "full_from_zero_nll": t_zero}

    history = [report(0)]
    n = args.seq - 1
    tokens = scored_tokens = 0
    for step in range(1, args.steps + 1):
        frac = min(1.0, step / args.warmup) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for g in opt.param_groups:
            g["lr"] = args.lr * g["scale"] * max(frac, 0.1)
        starts = [rng.randrange(0, len(stream) - n - 1) for _ in range(args.batch)]
        chunk = torch.stack([stream[s:s + n + 1] for s in starts])
        inp = torch.cat([torch.full((args.batch, 1), data.BOS, dtype=torch.long), chunk[:, :-1]], 1)
        if args.split == "zero":
            split = torch.zeros(args.batch, dtype=torch.long)
        else:
            split = torch.tensor([rng.randrange(0, args.seq) for _ in range(args.batch)])
        opt.zero_grad(set_to_none=True)
        loss, ce, kl, scored = distill_loss(teacher, student, masks, inp, chunk, split,
                                            args.alpha, args.topk)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        tokens += inp.numel()
        scored_tokens += scored
        if step % 10 == 0:
            el = time.time() - t0
            say(f"step {step} loss {loss.item():.4f} ce {ce.item():.4f} kl {kl.item():.4f} "
                f"elapsed {el:.0f}s")
        if step % args.eval_every == 0 or step == args.steps:
            history.append(report(step))

    # Frozen means frozen: every tensor outside the overlay is still the checkpoint's, bit for bit.
    # (Names here are the checkpoint's: cfg.checkpoint_name of the module's.)
    shipped = safetensors_io.read(os.path.join(args.model_dir, "model.safetensors"))
    own = student.export_state_dict()
    trained_names = {cfg.checkpoint_name(name) for name in params}
    for name, t in shipped.items():
        if name not in trained_names and name in own:  # (not the tensors the engine skips)
            assert torch.equal(own[name], t.float()), f"frozen tensor {name} changed"

    # The overlay: the trained tensors as the engine holds them (norms F32, matrices BF16).
    out = {}
    for name, p in params.items():
        t = p.detach()
        out[cfg.checkpoint_name(name)] = (t.float().contiguous() if t.dim() == 1
                                          else t.to(torch.bfloat16).contiguous())
    elapsed = time.time() - t0
    recipe = {"split": args.split, "alpha": args.alpha, "teacher_topk": args.topk,
              "steps": args.steps, "batch": args.batch, "seq": args.seq, "lr": args.lr,
              "router_lr_scale": args.router_lr_scale, "warmup": args.warmup, "seed": args.seed,
              "train_text": os.path.basename(args.train_text), "tokens": tokens,
              "scored_tokens": scored_tokens, "params_trained": trained, "params_total": total,
              "wall_s": round(elapsed, 1), "validation": history}
    metadata = {"format": OVERLAY_FORMAT, "version": OVERLAY_VERSION,
                "base_model": os.path.basename(os.path.normpath(args.model_dir)),
                "base_sha256": file_sha256(os.path.join(args.model_dir, "model.safetensors")),
                "plan": os.path.basename(args.plan), "plan_sha256": plan_hash,
                "recipe": json.dumps(recipe, separators=(",", ":"))}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    safetensors_io.write(args.out, out, metadata)
    say(json.dumps({"done": True, "out": args.out, "tokens": tokens, "scored_tokens": scored_tokens,
                    "params_trained": trained, "trained_share": trained / total,
                    "elapsed_s": round(elapsed, 1)}))


if __name__ == "__main__":
    main()
