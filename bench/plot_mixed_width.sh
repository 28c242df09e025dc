#!/usr/bin/env bash
# The table and charts of bench/mixed_width_topk.sh's results: every *.eval.json in DIR (full
# is the full model's; budget the plan chosen by a budget; skip-* / pair-* / narrow-* the tier
# plans by family), each row a plan or one of its equal-bytes baselines. Writes DIR/table.md,
# DIR/curve.png (accuracy loss against expert bytes) and DIR/perplexity.png. Needs gnuplot and
# jq (scripts/setup.sh).
#   bench/plot_mixed_width.sh DIR
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
out=$1
for tool in gnuplot jq; do
  command -v "$tool" >/dev/null || { echo "$0: needs $tool (scripts/setup.sh)" >&2; exit 1; }
done
[[ -s $out/full.eval.json ]] || { echo "$0: $out/full.eval.json missing" >&2; exit 1; }
full_acc=$(jq '.modes[0].accuracy' "$out/full.eval.json")
full_ppl=$(jq '.modes[0].perplexity' "$out/full.eval.json")
plans=()
for f in "$out"/*.eval.json; do
  name=$(basename "$f" .eval.json)
  [[ $name == full ]] || plans+=("$name")
done
# Rows by the plan's expert bytes, each plan followed by its baselines.
{
  echo "| plan | run | expert bytes | perplexity | perplexity loss | accuracy | accuracy loss | exact | prefix |"
  echo "|---|---|---|---|---|---|---|---|---|"
  jq -r '"| full width | - | 100% | \(.modes[0].perplexity * 100 | round / 100) | - | \(.modes[0].accuracy * 1000 | round / 1000) | - | 1 | 1 |"' \
    "$out/full.eval.json"
  for name in "${plans[@]}"; do
    jq -r --arg name "$name" --argjson acc "$full_acc" --argjson ppl "$full_ppl" '
      (.modes[0].expert_bytes_vs_full_width | tostring) + "\t" + ([.modes[] |
      "| \($name) | \(.baseline // "tiers") | \(.expert_bytes_vs_full_width * 1000 | round / 10)% | \(.perplexity * 100 | round / 100) | \(((.perplexity / $ppl) - 1) * 1000 | round / 10)% | \(.accuracy * 1000 | round / 1000) | \((($acc - .accuracy) / $acc) * 1000 | round / 10)% | \(.generation.exact_agreement * 100 | round / 100) | \(.generation.prefix_agreement * 100 | round / 100) |"] | join("\u001f"))' \
      "$out/$name.eval.json"
  done | sort -t$'\t' -k1,1gr | cut -f2- | tr '\037' '\n'
} > "$out/table.md"
# Series: x = expert bytes %, accuracy loss %, perplexity loss %.
series() {  # RUN GLOB...: the plans whose names match one of the globs
  local run=$1 name glob match
  shift
  for name in "${plans[@]}"; do
    match=0
    for glob in "$@"; do
      # shellcheck disable=SC2053
      [[ $name == $glob ]] && match=1
    done
    ((match)) || continue
    jq -r --arg run "$run" --argjson acc "$full_acc" --argjson ppl "$full_ppl" '.modes[] |
      select((.baseline // "tiers") == $run) |
      "\(.expert_bytes_vs_full_width * 100) \((($acc - .accuracy) / $acc) * 100) \(((.perplexity / $ppl) - 1) * 100)"' \
      "$out/$name.eval.json"
  done | sort -n
}
series tiers 'skip-*' 'pair-*' > "$out/skip.dat"
series tiers 'narrow-*' > "$out/narrow.dat"
series tiers budget > "$out/budget.dat"
series uniform '*' > "$out/uniform.dat"
series adaptive '*' > "$out/adaptive.dat"
for chart in curve:2:"top-1 accuracy loss, %" perplexity:3:"perplexity increase, %"; do
  IFS=: read -r file column label <<<"$chart"
  gnuplot <<GP
set terminal pngcairo size 800,500 noenhanced
set output "$out/$file.png"
set title "tiny-fg-moe, test split: $label against expert bytes (handoff decode)"
set xlabel "expert bytes, % of full width"
set ylabel "$label"
set grid
set key top right
$( [[ $column == 2 ]] && echo 'set arrow from graph 0, first 3.6 to graph 1, first 3.6 nohead dt 2' )
plot "$out/skip.dat" using 1:$column with linespoints title "tiers, skipping tail ranks", \\
     "$out/narrow.dat" using 1:$column with linespoints title "tiers, narrowing every rank", \\
     "$out/uniform.dat" using 1:$column with linespoints title "uniform narrowing", \\
     "$out/adaptive.dat" using 1:$column with linespoints title "adaptive top-k", \\
     "$out/budget.dat" using 1:$column with points pt 7 ps 2 title "chosen by --max_accuracy_loss 0.036"
GP
done
cat "$out/table.md"
echo "table in $out/table.md, charts in $out/curve.png and $out/perplexity.png"
