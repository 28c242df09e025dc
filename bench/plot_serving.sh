#!/usr/bin/env bash
# Charts of `tandem bench serve` results against request rate. Every *.json in RESULTS_DIR is
# one run (bench/serving_bench.sh writes one per mode and rate); runs with the same "label"
# (e.g. disaggregated, colocated) form one series, and every chart has every series. The
# rate "inf" (all requests at once) is drawn one step right of the largest finite rate.
#   bench/plot_serving.sh RESULTS_DIR [OUT_DIR]   (OUT_DIR: RESULTS_DIR by default)
# Writes to OUT_DIR: throughput.png (output tokens/s), ttft.png, itl.png and e2el.png (median
# and p99, in ms). Needs gnuplot and jq (scripts/setup.sh installs both).
set -euo pipefail
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 RESULTS_DIR [OUT_DIR]" >&2
  exit 2
fi
results=$1
out=${2:-$1}
for tool in gnuplot jq; do
  command -v "$tool" >/dev/null || { echo "$0: needs $tool (scripts/setup.sh)" >&2; exit 1; }
done
shopt -s nullglob
files=("$results"/*.json)
if ((${#files[@]} == 0)); then
  echo "$0: no *.json results in $results" >&2
  exit 1
fi
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One row per run: label, rate ("inf" or a number), output tokens/s, then median and p99 of
# TTFT, ITL and E2EL.
jq -r '[(if (.label // "") == "" then "unlabelled" else .label end),
        (.request_rate | tostring),
        .output_throughput, .median_ttft_ms, .p99_ttft_ms, .median_itl_ms, .p99_itl_ms,
        .median_e2el_ms, .p99_e2el_ms] | @tsv' "${files[@]}" >"$tmp/runs.tsv"

# x positions: finite rates as they are (log2 axis), inf at twice the largest finite rate.
read -r min_x inf_x < <(awk -F'\t' '$2 != "inf" { r = $2 + 0; if (r > max) max = r;
                                                  if (min == 0 || r < min) min = r }
  END { if (max == 0) { max = 0.5; min = 1 }; if (min == 0) min = 2 * max; print min, 2 * max }' \
  "$tmp/runs.tsv")
xtics=$(awk -F'\t' -v inf_x="$inf_x" '!seen[$2]++ {
    printf "%s\"%s\" %s", (n++ ? ", " : ""), $2, ($2 == "inf" ? inf_x : $2) }' "$tmp/runs.tsv")

# One data file per label, rows sorted by x.
mapfile -t labels < <(cut -f1 "$tmp/runs.tsv" | sort -u)
for i in "${!labels[@]}"; do
  awk -F'\t' -v OFS='\t' -v label="${labels[$i]}" -v inf_x="$inf_x" \
    '$1 == label { $2 = ($2 == "inf" ? inf_x : $2); $1 = ""; sub(/^\t/, ""); print }' \
    "$tmp/runs.tsv" | sort -g -k1,1 >"$tmp/series$i.tsv"
done

if gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1; then
  terminal='pngcairo noenhanced size 900,560 font ",10"'
else
  terminal='png noenhanced size 900,560'
fi
# plot_lines COLUMN [COLUMN2]: one line per label for COLUMN (solid); with COLUMN2, a dashed one
# in the same colour beside it. Columns of the series files: 1 x, 2 output tokens/s, 3-4 TTFT
# median/p99, 5-6 ITL, 7-8 E2EL.
plot_lines() {
  local parts=() title
  for i in "${!labels[@]}"; do
    title=${labels[$i]//\"/\'}
    if [[ $# -eq 1 ]]; then
      parts+=("\"$tmp/series$i.tsv\" using 1:$1 with linespoints lc $((i + 1)) pt 7 title \"$title\"")
    else
      parts+=("\"$tmp/series$i.tsv\" using 1:$1 with linespoints lc $((i + 1)) dt 1 pt 7 title \"$title median\"")
      parts+=("\"$tmp/series$i.tsv\" using 1:$2 with linespoints lc $((i + 1)) dt 2 pt 6 title \"$title p99\"")
    fi
  done
  local IFS=,
  echo "plot ${parts[*]}"
}

gnuplot <<EOF
set terminal $terminal
set datafile separator "\t"
set logscale x 2
set xrange [$min_x / 1.5 : $inf_x * 1.5]
set xtics ($xtics)
set xlabel "request rate (requests/s)"
set yrange [0:*]
set offsets 0, 0, graph 0.08, 0
set grid
set key outside right top

set output "$out/throughput.png"
set title "Output token throughput"
set ylabel "output tokens/s"
$(plot_lines 2)

set output "$out/ttft.png"
set title "Time to first token"
set ylabel "ms"
$(plot_lines 3 4)

set output "$out/itl.png"
set title "Inter-token latency"
set ylabel "ms"
$(plot_lines 5 6)

set output "$out/e2el.png"
set title "End-to-end latency"
set ylabel "ms"
$(plot_lines 7 8)
EOF
echo "charts of ${#files[@]} runs (${labels[*]}): $out/throughput.png $out/ttft.png $out/itl.png $out/e2el.png"
