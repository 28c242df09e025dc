#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz (build-asan/: ASan+UBSan, clang) and runs each
# for a bounded time on a copy of its seed corpus (docs/fuzzing.md).
#   scripts/fuzz.sh [SECONDS [HARNESS...]]   SECONDS per harness (default 30), every harness
#                                             unless named (e.g. scripts/fuzz.sh 600 npy)
# Prints, per harness, libFuzzer's final numbers: executions, executions per second, coverage
# (cov: edges, ft: features) and the inputs it added. Fails on any crash, sanitizer report,
# leak, timeout (an input running over 10 s) or out-of-memory (2 GiB), keeping the input in
# build-asan/fuzz-findings/HARNESS/ and printing how to reproduce it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
shift || true

scripts/sanitize.sh asan --build tandem_fuzzers
set -a
# shellcheck source=/dev/null
. build-asan/sanitizer.env
set +a

if (($# > 0)); then
  harnesses=("$@")
else
  mapfile -t harnesses < <(cd build-asan/fuzz && ls -- *_fuzzer | sed 's/_fuzzer$//')
fi
run_dir=build-asan/fuzz-run
rm -rf "$run_dir"
mkdir -p "$run_dir"
summary=()
failed=0
start=$SECONDS
for name in "${harnesses[@]}"; do
  bin="build-asan/fuzz/${name}_fuzzer"
  findings="build-asan/fuzz-findings/$name"
  corpus="$run_dir/$name/corpus"
  log="$run_dir/$name/log"
  mkdir -p "$corpus" "$findings"
  cp tests/fuzz/corpus/"$name"/* "$corpus"/
  echo "fuzz: $name for ${seconds} s"
  rc=0
  "$bin" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$findings/" "$corpus" >"$log" 2>&1 || rc=$?
  stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  execs=$(stat number_of_executed_units)
  rate=$(stat average_exec_per_sec)
  added=$(stat new_units_added)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  result=ok
  if ((rc != 0)); then
    result="FAILED (exit $rc)"
    failed=1
    echo "fuzz: $name failed; the end of its log ($log):"
    tail -n 60 "$log"
    mapfile -t found < <(ls -t "$findings" 2>/dev/null)
    if ((${#found[@]} > 0)); then
      echo "fuzz: input kept at $findings/${found[0]}; reproduce with"
      echo "  set -a; . build-asan/sanitizer.env; set +a; $bin $findings/${found[0]}"
      echo "  then add it to tests/fuzz/corpus/$name/ with a regression test (docs/fuzzing.md)"
    fi
  fi
  summary+=("$(printf '%-18s %10s %8s %6s %7s %6s  %s' "$name" "${execs:--}" "${rate:--}" \
    "${cov:--}" "${ft:--}" "${added:--}" "$result")")
done
echo
printf "%-18s %10s %8s %6s %7s %6s  %s\n" harness execs exec/s cov ft new result | tee "$run_dir/summary.txt"
printf "%s\n" "${summary[@]}" | tee -a "$run_dir/summary.txt"
echo "fuzz: ${#harnesses[@]} harnesses in $((SECONDS - start)) s"
exit "$failed"
