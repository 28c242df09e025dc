#!/usr/bin/env bash
# llama.cpp as a benchmark peer: the prebuilt CPU libraries of the npm package node-llama-cpp
# (pinned in bench/llama_cpp/package-lock.json) timed on the same random-weight Mixtral-layout
# checkpoint Tandem runs (bench/configs/dummy-3b-v8k: 2.9 GB of bf16), so ratios are measured
# side by side. Tandem never links llama.cpp; only this script and bench/llama_cpp/ use it.
#   bench/llama_cpp_peer.sh [--tandem] [--rounds N] [--threads N] [OUT_DIR]
#     OUT_DIR    default /tmp/tandem-peer: the checkpoint (dummy-3b-v8k/, made once, then
#                reused), its GGUFs (bf16 3 GB, Q8_0 1.6 GB, Q4_0 0.8 GB), the compiled
#                llama_peer (build/), results.jsonl (one line per measurement) and log.txt
#     --tandem   also time Tandem (build/bin/tandem_engine_bench) on the bf16 checkpoint and,
#                when `build/bin/tandem quantize` exists, on its 8- and 4-bit quantizations,
#                interleaved with llama.cpp: bf16 Tandem, bf16 llama.cpp, int8 Tandem, Q8_0
#                llama.cpp, int4 Tandem, Q4_0 llama.cpp; what is not built is skipped, saying so
#     --rounds   repeat the whole sequence N times (default 1); tables of the median (with the
#                rounds' spread), the best round, and Tandem / llama.cpp per round (its median)
#     --threads  llama.cpp's threads (default: nproc, the CPUs this process may use, as Tandem)
# Prints a markdown table of tokens/s: decode at batch 1, 4, 16, 64 (B sequences with an
# 8-token context, 16 timed steps after 2 untimed, B / median step time) and the prefill of
# one 128-token prompt (median of 3). Needs no Tandem build unless --tandem; installs what
# it needs: scripts/setup.sh --bench (NumPy, SentencePiece) and the npm package (npm ci).
set -euo pipefail
cd "$(dirname "$0")/.."

tandem=0
rounds=1
threads=$(nproc)
out=/tmp/tandem-peer
while (($#)); do
  case "$1" in
    --tandem) tandem=1 ;;
    --rounds) rounds=$2; shift ;;
    --threads) threads=$2; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "llama_cpp_peer: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) out=$1 ;;
  esac
  shift
done

readonly batches=1,4,16,64 context=8 steps=16 prefill_tokens=128
readonly config=bench/configs/dummy-3b-v8k/config.json
readonly peer_dir=bench/llama_cpp
readonly py=/usr/bin/python3
mkdir -p "$out/build"
out=$(cd "$out" && pwd)
ckpt=$out/dummy-3b-v8k
results=$out/results.jsonl
log=$out/log.txt
: > "$results"
: > "$log"

say() { echo "llama_cpp_peer: $*" >&2; }

# --- what it needs --------------------------------------------------------------------------
scripts/setup.sh --bench >&2
# Keyed on the lock file: a changed package-lock.json installs again.
if ! cmp -s "$peer_dir/package-lock.json" "$peer_dir/node_modules/.package-lock.tandem"; then
  say "installing node-llama-cpp ($peer_dir, npm ci; its install scripts are not needed)"
  (cd "$peer_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null &&
     cp package-lock.json node_modules/.package-lock.tandem)
fi

# --- llama_peer, compiled against the package's libraries and its bundled source's headers --
lib_dir=$(cd "$peer_dir/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64" && pwd)
shopt -s nullglob
lib() {  # GLOB: the first file of lib_dir that matches
  # shellcheck disable=SC2206  # the pattern is meant to expand
  local found=("$lib_dir"/$1)
  ((${#found[@]})) || { say "no $1 in $lib_dir"; exit 1; }
  basename "${found[0]}"
}
libllama=$(lib 'libllama.*so')        # libllama.v0.4.0.so (or libllama.so), not libllama-common
libggml=$(lib 'libggml.*so')          # libggml.v0.4.0.so, not libggml-base or libggml-cpu-*
libggml_base=$(lib 'libggml-base*.so')
bundle=$peer_dir/node_modules/node-llama-cpp/llama/gitRelease.bundle
src=$out/llama-src
if ! cmp -s "$peer_dir/package-lock.json" "$src/.package-lock.tandem"; then
  say "checking out the llama.cpp headers from $bundle"
  rm -rf "$src"
  git clone --quiet --no-checkout "$bundle" "$src"
  git -C "$src" -c advice.detachedHead=false checkout --quiet HEAD -- include ggml/include
  cp "$peer_dir/package-lock.json" "$src/.package-lock.tandem"
fi
peer=$out/build/llama_peer
gcc -O2 -std=c11 -Wall -Wextra -Werror -I"$src/include" -I"$src/ggml/include" \
  "$peer_dir/llama_peer.c" -o "$peer" -L"$lib_dir" -l:"$libllama" -l:"$libggml" \
  -l:"$libggml_base" -ldl -Wl,-rpath,"$lib_dir"

# --- the checkpoint and its GGUFs, each made only when missing or older than its source -----
if [[ ! -f "$ckpt/model.safetensors" ]] || ! cmp -s "$config" "$ckpt/config.json"; then
  say "making the random-weight checkpoint $ckpt"
  rm -rf "$ckpt"
  "$py" "$peer_dir/make_checkpoint.py" --config "$config" --out "$ckpt" --seed 1 >&2
fi
gguf=$out/dummy-3b-v8k
if [[ ! "$gguf-bf16.gguf" -nt "$ckpt/model.safetensors" ]]; then
  "$py" "$peer_dir/hf_to_gguf.py" "$ckpt" "$gguf-bf16.gguf" >&2
fi
for type in Q8_0 Q4_0; do
  q=$gguf-${type,,}.gguf
  if [[ ! "$q" -nt "$gguf-bf16.gguf" ]]; then
    "$peer" quantize "$gguf-bf16.gguf" "$q" "$type" --threads "$threads" >&2
  fi
done

# --- Tandem's side, when built ---------------------------------------------------------------
tandem_bf16="" tandem_int8="" tandem_int4=""
if ((tandem)); then
  if [[ -x build/bin/tandem_engine_bench ]]; then
    tandem_bf16=$ckpt
    if [[ -x build/bin/tandem ]] && build/bin/tandem quantize --help >/dev/null 2>&1; then
      for bits in 8 4; do
        dir=$ckpt-int$bits
        # As llama.cpp's Q8_0 quantizes every matrix, int8 includes the lm_head; int4 has an
        # int8 one (Q4_0 keeps its output matrix at 6 bits; an int4 lm_head costs perplexity,
        # docs/quantization.md). Groups of 32, as Q8_0's and Q4_0's blocks (tandem quantize's
        # default on this model is 128).
        modules=experts,attention,shared_expert,dense_mlp,lm_head
        head_bits=8 group=32
        # $dir.done holds the modules (and head bits) of a finished quantization: an interrupted
        # one, or one of other modules, is made again.
        if [[ "$(cat "$dir.done" 2>/dev/null)" != "$modules;lm_head_bits=$head_bits;group=$group" ||
              "$ckpt/model.safetensors" -nt "$dir.done" ]]; then
          say "tandem quantize --bits $bits --group_size $group --modules $modules -> $dir"
          rm -rf "$dir" "$dir.done"
          build/bin/tandem quantize --model "$ckpt" --bits "$bits" --modules "$modules" \
            --lm_head_bits "$head_bits" --group_size "$group" --out "$dir" >&2
          echo "$modules;lm_head_bits=$head_bits;group=$group" > "$dir.done"
        fi
        printf -v "tandem_int$bits" %s "$dir"
      done
    else
      say "build/bin/tandem has no quantize command: Tandem's int8 and int4 rows skipped"
    fi
  else
    say "no build/bin/tandem_engine_bench (scripts/build.sh makes it): Tandem's rows skipped"
  fi
fi

# --- the runs ------------------------------------------------------------------------------------
run_llama() {  # LABEL GGUF ROUND
  say "round $3: llama.cpp $1"
  echo "== llama.cpp $1 round $3" >> "$log"
  "$peer" bench --model "$2" --label "$1" --threads "$threads" --batches "$batches" \
    --context "$context" --steps "$steps" --prefill_tokens "$prefill_tokens" --prefill_reps 3 |
    tee -a "$log" | grep '^{' | jq -c --argjson round "$3" '. + {round: $round}' >> "$results"
}

# tandem_engine_bench prints markdown tables: decode rows "| BATCH | full (E) | step ms |
# tokens/s | ...", and the prefill row "| full pool (Tandem's prefill) | ms | tokens/s | ...".
run_tandem() {  # LABEL DIR ROUND
  say "round $3: Tandem $1"
  echo "== tandem $1 round $3" >> "$log"
  local text
  if ! text=$(build/bin/tandem_engine_bench --model "$2" --context "$context" --steps "$steps" \
                --prefill_tokens "$prefill_tokens" --batches "$batches" 2>&1); then
    echo "$text" >> "$log"
    say "tandem_engine_bench failed on $2 (see $log)"
    return 0
  fi
  echo "$text" >> "$log"
  echo "$text" | awk -F'|' -v label="$1" -v round="$3" -v tokens="$prefill_tokens" '
    function trim(s) { gsub(/^ +| +$/, "", s); return s }
    trim($2) ~ /^[0-9]+$/ && trim($3) ~ /^full/ {
      printf "{\"kind\":\"decode\",\"engine\":\"tandem\",\"label\":\"%s\",\"batch\":%d,\"step_ms_median\":%s,\"tokens_per_s\":%s,\"round\":%d}\n",
        label, trim($2), trim($4), trim($5), round }
    trim($2) ~ /^full pool/ {
      printf "{\"kind\":\"prefill\",\"engine\":\"tandem\",\"label\":\"%s\",\"tokens\":%d,\"ms_median\":%s,\"tokens_per_s\":%s,\"round\":%d}\n",
        label, tokens, trim($3), trim($4), round }' >> "$results"
}

for round in $(seq "$rounds"); do
  if [[ -n "$tandem_bf16" ]]; then run_tandem bf16 "$tandem_bf16" "$round"; fi
  run_llama bf16 "$gguf-bf16.gguf" "$round"
  if [[ -n "$tandem_int8" ]]; then run_tandem int8 "$tandem_int8" "$round"; fi
  run_llama Q8_0 "$gguf-q8_0.gguf" "$round"
  if [[ -n "$tandem_int4" ]]; then run_tandem int4 "$tandem_int4" "$round"; fi
  run_llama Q4_0 "$gguf-q4_0.gguf" "$round"
done

# --- the table: one row per engine and weight format, the median over rounds ------------------
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo
echo "$cpu, $threads threads; $(basename "$ckpt") ($config), context $context," \
  "$steps timed steps; results in $results"
echo
"$py" - "$results" "$batches" "$prefill_tokens" "$rounds" <<'PY'
import json, statistics, sys
rows, cells = [], {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d["kind"] not in ("decode", "prefill"):
        continue
    row = ("Tandem" if d["engine"] == "tandem" else "llama.cpp") + " " + d["label"]
    if row not in rows:
        rows.append(row)
    col = d["batch"] if d["kind"] == "decode" else "prefill"
    cells.setdefault((row, col), []).append(d["tokens_per_s"])
batches = [int(b) for b in sys.argv[2].split(",")]
cols = batches + ["prefill"]
# On a shared machine other work only ever slows a run down, so the best round is the
# better estimate there; the median is the honest one on a quiet machine. With more than one
# round the median's cells give the spread (lowest-highest) too, and a third table the
# ratios of each round's Tandem to the llama.cpp run beside it (same weights' bits), their
# median: the ratio the noise moves least.
many = int(sys.argv[4]) > 1
def median_cell(values):
    text = f"{statistics.median(values):.1f}"
    return text + (f" ({min(values):.1f}-{max(values):.1f})" if many else "")
stats = [("median", median_cell)] + ([("best", lambda v: f"{max(v):.1f}")] if many else [])
for name, cell in stats:
    print(f"{name} of {sys.argv[4]} round(s), tokens/s:\n")
    print("| engine, weights | " + " | ".join(f"batch {b}" for b in batches) +
          f" | prefill {sys.argv[3]} |")
    print("|---" * (len(cols) + 1) + "|")
    for row in rows:
        print(f"| {row} | " + " | ".join(
            cell(cells[(row, c)]) if (row, c) in cells else "n/a" for c in cols) + " |")
    print()
pairs = [("Tandem bf16", "llama.cpp bf16"), ("Tandem int8", "llama.cpp Q8_0"),
         ("Tandem int4", "llama.cpp Q4_0")]
pairs = [(t, l) for t, l in pairs if t in rows and l in rows]
if many and pairs:
    print(f"Tandem / llama.cpp, median of the {sys.argv[4]} rounds' ratios (lowest-highest):\n")
    print("| weights | " + " | ".join(f"batch {b}" for b in batches) +
          f" | prefill {sys.argv[3]} |")
    print("|---" * (len(cols) + 1) + "|")
    for t, l in pairs:
        out = []
        for c in cols:
            a, b = cells.get((t, c), []), cells.get((l, c), [])
            ratios = [x / y for x, y in zip(a, b) if y > 0]
            out.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
                       if ratios else "n/a")
        print(f"| {t.split()[1]} vs {l.split()[1]} | " + " | ".join(out) + " |")
    print()
PY
