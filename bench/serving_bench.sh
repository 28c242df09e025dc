#!/usr/bin/env bash
# Disaggregated (tandem-gateway + tandem-prefill + tandem-decode, KV over UCX/TCP) vs colocated
# (tandem-serve) on the shipped tiny model: `tandem bench serve` at each request rate of
# --rates, the same seeded prompts and arrival times for both modes, one result JSON per
# (mode, rate) in the output directory it prints (chart them with bench/plot_serving.sh);
# a table of both modes at the end; then the prefill instance's own split of time to first
# token (compute vs KV transfer) from its metrics. Needs a build (scripts/build.sh) and jq.
#   bench/serving_bench.sh [--rates 1,2,4,8,16,inf] [--num_prompts 100] [--input_len 128]
#                          [--output_len 64] [--max_concurrency 0] [--backend grpc|http]
#                          [--out_dir DIR] [-- more tandem bench serve flags]
# --backend http goes through the OpenAI-compatible API on each service's HTTP port.
set -euo pipefail
cd "$(dirname "$0")/.."
rates=1,2,4,8,16,inf
num_prompts=100
input_len=128
output_len=64
max_concurrency=0
backend=grpc
out_dir=
extra=()
while (($#)); do
  case $1 in
    --rates=* | --num_prompts=* | --input_len=* | --output_len=* | --max_concurrency=* | \
      --backend=* | --out_dir=*)
      name=${1%%=*}
      printf -v "${name#--}" '%s' "${1#*=}"
      shift ;;
    --rates | --num_prompts | --input_len | --output_len | --max_concurrency | --backend | \
      --out_dir)
      (($# >= 2)) || { echo "$1 needs a value" >&2; exit 2; }
      printf -v "${1#--}" '%s' "$2"
      shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown argument $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
command -v jq >/dev/null || { echo "$0 needs jq (scripts/setup.sh)" >&2; exit 1; }
bin=build/bin
model=models/tiny-moe
out_dir=${out_dir:-$(mktemp -d /tmp/tandem-serving.XXXXXX)}
mkdir -p "$out_dir"
run_dir=$(mktemp -d /tmp/tandem-bench.XXXXXX)
source scripts/lib.sh  # start, port, metric, stop_all
trap 'stop_all; rm -rf "$run_dir"' EXIT
bench() {  # bench MODE SERVICE: every rate against SERVICE, results to $out_dir/MODE-rate-R.json
  local mode=$1 service=$2 rate endpoint
  if [[ $backend == http ]]; then
    endpoint="127.0.0.1:$(port "$service" http_port)"
  else
    endpoint="127.0.0.1:$(port "$service" grpc_port)"
  fi
  for rate in ${rates//,/ }; do
    echo "$mode at $rate requests/s ..." >&2
    "$bin/tandem" bench serve --endpoint="$endpoint" --backend="$backend" --model="$model" \
      --dataset=random --num_prompts="$num_prompts" --input_len="$input_len" \
      --output_len="$output_len" --request_rate="$rate" --max_concurrency="$max_concurrency" \
      --seed=0 --label="$mode" --out="$out_dir/$mode-rate-$rate.json" "${extra[@]}" \
      >"$out_dir/$mode-rate-$rate.txt" ||
      echo "$mode at $rate requests/s: tandem bench serve failed (above)" >&2
  done
}

start tandem-prefill
start tandem-decode --max_running=64
start tandem-gateway --prefill="127.0.0.1:$(port tandem-prefill grpc_port)" \
                     --decode="127.0.0.1:$(port tandem-decode grpc_port)"
bench disaggregated tandem-gateway
split=$(awk -v cs="$(metric tandem-prefill tandem_prefill_compute_seconds_sum)" \
  -v cn="$(metric tandem-prefill tandem_prefill_compute_seconds_count)" \
  -v ts="$(metric tandem-prefill tandem_kv_transfer_seconds_sum)" \
  -v tn="$(metric tandem-prefill tandem_kv_transfer_seconds_count)" \
  'BEGIN { printf "prefill compute %.2f ms, KV transfer %.2f ms per prompt (means over %d prompts)", 1000*cs/cn, 1000*ts/tn, cn }')
stop_all
start tandem-serve --max_running=64
bench colocated tandem-serve
stop_all

echo "$num_prompts requests of $input_len prompt + $output_len output tokens per run," \
  "backend $backend, max concurrency $max_concurrency (0: none)"
echo
echo "| mode | rate (req/s) | completed | failed | output tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | ITL p50 (ms) | ITL p99 (ms) | E2EL p50 (ms) | E2EL p99 (ms) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for mode in disaggregated colocated; do
  for rate in ${rates//,/ }; do
    [[ -f "$out_dir/$mode-rate-$rate.json" ]] || continue
    jq -r '"| \(.label) | \(.request_rate) | \(.completed) | \(.failed) | \(.output_throughput * 10 | round / 10) | \(.median_ttft_ms * 10 | round / 10) | \(.p99_ttft_ms * 10 | round / 10) | \(.median_itl_ms * 10 | round / 10) | \(.p99_itl_ms * 10 | round / 10) | \(.median_e2el_ms | round) | \(.p99_e2el_ms | round) |"' \
      "$out_dir/$mode-rate-$rate.json"
  done
done
echo
echo "Disaggregated time to first token, from tandem-prefill's metrics: $split"
echo "Results (one JSON per mode and rate, and each run's printed summary): $out_dir"
echo "Charts: bench/plot_serving.sh $out_dir"
