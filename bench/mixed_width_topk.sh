#!/usr/bin/env bash
# The fine-grained quality curve of docs/mixed-width.md ("Top-k tiers on the fine-grained
# model"): models/tiny-fg-moe (64 experts, top-8, a shared expert) with its neurons reordered,
# all experts kept; a plan chosen by `tandem tier --max_accuracy_loss 0.036` on the validation
# split and checked on the test split; top-k tier plans at several cut-offs; each scored by
# `tandem eval --mode handoff` (full prefill, mixed-width decode) on the test split beside the
# two equal-bytes baselines (uniform narrowing, adaptive top-k) at the bytes it ran. Writes
# table.md, curve.png (accuracy loss against expert bytes) and perplexity.png
# (bench/plot_mixed_width.sh). Needs a build (scripts/build.sh), gnuplot and jq
# (scripts/setup.sh).
#   bench/mixed_width_topk.sh [OUT_DIR]   (default build/mixed-width-topk)
# About 15 minutes on 2 cores; a rerun into the same OUT_DIR keeps the plans and results it has
# and chooses the budget plan again.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/mixed-width-topk}
mkdir -p "$out"
model=models/tiny-fg-moe
stats=$model/pruning/calibration-valid.json
valid=models/tiny-moe/eval/valid.txt  # the same validation split (models/tiny-fg-moe/README.md)
test_text=$model/eval/test.txt
tandem=build/bin/tandem
# Greedy continuations of the first 32 prompts (the scored text is the whole test split).
head -n 32 "$model/eval/prompts.txt" > "$out/prompts.txt"
eval_args=(--text "$test_text" --prompts "$out/prompts.txt" --context 128 --near_tokens 32
  --max_tokens 64 --stop=".,?,!")
{
  $tandem reorder --model "$model" --stats "$stats" --out "$out/reordered"
  $tandem prune --stats "$stats" --criterion frequency --keep 64 --out "$out/keep64.json"
  echo "== full"
  [[ -s $out/full.eval.json ]] || $tandem eval --model "$out/reordered" --mode full "${eval_args[@]}" --out "$out/full.eval.json"
  echo "== budget 3.6%"
  $tandem tier --plan "$out/keep64.json" --stats "$stats" --model "$out/reordered" \
    --max_accuracy_loss 0.036 --text "$valid" --heldout_text "$test_text" --out "$out/budget.json"
  # name hot_share warm_share warm_width warm_widths cold_widths ("-": the pair rule of issue
  # #16, rank 1 narrowed or skipped and ranks 2-7 full). skip-*: Warm narrows the tail ranks and
  # Cold skips them; narrow-*: Warm narrows every rank after the first, Cold every rank.
  settings=(
    "pair-h70-w20 0.7 0.2 48 - -"
    "skip-h70-w20-t4 0.7 0.2 48 96,96,96,96,48,48,48,48 96,96,96,96,0,0,0,0"
    "skip-h30-w40-t6 0.3 0.4 24 96,96,24,24,24,24,24,24 96,96,0,0,0,0,0,0"
    "skip-h10-w50-t7 0.1 0.5 24 96,24,24,24,24,24,24,24 96,0,0,0,0,0,0,0"
    "narrow-h50-w30 0.5 0.3 64 96,64,64,64,64,64,64,64 64,32,32,32,32,32,32,32"
    "narrow-h30-w40 0.3 0.4 48 96,48,48,48,48,48,48,48 48,32,32,32,32,32,32,32"
    "narrow-h10-w50 0.1 0.5 48 96,48,48,48,48,48,48,48 48,24,24,24,24,24,24,24"
    "narrow-h10-w50-third 0.1 0.5 32 96,32,32,32,32,32,32,32 32,16,16,16,16,16,16,16"
  )
  for setting in "${settings[@]}"; do
    read -r name hot warm width warm_widths cold_widths <<<"$setting"
    [[ -s $out/$name.json ]] && continue  # a rerun keeps the plans it has
    widths=()
    if [[ $warm_widths != - ]]; then
      widths=(--warm_widths "$warm_widths" --cold_widths "$cold_widths")
    fi
    $tandem tier --plan "$out/keep64.json" --stats "$stats" --model "$out/reordered" \
      --hot_share "$hot" --warm_share "$warm" --warm_width "$width" "${widths[@]}" \
      --out "$out/$name.json"
  done
  for name in budget "${settings[@]%% *}"; do
    # A rerun evaluates only plans newer than their results (the budget's is chosen again).
    [[ -s $out/$name.eval.json && $out/$name.eval.json -nt $out/$name.json ]] && continue
    echo "== $name"
    $tandem eval --model "$out/reordered" --plan "$out/$name.json" --mode handoff \
      --baselines uniform,adaptive "${eval_args[@]}" --out "$out/$name.eval.json"
  done
} 2>&1 | tee "$out/log.txt"

bench/plot_mixed_width.sh "$out"
