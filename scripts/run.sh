#!/usr/bin/env bash
# The main job: set up, build (Release, build/bin/), start a local cluster on loopback
# (gateway, one prefill, one decode) on the shipped tiny model, send prompts through the
# client, print what came back, say where the metrics are, and stop everything cleanly.
#   scripts/run.sh                            run and stop
#   scripts/run.sh --keep                     stay up until Ctrl-C
#   scripts/run.sh --model models/tiny-fg-moe another model (here the fine-grained one)
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
model=models/tiny-moe
while (($#)); do
  case "$1" in
    --keep) keep=1 ;;
    --model) model=${2:?--model needs a directory}; shift ;;
    --model=*) model=${1#--model=} ;;
    *) echo "usage: scripts/run.sh [--keep] [--model DIR]" >&2; exit 2 ;;
  esac
  shift
done
[[ -f "$model/config.json" ]] || { echo "no model in $model (no config.json)" >&2; exit 2; }

scripts/setup.sh
scripts/build.sh
bin=build/bin
run_dir=$(mktemp -d /tmp/tandem-run.XXXXXX)
source scripts/lib.sh  # start, port, stop_all
trap 'stop_all; rm -rf "$run_dir"' EXIT

start tandem-prefill
start tandem-decode
start tandem-gateway --prefill="127.0.0.1:$(port tandem-prefill grpc_port)" \
                     --decode="127.0.0.1:$(port tandem-decode grpc_port)"
gateway="127.0.0.1:$(port tandem-gateway grpc_port)"
for name in tandem-prefill tandem-decode tandem-gateway; do
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$(port $name http_port)/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
done

echo
echo "== Tandem local cluster on $model =="
echo "gateway gRPC: $gateway"
"$bin/tandem" health --endpoint="$gateway"
"$bin/tandem" models --endpoint="$gateway"
echo
echo "== Tokenize (real: the gateway's tokenizer) =="
"$bin/tandem" tokenize --endpoint="$gateway" --text="The jury said it did find that"
echo
echo "== Generate through the cluster (gateway -> prefill -> KV over UCX -> decode) =="
for prompt in "The jury said it did find that" "She opened the door and" "In the beginning of the year,"; do
  echo "prompt: $prompt"
  "$bin/tandem" generate --endpoint="$gateway" --prompt="$prompt" --max_tokens=32
done
echo
echo "== The same, streamed, sampled (temperature 0.8, seed 7) =="
"$bin/tandem" generate --endpoint="$gateway" --prompt="She opened the door and" --max_tokens=32 \
  --temperature=0.8 --seed=7 --stream
echo
http="http://127.0.0.1:$(port tandem-gateway http_port)"
echo "== The OpenAI-compatible HTTP API on the gateway ($http/v1, docs/openai.md) =="
echo "POST /v1/completions:"
curl -sS "$http/v1/completions" \
  -d '{"prompt": "The jury said it did find that", "max_tokens": 16, "temperature": 0}'
echo
echo "POST /v1/chat/completions (streamed; the tiny model's chat template writes quoted dialogue):"
curl -sSN "$http/v1/chat/completions" \
  -d '{"messages": [{"role": "user", "content": "Where did you go last night"}],
       "max_tokens": 24, "temperature": 0, "stream": true}' |
  sed -n 's/^data: //p' | awk 'NR <= 3 || /DONE/ {print} NR == 4 {print "..."} END {print NR " events"}'
echo
echo "== The engine in one process (tandem generate --model), for comparison =="
"$bin/tandem" generate --model="$model" --prompt="She opened the door and" --max_tokens=32
echo
echo "== Metrics =="
for name in tandem-gateway tandem-prefill tandem-decode; do
  echo "$name: http://127.0.0.1:$(port $name http_port)/metrics (also /healthz, /readyz)"
done
echo "OpenAI-compatible API: $http/v1"
if ((keep)); then
  echo
  echo "Cluster is up; Ctrl-C stops it. Logs: $run_dir"
  trap 'exit 0' INT TERM
  while true; do sleep 1; done
fi
