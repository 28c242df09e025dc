#!/usr/bin/env bash
# Decode throughput at equal resident cache bytes for top-k tiers (docs/mixed-width.md,
# "Streaming the fine-grained model"): tandem_expert_stream_bench with experts read from an
# O_DIRECT pack, full-width streaming vs the tier plan chosen by `tandem tier
# --max_accuracy_loss 0.036` and both equal-bytes baselines, bf16 and int4, batch 1 / 4 / 16,
# on models/tiny-fg-moe and on bench/configs/dummy-fg-wide (its shape with experts of 768,
# random weights, tiny-fg-moe's routing of the test split replayed). The cache is a quarter of
# the bf16 expert bytes in every run. Run bench/mixed_width_topk.sh first (it makes the
# reordered model and the chosen plan). About 15 minutes on 2 cores.
#   bench/mixed_width_topk_stream.sh [OUT_DIR]   (default build/mixed-width-topk)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/mixed-width-topk}
tandem=build/bin/tandem
bench=build/bin/tandem_expert_stream_bench
stats=models/tiny-fg-moe/pruning/calibration-valid.json
for f in "$out/reordered" "$out/budget.json" "$out/keep64.json"; do
  [[ -e $f ]] || { echo "$0: $f missing: run bench/mixed_width_topk.sh first" >&2; exit 1; }
done
{
  [[ -d $out/reordered-int4 ]] ||
    $tandem quantize --model "$out/reordered" --bits 4 --out "$out/reordered-int4"
  # A quarter of the bf16 expert bytes: 6 layers x 64 experts x 3 x 96 x 192 x 2 bytes.
  cache=$((6 * 64 * 3 * 96 * 192 * 2 / 4))
  for model in reordered reordered-int4; do
    echo "== tiny-fg-moe $model"
    $bench --model "$out/$model" --plan "$out/budget.json" --batches 1,4,16 --cache_bytes $cache
  done
  # The chosen plan's tiers on the wider experts: its widths scaled from 96 to 768 neurons.
  read -r hot warm narrow warm_widths cold_widths < <(jq -r '.tiers |
    "\(.hotShare // 0) \(.warmShare // 0) \(.warmWidth * 8) \(.warmWidths // [] | map(. * 8) | join(",")) \(.coldWidths // [] | map(. * 8) | join(","))"' \
    "$out/budget.json")
  widths=()
  [[ -n $warm_widths ]] && widths+=(--warm_widths "$warm_widths")
  [[ -n $cold_widths ]] && widths+=(--cold_widths "$cold_widths")
  $tandem tier --plan "$out/keep64.json" --stats "$stats" --model bench/configs/dummy-fg-wide \
    --hot_share "$hot" --warm_share "$warm" --warm_width "$narrow" "${widths[@]}" \
    --out "$out/budget-wide.json"
  cache=$((6 * 64 * 3 * 768 * 1024 * 2 / 4))
  for model in dummy-fg-wide dummy-fg-wide-int4; do
    echo "== $model"
    $bench --model "bench/configs/$model" --load_format dummy --trace_model models/tiny-fg-moe \
      --trace_text models/tiny-fg-moe/eval/test.txt --plan "$out/budget-wide.json" \
      --batches 1,4,16 --cache_bytes $cache
  done
} 2>&1 | tee "$out/stream.log"
