#!/usr/bin/python3
"""Converts a Hugging Face Mixtral checkpoint directory to a GGUF file for llama.cpp.

    hf_to_gguf.py CHECKPOINT_DIR OUT.gguf [--outtype bf16|f32]

The GGUF describes architecture `llama` with experts, the way llama.cpp loads Mixtral:
matrices in --outtype (bf16 by default), RMSNorm weights and the router in f32 (llama.cpp
aborts on a bf16 norm at the first decode), each layer's experts stacked into one 3-D
tensor per projection, and the SentencePiece vocabulary of tokenizer.model. Only this
repository's bench uses it; Tandem itself never reads GGUF.

The GGUF layout (version 3, little-endian): "GGUF", version u32, tensor count u64, key/value
count u64; the key/value pairs (key string, value type u32, value); per tensor its name,
dimension count u32, dimensions u64 (innermost first, so a row-major [rows, cols] matrix is
[cols, rows]), ggml type u32 and data offset u64; then, aligned to general.alignment (32),
the tensors' data, each at an aligned offset. Strings are a u64 length and UTF-8 bytes;
arrays an element type u32, a count u64 and the elements.

llama.cpp's `llama` architecture rotates adjacent pairs (x[2i], x[2i+1]) of each head, while
Hugging Face's rotate_half pairs x[i] with x[i + head_dim/2]; the rows of q_proj and k_proj
are therefore reordered within each head, first half and second half interleaved. Both q and
k get the same order, so every attention score is unchanged.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

# gguf_type
GGUF_U8, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL = range(8)
GGUF_STRING, GGUF_ARRAY, GGUF_U64, GGUF_I64, GGUF_F64 = range(8, 13)
# ggml_type
GGML_F32, GGML_BF16 = 0, 30
GGML_ELEMENT_SIZE = {GGML_F32: 4, GGML_BF16: 2}
# llama_ftype
FTYPE = {GGML_F32: 0, GGML_BF16: 32}
# llama_token_type
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 5, 6
ALIGNMENT = 32


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


_SCALAR = {GGUF_U8: "<B", GGUF_I8: "<b", GGUF_U16: "<H", GGUF_I16: "<h", GGUF_U32: "<I",
           GGUF_I32: "<i", GGUF_F32: "<f", GGUF_BOOL: "<?", GGUF_U64: "<Q", GGUF_I64: "<q",
           GGUF_F64: "<d"}
_NUMPY = {GGUF_U32: "<u4", GGUF_I32: "<i4", GGUF_F32: "<f4"}


def _value(gtype, value):
    if gtype == GGUF_STRING:
        return _string(value)
    return struct.pack(_SCALAR[gtype], value)


class GgufWriter:
    """Collects key/value pairs and tensor descriptions, then streams the file out."""

    def __init__(self):
        self.kvs = []      # (key, encoded type and value)
        self.tensors = []  # (name, dims innermost first, ggml type, nbytes, write(f))

    def add(self, key, gtype, value):
        self.kvs.append((key, struct.pack("<I", gtype) + _value(gtype, value)))

    def add_array(self, key, elem_type, values):
        head = struct.pack("<IIQ", GGUF_ARRAY, elem_type, len(values))
        if elem_type == GGUF_STRING:
            body = b"".join(_string(v) for v in values)
        else:
            body = np.asarray(values, dtype=_NUMPY[elem_type]).tobytes()
        self.kvs.append((key, head + body))

    def add_tensor(self, name, dims, ggml_type, write):
        nbytes = int(np.prod(dims)) * GGML_ELEMENT_SIZE[ggml_type]
        self.tensors.append((name, list(dims), ggml_type, nbytes, write))

    def write(self, path):
        self.add("general.alignment", GGUF_U32, ALIGNMENT)
        infos, offset = [], 0
        for name, dims, ggml_type, nbytes, _ in self.tensors:
            infos.append(_string(name) + struct.pack("<I", len(dims)) +
                         struct.pack(f"<{len(dims)}Q", *dims) +
                         struct.pack("<IQ", ggml_type, offset))
            offset += nbytes + (-nbytes % ALIGNMENT)
        partial = path + ".partial"
        with open(partial, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kvs)))
            for key, encoded in self.kvs:
                f.write(_string(key) + encoded)
            for info in infos:
                f.write(info)
            f.write(b"\0" * (-f.tell() % ALIGNMENT))
            data_start = f.tell()
            for name, _, _, nbytes, write in self.tensors:
                start = f.tell()
                write(f)
                if f.tell() - start != nbytes:
                    sys.exit(f"hf_to_gguf: {name}: wrote {f.tell() - start} bytes, "
                             f"expected {nbytes}")
                f.write(b"\0" * (-f.tell() % ALIGNMENT))
            total = f.tell()
        if total - data_start != offset:
            sys.exit(f"hf_to_gguf: data section is {total - data_start} bytes, expected {offset}")
        os.replace(partial, path)
        return total


class Checkpoint:
    """The tensors of a safetensors checkpoint (one file or an index of shards), memory-mapped."""

    def __init__(self, directory):
        index = os.path.join(directory, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self.entries = {}
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            data = np.memmap(path, dtype=np.uint8, mode="r")
            for tensor, info in header.items():
                if tensor != "__metadata__":
                    self.entries[tensor] = (data, 8 + n, info)

    def raw(self, name):
        """(dtype string, shape, uint8 view of the bytes)."""
        if name not in self.entries:
            sys.exit(f"hf_to_gguf: the checkpoint has no tensor {name}")
        data, base, info = self.entries[name]
        begin, end = info["data_offsets"]
        return info["dtype"], tuple(info["shape"]), data[base + begin:base + end]

    def as_bf16(self, name):
        """uint16 bf16 bits, shaped."""
        dtype, shape, raw = self.raw(name)
        if dtype == "BF16":
            return raw.view("<u2").reshape(shape)
        return _f32_to_bf16(self.as_f32(name))

    def as_f32(self, name):
        dtype, shape, raw = self.raw(name)
        if dtype == "BF16":
            return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        if dtype == "F16":
            return raw.view("<f2").astype(np.float32).reshape(shape)
        if dtype == "F32":
            return raw.view("<f4").reshape(shape)
        sys.exit(f"hf_to_gguf: {name} has dtype {dtype}; BF16, F16 and F32 are supported")


def _f32_to_bf16(x):
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    bits = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (bits >> np.uint32(16)).astype(np.uint16)


def interleave_rope_rows(w, heads):
    """Rows of a q or k projection (heads * head_dim, in) from rotate_half order to adjacent
    pairs: within each head, new row 2i is old row i and new row 2i+1 is old row i + head_dim/2."""
    rows = w.shape[0]
    head_dim = rows // heads
    half = head_dim // 2
    order = np.empty(rows, dtype=np.int64)
    for h in range(heads):
        first = h * head_dim + np.arange(half)
        order[h * head_dim:(h + 1) * head_dim:2] = first
        order[h * head_dim + 1:(h + 1) * head_dim:2] = first + half
    return w[order]


def read_vocabulary(directory, config):
    """(tokens, scores, token types, add_space_prefix) from tokenizer.model."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(directory, "tokenizer.model"))
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(TOKEN_UNKNOWN)
        elif sp.is_control(i):
            types.append(TOKEN_CONTROL)
        elif sp.is_unused(i):
            types.append(TOKEN_UNUSED)
        elif sp.is_byte(i):
            types.append(TOKEN_BYTE)
        else:
            types.append(TOKEN_NORMAL)
    vocab = config["vocab_size"]
    if len(tokens) > vocab:
        sys.exit(f"hf_to_gguf: tokenizer.model has {len(tokens)} pieces, vocab_size is {vocab}")
    for i in range(len(tokens), vocab):  # embedding rows past the tokenizer's pieces
        tokens.append(f"[PAD{i}]")
        scores.append(0.0)
        types.append(TOKEN_UNUSED)
    # SentencePiece's add_dummy_prefix shows as a word-boundary mark on a lone word.
    add_space_prefix = sp.encode_as_pieces("a")[0].startswith("\u2581")
    ids = {"bos": sp.bos_id(), "eos": sp.eos_id(), "unk": sp.unk_id(), "pad": sp.pad_id()}
    return tokens, scores, types, add_space_prefix, ids


def convert(directory, out_path, outtype):
    with open(os.path.join(directory, "config.json")) as f:
        c = json.load(f)
    if c.get("model_type") != "mixtral":
        sys.exit(f"hf_to_gguf: model_type {c.get('model_type')!r}; only mixtral is supported")
    if c.get("rope_scaling"):
        sys.exit("hf_to_gguf: rope_scaling is not supported")
    tokenizer_config = {}
    tc_path = os.path.join(directory, "tokenizer_config.json")
    if os.path.exists(tc_path):
        with open(tc_path) as f:
            tokenizer_config = json.load(f)

    h = c["hidden_size"]
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or h // heads
    ff = c["intermediate_size"]
    experts = c["num_local_experts"]
    layers = c["num_hidden_layers"]
    vocab = c["vocab_size"]
    matrix_type = {"bf16": GGML_BF16, "f32": GGML_F32}[outtype]

    ckpt = Checkpoint(directory)
    w = GgufWriter()
    w.add("general.architecture", GGUF_STRING, "llama")
    w.add("general.name", GGUF_STRING, os.path.basename(os.path.normpath(directory)))
    w.add("general.file_type", GGUF_U32, FTYPE[matrix_type])
    arch = "llama."
    w.add(arch + "vocab_size", GGUF_U32, vocab)
    w.add(arch + "context_length", GGUF_U32, c.get("max_position_embeddings", 4096))
    w.add(arch + "embedding_length", GGUF_U32, h)
    w.add(arch + "block_count", GGUF_U32, layers)
    w.add(arch + "feed_forward_length", GGUF_U32, ff)
    w.add(arch + "attention.head_count", GGUF_U32, heads)
    w.add(arch + "attention.head_count_kv", GGUF_U32, kv_heads)
    w.add(arch + "attention.key_length", GGUF_U32, head_dim)
    w.add(arch + "attention.value_length", GGUF_U32, head_dim)
    w.add(arch + "rope.dimension_count", GGUF_U32, head_dim)
    # Defaults as in Tandem's mixtral table (common/model/config.cc).
    w.add(arch + "rope.freq_base", GGUF_F32, float(c.get("rope_theta") or 1e6))
    w.add(arch + "attention.layer_norm_rms_epsilon", GGUF_F32, float(c.get("rms_norm_eps") or 1e-5))
    w.add(arch + "expert_count", GGUF_U32, experts)
    w.add(arch + "expert_used_count", GGUF_U32, c["num_experts_per_tok"])

    tokens, scores, types, add_space_prefix, sp_ids = read_vocabulary(directory, c)
    bos = c.get("bos_token_id", sp_ids["bos"])
    eos = c.get("eos_token_id", sp_ids["eos"])
    w.add("tokenizer.ggml.model", GGUF_STRING, "llama")
    w.add_array("tokenizer.ggml.tokens", GGUF_STRING, tokens)
    w.add_array("tokenizer.ggml.scores", GGUF_F32, scores)
    w.add_array("tokenizer.ggml.token_type", GGUF_I32, types)
    w.add("tokenizer.ggml.bos_token_id", GGUF_U32, bos)
    w.add("tokenizer.ggml.eos_token_id", GGUF_U32, eos)
    if sp_ids["unk"] >= 0:
        w.add("tokenizer.ggml.unknown_token_id", GGUF_U32, sp_ids["unk"])
    if sp_ids["pad"] >= 0:
        w.add("tokenizer.ggml.padding_token_id", GGUF_U32, sp_ids["pad"])
    w.add("tokenizer.ggml.add_bos_token", GGUF_BOOL, bool(tokenizer_config.get("add_bos_token", True)))
    w.add("tokenizer.ggml.add_eos_token", GGUF_BOOL, bool(tokenizer_config.get("add_eos_token", False)))
    w.add("tokenizer.ggml.add_space_prefix", GGUF_BOOL, add_space_prefix)

    def load_matrix(hf_name, expect):
        m = ckpt.as_bf16(hf_name) if matrix_type == GGML_BF16 else ckpt.as_f32(hf_name)
        if m.shape != expect:
            sys.exit(f"hf_to_gguf: {hf_name} has shape {m.shape}, expected {expect}")
        return m

    def matrix(gguf_name, hf_name, expect, rope_heads=0):
        def write(f):
            m = load_matrix(hf_name, expect)
            if rope_heads:
                m = interleave_rope_rows(m, rope_heads)
            f.write(np.ascontiguousarray(m).data)
        w.add_tensor(gguf_name, expect[::-1], matrix_type, write)

    def stacked(gguf_name, hf_names, expect):
        def write(f):
            for hf_name in hf_names:
                f.write(np.ascontiguousarray(load_matrix(hf_name, expect)).data)
        w.add_tensor(gguf_name, expect[::-1] + (len(hf_names),), matrix_type, write)

    def f32(gguf_name, hf_name, expect):
        def write(f):
            m = ckpt.as_f32(hf_name)
            if m.shape != expect:
                sys.exit(f"hf_to_gguf: {hf_name} has shape {m.shape}, expected {expect}")
            f.write(np.ascontiguousarray(m, dtype=np.float32).data)
        w.add_tensor(gguf_name, expect[::-1], GGML_F32, write)

    matrix("token_embd.weight", "model.embed_tokens.weight", (vocab, h))
    for i in range(layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        moe = p + "block_sparse_moe."
        f32(b + "attn_norm.weight", p + "input_layernorm.weight", (h,))
        matrix(b + "attn_q.weight", p + "self_attn.q_proj.weight", (heads * head_dim, h), heads)
        matrix(b + "attn_k.weight", p + "self_attn.k_proj.weight", (kv_heads * head_dim, h),
               kv_heads)
        matrix(b + "attn_v.weight", p + "self_attn.v_proj.weight", (kv_heads * head_dim, h))
        matrix(b + "attn_output.weight", p + "self_attn.o_proj.weight", (h, heads * head_dim))
        f32(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", (h,))
        f32(b + "ffn_gate_inp.weight", moe + "gate.weight", (experts, h))
        # Mixtral's w1 is the gate projection, w3 the up projection, w2 the down projection.
        experts_of = [f"{moe}experts.{e}." for e in range(experts)]
        stacked(b + "ffn_gate_exps.weight", [e + "w1.weight" for e in experts_of], (ff, h))
        stacked(b + "ffn_up_exps.weight", [e + "w3.weight" for e in experts_of], (ff, h))
        stacked(b + "ffn_down_exps.weight", [e + "w2.weight" for e in experts_of], (h, ff))
    f32("output_norm.weight", "model.norm.weight", (h,))
    if not c.get("tie_word_embeddings", False):
        matrix("output.weight", "lm_head.weight", (vocab, h))
    # Tied embeddings: llama.cpp uses token_embd for the output when output is absent.

    total = w.write(out_path)
    print(f"hf_to_gguf: {out_path}: {len(w.tensors)} tensors, {len(w.kvs)} keys, "
          f"{total / 1e9:.2f} GB ({outtype} matrices; norms and router f32)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="directory with config.json, model.safetensors, "
                                       "tokenizer.model")
    ap.add_argument("out", help="the GGUF file to write")
    ap.add_argument("--outtype", choices=["bf16", "f32"], default="bf16")
    args = ap.parse_args()
    convert(args.checkpoint, args.out, args.outtype)


if __name__ == "__main__":
    main()
