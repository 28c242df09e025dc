#!/usr/bin/env python3
"""Writes the generated seeds of tests/fuzz/corpus (standard library only, deterministic).

The other seeds are copies of shipped files (models/tiny-moe's config.json, chat template and
pruning plans, golden .npy files); inputs that crashed a harness are kept beside them under
their libFuzzer names. Run from anywhere: python3 tests/fuzz/make_seeds.py
"""
import json
import os
import struct

ROOT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(ROOT))
CORPUS = os.path.join(ROOT, "corpus")


def write(harness, name, data):
    os.makedirs(os.path.join(CORPUS, harness), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(CORPUS, harness, name), "wb") as f:
        f.write(data)


def copy(harness, name, path):
    with open(os.path.join(REPO, path), "rb") as f:
        write(harness, name, f.read())


# safetensors: 8-byte little-endian header length, JSON header, then the tensors' bytes.
def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def f32(*values):
    return struct.pack("<%df" % len(values), *values)


# .npy: magic, version, header length, a Python dict literal padded to 64 bytes, then data.
def npy(descr, shape, raw, version=1):
    shape_text = "(%s)" % ("".join("%d," % d for d in shape) if len(shape) == 1 else
                           ", ".join(str(d) for d in shape))
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    length_bytes = 2 if version == 1 else 4
    pad = -(6 + 2 + length_bytes + len(header) + 1) % 64
    header = (header + " " * pad + "\n").encode()
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header + raw


# Expert pack: a 4096-byte text header, then per expert `intermediate` bundles of 3 x hidden
# bf16 (gate row, up row, down column), padded to 4096 bytes.
def expert_pack(layers, experts, hidden, intermediate):
    header = ("tandem-expert-pack v1 layers %d experts %d hidden %d intermediate %d\n" %
              (layers, experts, hidden, intermediate)).encode()
    out = header + b"\0" * (4096 - len(header))
    value = 0
    for _ in range(layers * experts):
        expert = b""
        for _ in range(intermediate * 3 * hidden):
            expert += struct.pack("<H", 0x3F80 + value % 64)
            value += 1
        out += expert + b"\0" * (-len(expert) % 4096)
    return out


def main():
    # config
    copy("config", "tiny-moe.json", "models/tiny-moe/config.json")
    write("config", "qwen3-moe.json", json.dumps({
        "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 16,
        "moe_intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "num_experts": 8, "num_experts_per_tok": 2,
        "norm_topk_prob": True, "use_sliding_window": False, "sliding_window": 32,
        "eos_token_id": [1, 2], "bos_token_id": 0, "rope_scaling": None,
        "mlp_only_layers": [], "decoder_sparse_step": 1, "tie_word_embeddings": True}, indent=1))
    write("config", "qwen2-moe.json", json.dumps({
        "model_type": "qwen2_moe", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
        "moe_intermediate_size": 8, "shared_expert_intermediate_size": 24,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_experts": 8,
        "num_experts_per_tok": 4, "norm_topk_prob": False, "qkv_bias": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [0], "use_sliding_window": False}, indent=1))
    write("config", "deepseek.json", json.dumps({
        "model_type": "deepseek", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
        "moe_intermediate_size": 8, "n_routed_experts": 8, "n_shared_experts": 2,
        "num_experts_per_tok": 3, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "num_hidden_layers": 3, "num_attention_heads": 4, "norm_topk_prob": False,
        "scoring_func": "softmax", "attention_bias": False}, indent=1))
    copy("config", "tiny-fg-moe.json", "tools/train/configs/tiny-fg-moe.json")
    copy("config", "qwen3-5-moe.json", "tests/golden/arch/qwen3_5_moe_hybrid/config.json")
    copy("config", "deepseek-v2.json", "tests/golden/arch/deepseek_v2_latent_yarn/config.json")
    copy("config", "deepseek-v3.json", "tests/golden/arch/deepseek_v3_sigmoid_groups/config.json")
    write("config", "minimal-mixtral.json",
          '{"model_type":"mixtral","vocab_size":8,"hidden_size":4,"intermediate_size":2,'
          '"num_hidden_layers":1,"num_attention_heads":1,"num_local_experts":2,'
          '"num_experts_per_tok":1}')

    # safetensors
    write("safetensors", "two-tensors.safetensors", safetensors(
        [("a", "F32", [2, 2], f32(1, 2, 3, 4)), ("b", "BF16", [3], b"\x80\x3f" * 3)],
        metadata={"format": "pt"}))
    write("safetensors", "empty-tensor.safetensors", safetensors(
        [("empty", "F16", [0, 4], b""), ("scalar", "F32", [], f32(7))]))
    write("safetensors", "no-tensors.safetensors", safetensors([]))
    layer = "model.layers.0."
    write("safetensors", "mixtral-names.safetensors", safetensors(
        [("model.embed_tokens.weight", "BF16", [2, 1], b"\0\0" * 2),
         (layer + "block_sparse_moe.gate.weight", "F32", [1, 1], f32(0.5)),
         (layer + "block_sparse_moe.experts.0.w1.weight", "BF16", [1, 1], b"\0\0")]))

    # safetensors_index: over the harness's two shards, a (2), b (1, 1) and c (4).
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    write("safetensors_index", "two-shards.json", json.dumps(
        {"metadata": {"total_size": 28}, "weight_map": {"a": first, "b": first, "c": second}},
        indent=1))
    write("safetensors_index", "one-shard.json", json.dumps(
        {"weight_map": {"c": second}}))

    # npy
    copy("npy", "golden-experts.npy", "tests/golden/tiny-moe/prompt_0_experts.npy")
    copy("npy", "golden-expert-weights.npy", "tests/golden/tiny-moe/prompt_0_expert_weights.npy")
    write("npy", "f8-2x2.npy", npy("<f8", [2, 2], struct.pack("<4d", 1.5, -2, 3, 4e300)))
    write("npy", "i8-3.npy", npy("<i8", [3], struct.pack("<3q", -1, 0, 2**40)))
    write("npy", "f4-scalar.npy", npy("<f4", [], f32(3.25)))
    write("npy", "i4-empty-v2.npy", npy("<i4", [0, 5], b"", version=2))

    # tokenizer: text; its bytes are also read as token ids.
    write("tokenizer", "english.txt", "The jury said it did find that the election was conducted.")
    write("tokenizer", "utf8.txt", "naïve café — 日本語 🙂 \u00a0 \t\n")
    write("tokenizer", "invalid-utf8.bin", b"abc\xff\xfe\xc3(\xe2\x82 \xf0\x9f\x99")

    # pruning_plan: the shipped plans, one with tiers, and one valid only in part.
    copy("pruning_plan", "reap-keep4.json", "models/tiny-moe/pruning/reap-keep4.json")
    copy("pruning_plan", "frequency-keep12.json", "models/tiny-moe/pruning/frequency-keep12.json")
    with open(os.path.join(REPO, "models/tiny-moe/pruning/reap-keep4.json")) as f:
        plan = json.load(f)
    plan["tiers"] = {"hotShare": 0.7, "warmShare": 0.2, "warmWidth": 192,
                     "dominance": "DOMINANCE_ROUTER_WEIGHT"}
    tiers = ["PAIR_TIER_HOT", "PAIR_TIER_WARM", "PAIR_TIER_COLD"]
    for layer in plan["layers"]:
        experts = layer["retainedExperts"]
        layer["pairs"] = [{"a": a, "b": b, "tier": tiers[(a + b) % 3], "dominant": b,
                           "count": str(a * b)}
                          for i, a in enumerate(experts) for b in experts[i + 1:]]
    write("pruning_plan", "reap-keep4-tiers.json", json.dumps(plan, indent=1))
    plan["layers"][5]["retainedExperts"] = [3, 3]
    write("pruning_plan", "repeated-expert.json", json.dumps(plan))

    # expert_pack
    write("expert_pack", "1x1-h1-i1.pack", expert_pack(1, 1, 1, 1))
    write("expert_pack", "2x2-h2-i3.pack", expert_pack(2, 2, 2, 3))

    # chat_template: tokenizer_config.json, NUL, then NUL-separated role, content, ...
    with open(os.path.join(REPO, "models/tiny-moe/tokenizer_config.json")) as f:
        shipped = f.read()
    write("chat_template", "tiny-moe.bin",
          shipped + "\0system\0Be brief.\0user\0Where to?\0assistant\0North.\0user\0Why?")
    chatml = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}"
              "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
              "{% endif %}")
    write("chat_template", "chatml.bin",
          json.dumps({"eos_token": {"content": "<|im_end|>"}, "chat_template": chatml})
          + "\0user\0Hi\0robot\0beep")
    write("chat_template", "named.bin",
          json.dumps({"chat_template": [{"name": "default", "template": "{{ messages[0].content }}"},
                                        {"name": "tool_use", "template": "{{ tools | tojson }}"}]})
          + "\0user\0Hi")

    # structured: a mode byte (0 JSON Schema, 1 regex, 2 choices separated by NUL), then the
    # text; the seeds are tests/structured/suite.json's cases.
    with open(os.path.join(REPO, "tests/structured/suite.json")) as f:
        suite = json.load(f)
    for case in suite:
        if case["kind"] == "json_schema":
            data = b"\0" + json.dumps(case["schema"]).encode()
        elif case["kind"] == "regex":
            data = b"\1" + case["pattern"].encode()
        elif case["kind"] == "choice":
            data = b"\2" + "\0".join(case["choices"]).encode()
        else:
            continue
        write("structured", case["name"] + ".bin", data)


if __name__ == "__main__":
    main()
