# Sourced by scripts/run.sh and the bench scripts: start Tandem services on ephemeral loopback
# ports, read their ports and metrics, stop them. Set bin (the binaries), model (the model
# directory) and run_dir (a scratch directory for port files and logs) before calling these.
pids=()

start() {  # start NAME ARGS...: $bin/NAME --model=$model ARGS, waits for its port file
  start_as "$1" "$@"
}

start_as() {  # start_as ALIAS NAME ARGS...: start NAME (a path if it has a slash), as ALIAS
  # (waits start_timeout_s, default 15, for its port file: a big dummy model takes longer)
  local name=$1 binary=$2; shift 2
  [[ $binary == */* ]] || binary=$bin/$binary
  rm -f "$run_dir/$name.ports"
  "$binary" --model="$model" --port_file="$run_dir/$name.ports" "$@" >"$run_dir/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 $((${start_timeout_s:-15} * 20))); do
    [[ -s "$run_dir/$name.ports" ]] && return
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.05
  done
  echo "$name did not start:"; cat "$run_dir/$name.log"; exit 1
}

port() {  # port NAME grpc_port|http_port|pid
  sed -E "s/.*\"$2\": ([0-9]+).*/\1/" "$run_dir/$1.ports"
}

metric() {  # metric NAME SERIES: the value of the first sample of SERIES on NAME's /metrics
  curl -sf "http://127.0.0.1:$(port "$1" http_port)/metrics" | awk -v s="$2" '$1 ~ "^"s {print $2; exit}'
}

stop_all() {  # SIGTERM to everything started, 10 s each to drain, then SIGKILL
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  pids=()
}
