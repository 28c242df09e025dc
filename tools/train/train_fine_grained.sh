#!/usr/bin/env bash
# Reproduces models/tiny-fg-moe and tests/golden/tiny-fg-moe from scratch: installs the
# training packages, fetches and splits the corpus exactly as for tiny-moe (same seed, same
# documents), takes tiny-moe's tokenizer as it is shipped, trains the fine-grained Qwen2-MoE
# model of tools/train/configs/tiny-fg-moe.json (about an hour and a half on 2 cores), exports,
# measures, writes the model card and the golden references.
# Scratch files go to $TANDEM_TRAIN_WORK (default: build/train-work-fg); nothing there is
# committed.
set -euo pipefail
cd "$(dirname "$0")/../.."
work="${TANDEM_TRAIN_WORK:-$PWD/build/train-work-fg}"
model=models/tiny-fg-moe
scripts/setup.sh --train
mkdir -p "$work" "$model"
py=/usr/bin/python3
$py tools/train/prepare_data.py --work "$work" --model-dir "$model"
# The same tokens as tiny-moe: its shipped tokenizer, not a retrained one (SentencePiece's
# training is not bit-reproducible across runs).
cp models/tiny-moe/tokenizer.model "$work/tokenizer.model"
cp models/tiny-moe/eval/prompts.txt "$model/eval/prompts.txt"
# One stage, load balancing per layer from the start (tiny-moe's stage 2 lesson). The shipped
# checkpoint is step 825 of a 1100-step cosine schedule: the run was stopped there to fit the
# session it was trained in (its validation perplexity had passed tiny-moe's), so this stops
# there too.
OMP_WAIT_POLICY=PASSIVE $py tools/train/train.py --work "$work" \
  --model-config tools/train/configs/tiny-fg-moe.json --steps 1100 --warmup 60 \
  --eval-every 275 --balance per-layer --aux-coef 0.05 --stop-at-step 825
$py tools/train/export.py --work "$work" --checkpoint best.pt --model-dir "$model"
$py tools/train/model_card.py --model-dir "$model" --train-log "$work/train.log"
$py tools/train/golden.py --model-dir "$model" --out tests/golden/tiny-fg-moe
