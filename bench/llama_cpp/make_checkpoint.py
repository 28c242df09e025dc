#!/usr/bin/python3
"""Writes a random-weight bf16 checkpoint in Hugging Face Mixtral layout.

    make_checkpoint.py --config bench/configs/dummy-3b-v8k/config.json --out DIR [--seed 1]

DIR receives model.safetensors, a copy of config.json, and the tokenizer (tokenizer.model,
tokenizer_config.json) of --tokenizer_dir (models/tiny-moe by default; its vocabulary must be
the config's vocab_size). Matrices are uniform with standard deviation 0.02, RMSNorm weights
1.0, from one seeded NumPy generator in file order, so a seed always gives the same bytes.
Tensors are generated and written one at a time (at most --chunk elements of float32 at
once), never the whole model in memory. The file appears under its final name only once it
is complete.

The safetensors layout: an 8-byte little-endian header length, a JSON header of
{name: {dtype, shape, data_offsets}} (padded with spaces to a multiple of 8), then the
tensors' bytes back to back, in header order, with no gaps.
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STD = 0.02


def tensor_shapes(c):
    """[(name, shape, kind)] of a Mixtral checkpoint, kind "matrix" or "norm"."""
    if c.get("model_type") != "mixtral":
        sys.exit(f"make_checkpoint: model_type {c.get('model_type')!r} is not mixtral")
    h = c["hidden_size"]
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads", heads)
    head_dim = c.get("head_dim") or h // heads
    ff = c["intermediate_size"]
    experts = c["num_local_experts"]
    vocab = c["vocab_size"]
    out = [("model.embed_tokens.weight", (vocab, h), "matrix")]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "self_attn.q_proj.weight", (heads * head_dim, h), "matrix"),
            (p + "self_attn.k_proj.weight", (kv_heads * head_dim, h), "matrix"),
            (p + "self_attn.v_proj.weight", (kv_heads * head_dim, h), "matrix"),
            (p + "self_attn.o_proj.weight", (h, heads * head_dim), "matrix"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "block_sparse_moe.gate.weight", (experts, h), "matrix"),
        ]
        for e in range(experts):
            q = f"{p}block_sparse_moe.experts.{e}."
            out += [
                (q + "w1.weight", (ff, h), "matrix"),  # gate
                (q + "w2.weight", (h, ff), "matrix"),  # down
                (q + "w3.weight", (ff, h), "matrix"),  # up
            ]
    out.append(("model.norm.weight", (h,), "norm"))
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (vocab, h), "matrix"))
    return out


def to_bf16(x):
    """float32 array -> uint16 bf16 bits, rounded to nearest even."""
    bits = x.view(np.uint32)
    bits = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (bits >> np.uint32(16)).astype(np.uint16)


def write_tensor(f, rng, shape, kind, chunk):
    n = int(np.prod(shape))
    if kind == "norm":
        f.write(to_bf16(np.ones(n, np.float32)).tobytes())
        return
    # Uniform on [-a, a] has standard deviation a / sqrt(3).
    a = np.float32(STD * np.sqrt(3.0))
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        u = rng.random(m, dtype=np.float32)
        u *= 2 * a
        u -= a
        f.write(to_bf16(u).tobytes())


def check_tokenizer(tokenizer_dir, vocab):
    try:
        import sentencepiece as spm
    except ImportError:
        print("make_checkpoint: sentencepiece is not installed; tokenizer size not checked",
              file=sys.stderr)
        return
    sp = spm.SentencePieceProcessor(model_file=os.path.join(tokenizer_dir, "tokenizer.model"))
    if sp.get_piece_size() != vocab:
        sys.exit(f"make_checkpoint: {tokenizer_dir}/tokenizer.model has {sp.get_piece_size()} "
                 f"pieces, the config's vocab_size is {vocab}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="a Mixtral config.json")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer_dir", default=os.path.join(REPO, "models", "tiny-moe"))
    ap.add_argument("--chunk", type=int, default=1 << 22, help="float32 elements at once")
    args = ap.parse_args()

    with open(args.config) as f:
        config = json.load(f)
    shapes = tensor_shapes(config)
    check_tokenizer(args.tokenizer_dir, config["vocab_size"])

    header, offset = {}, 0
    for name, shape, _ in shapes:
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)

    os.makedirs(args.out, exist_ok=True)
    final = os.path.join(args.out, "model.safetensors")
    partial = final + ".partial"
    rng = np.random.default_rng(args.seed)
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape, kind in shapes:
            write_tensor(f, rng, shape, kind, args.chunk)
        written = f.tell()
    if written != 8 + len(text) + offset:
        sys.exit(f"make_checkpoint: wrote {written} bytes, expected {8 + len(text) + offset}")
    os.replace(partial, final)
    shutil.copyfile(args.config, os.path.join(args.out, "config.json"))
    for name in ("tokenizer.model", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(args.tokenizer_dir, name), os.path.join(args.out, name))
    params = offset // 2
    print(f"make_checkpoint: {final}: {len(shapes)} tensors, {params / 1e9:.3f} B parameters, "
          f"{written / 1e9:.2f} GB (seed {args.seed})")


if __name__ == "__main__":
    main()
