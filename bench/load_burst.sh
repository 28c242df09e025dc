#!/usr/bin/env bash
# A burst of concurrent streaming clients against a disaggregated cluster (tandem-gateway +
# tandem-prefill + tandem-decode, every setting at its default): half through the gRPC API,
# half through the OpenAI HTTP API, all sent at once (`tandem bench serve --request_rate=inf`,
# two of them side by side). While it runs, the gateway's thread count and resident memory are
# sampled every 200 ms from /proc. Prints requests completed and failed per API, TTFT
# percentiles, the gateway's peak threads and RSS, and decode's KV blocks in use afterwards.
# Needs a build (scripts/build.sh) and jq.
#   bench/load_burst.sh [CLIENTS (1000)] [INPUT_LEN (32)] [OUTPUT_LEN (64)]
set -euo pipefail
cd "$(dirname "$0")/.."
clients=${1:-1000}
input_len=${2:-32}
output_len=${3:-64}
command -v jq >/dev/null || { echo "$0 needs jq (scripts/setup.sh)" >&2; exit 1; }
bin=build/bin
model=models/tiny-moe
run_dir=$(mktemp -d /tmp/tandem-burst.XXXXXX)
source scripts/lib.sh  # start, port, metric, stop_all
trap 'stop_all; rm -rf "$run_dir"' EXIT
start tandem-prefill
start tandem-decode
start tandem-gateway --prefill="127.0.0.1:$(port tandem-prefill grpc_port)" \
  --decode="127.0.0.1:$(port tandem-decode grpc_port)"
gateway_pid=$(port tandem-gateway pid)
threads_before=$(awk '/^Threads:/ {print $2}' "/proc/$gateway_pid/status")
(
  while kill -0 "$gateway_pid" 2>/dev/null; do
    awk '/^Threads:/ {t=$2} /^VmRSS:/ {r=$2} END {print t, r}' "/proc/$gateway_pid/status"
    sleep 0.2
  done
) >"$run_dir/samples" &
sampler=$!
grpc_n=$((clients / 2))
http_n=$((clients - grpc_n))
common=(--model="$model" --dataset=random --input_len="$input_len" --output_len="$output_len"
        --request_rate=inf --seed=0 --timeout_s=300)
start_time=$(date +%s.%N)
"$bin/tandem" bench serve --backend=grpc --endpoint="127.0.0.1:$(port tandem-gateway grpc_port)" \
  --num_prompts="$grpc_n" "${common[@]}" --out="$run_dir/grpc.json" >"$run_dir/grpc.txt" 2>&1 &
grpc_bench=$!
"$bin/tandem" bench serve --backend=http --endpoint="127.0.0.1:$(port tandem-gateway http_port)" \
  --num_prompts="$http_n" "${common[@]}" --seed=1 --out="$run_dir/http.json" >"$run_dir/http.txt" 2>&1 &
http_bench=$!
wait "$grpc_bench" || { cat "$run_dir/grpc.txt"; exit 1; }
wait "$http_bench" || { cat "$run_dir/http.txt"; exit 1; }
end_time=$(date +%s.%N)
kill "$sampler" 2>/dev/null || true
sleep 1  # the engine's gauges follow the last step
used=$(metric tandem-decode 'tandem_kv_blocks{.*state="used"')
rejected=$(metric tandem-gateway 'tandem_requests_total{.*outcome="rejected"')
echo "burst of $clients streaming clients ($grpc_n gRPC, $http_n HTTP), prompts of $input_len tokens, $output_len generated each, all at once; $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf '| API | completed | failed | TTFT p50 ms | p90 | p99 | output tok/s |\n|---|---|---|---|---|---|---|\n'
for api in grpc http; do
  jq -r --arg api "$api" '"| \($api) | \(.completed) | \(.failed) | \(.median_ttft_ms|floor) | \(.p90_ttft_ms|floor) | \(.p99_ttft_ms|floor) | \(.output_throughput|floor) |"' "$run_dir/$api.json"
done
awk -v before="$threads_before" '{ if ($1 > t) t = $1; if ($2 > r) r = $2 } END {
  printf "gateway: %d threads before the burst, at most %d during it; RSS at most %.0f MiB\n", before, t, r / 1024 }' "$run_dir/samples"
printf 'wall time %.1f s; refused (tandem_requests_total{outcome="rejected"}): %s; decode KV blocks in use afterwards: %s\n' \
  "$(awk -v a="$start_time" -v b="$end_time" 'BEGIN {print b - a}')" "${rejected:-0}" "$used"
for api in grpc http; do
  jq -r '.errors[]? | select(. != "")' "$run_dir/$api.json" | sort | uniq -c | head -5
done
