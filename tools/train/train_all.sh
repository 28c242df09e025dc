#!/usr/bin/env bash
# Reproduces models/tiny-moe and tests/golden/tiny-moe from scratch: installs the training
# packages, fetches and splits the corpus, trains the tokenizer and the model (about an hour
# on 2 cores), exports, measures, writes the model card and the golden references.
# Scratch files go to $TANDEM_TRAIN_WORK (default: build/train-work); nothing there is committed.
set -euo pipefail
cd "$(dirname "$0")/../.."
work="${TANDEM_TRAIN_WORK:-$PWD/build/train-work}"
scripts/setup.sh --train
mkdir -p "$work"
py=/usr/bin/python3
$py tools/train/prepare_data.py --work "$work" --model-dir models/tiny-moe
# Stage 1: 800 steps with Hugging Face's load-balancing loss (all layers' router logits
# concatenated). It balances experts across layers but lets each layer collapse onto a few.
$py tools/train/train.py --work "$work"
# Stage 2: 250 steps from stage 1 with the balancing loss per layer, which spreads each
# layer's routing again.
cp "$work/best.pt" "$work/stage1.pt"
$py tools/train/export.py --work "$work" --checkpoint stage1.pt --model-dir models/tiny-moe
cp models/tiny-moe/eval/metrics.json "$work/metrics_stage1.json"
$py tools/train/train.py --work "$work" --init "$work/stage1.pt" --balance per-layer \
  --aux-coef 0.1 --steps 250 --warmup 20 --lr 5e-4 --eval-every 125 --seed 4321 --tag=_stage2
$py tools/train/export.py --work "$work" --checkpoint best_stage2.pt --model-dir models/tiny-moe
$py tools/train/model_card.py --model-dir models/tiny-moe --train-log "$work/train.log" \
  --stage2-log "$work/train_stage2.log" --stage1-metrics "$work/metrics_stage1.json"
$py tools/train/golden.py --model-dir models/tiny-moe --out tests/golden/tiny-moe
