#!/usr/bin/env bash
# What log-probabilities cost in serving: tandem-serve on the tiny model, the same seeded
# requests with `tandem bench serve --logprobs` none / 0 / 5 / 20, over HTTP and gRPC,
# the settings alternated ROUNDS times so that the machine's drift falls on all of them.
#   bench/logprobs_bench.sh [ROUNDS] [NUM_PROMPTS]      (defaults 2, 200)
# Prints one line per run: round, backend, setting, completed, failed, output tokens/s,
# median TTFT (ms), median ITL (ms). Needs a build (scripts/test.sh or cmake --build build).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
num_prompts="${2:-200}"
work="$(mktemp -d)"
build/bin/tandem-serve --model=models/tiny-moe --max_running=64 \
  --port_file="$work/serve.ports" > "$work/serve.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [[ -f "$work/serve.ports" ]] && break; sleep 0.2; done
port() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$work/serve.ports" "$1"; }
http="$(port http_port)"
grpc="$(port grpc_port)"
for round in $(seq "$rounds"); do
  for logprobs in -1 0 5 20; do
    for backend in http grpc; do
      endpoint="127.0.0.1:$http"
      [[ "$backend" == grpc ]] && endpoint="127.0.0.1:$grpc"
      out="$work/$backend-$logprobs-$round.json"
      build/bin/tandem bench serve --endpoint "$endpoint" --backend "$backend" \
        --model models/tiny-moe --num_prompts "$num_prompts" --input_len 128 --output_len 64 \
        --request_rate inf --logprobs "$logprobs" --out "$out" > /dev/null 2>&1
      python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
print(sys.argv[2], sys.argv[3], 'logprobs=' + sys.argv[4], d['completed'], d['failed'],
      round(d['output_throughput'], 1), round(d['median_ttft_ms'], 1), round(d['median_itl_ms'], 2))
" "$out" "$round" "$backend" "$logprobs"
    done
  done
done
