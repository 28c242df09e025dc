#!/usr/bin/env bash
# Disaggregated (gateway + prefill + decode, KV over UCX/TCP) vs colocated (tandem-serve) on
# the shipped tiny model, at 1, 8 and 32 concurrent streaming clients, in one run; then the
# prefill instance's own split of time to first token (compute vs KV transfer) from its metrics.
# Needs a build (scripts/build.sh).
#   bench/serving_bench.sh [--requests N --max_tokens N]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin
model=models/tiny-moe
run_dir=$(mktemp -d /tmp/tandem-bench.XXXXXX)
pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}
trap 'stop_all; rm -rf "$run_dir"' EXIT
start() {  # start NAME ARGS...
  local name=$1; shift
  "$bin/$name" --model="$model" --port_file="$run_dir/$name.ports" "$@" >"$run_dir/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do [[ -s "$run_dir/$name.ports" ]] && return; sleep 0.05; done
  echo "$name did not start"; cat "$run_dir/$name.log"; exit 1
}
port() { sed -E "s/.*\"$2\": ([0-9]+).*/\1/" "$run_dir/$1.ports"; }
metric() {  # metric NAME SERIES: the value of one sample on NAME's /metrics
  curl -sf "http://127.0.0.1:$(port "$1" http_port)/metrics" | awk -v s="$2" '$1 ~ "^"s {print $2; exit}'
}

echo "| mode | clients | requests | failed | output tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | latency p50 (ms) | latency p99 (ms) |"
echo "|---|---|---|---|---|---|---|---|---|"
start tandem-prefill
start tandem-decode --max_running=64
start tandem-gateway --prefill="127.0.0.1:$(port tandem-prefill grpc_port)" \
                     --decode="127.0.0.1:$(port tandem-decode grpc_port)"
"$bin/tandem_serving_bench" --endpoint="127.0.0.1:$(port tandem-gateway grpc_port)" \
  --label=disaggregated "$@"
split=$(awk -v cs="$(metric tandem-prefill tandem_prefill_compute_seconds_sum)" \
  -v cn="$(metric tandem-prefill tandem_prefill_compute_seconds_count)" \
  -v ts="$(metric tandem-prefill tandem_kv_transfer_seconds_sum)" \
  -v tn="$(metric tandem-prefill tandem_kv_transfer_seconds_count)" \
  'BEGIN { printf "prefill compute %.2f ms, KV transfer %.2f ms per prompt (means over %d prompts)", 1000*cs/cn, 1000*ts/tn, cn }')
stop_all
start tandem-serve --max_running=64
"$bin/tandem_serving_bench" --endpoint="127.0.0.1:$(port tandem-serve grpc_port)" \
  --label=colocated "$@"
echo
echo "Disaggregated time to first token, from tandem-prefill's metrics: $split"
