#!/usr/bin/env bash
# Builds Tandem under sanitizers and runs tests there (docs/fuzzing.md). Warnings are errors.
#   scripts/sanitize.sh asan [ctest args]  ASan+UBSan in build-asan/ (clang; the same build
#                                          holds the libFuzzer harnesses, scripts/fuzz.sh);
#                                          runs -L 'unit|integration' -LE heavy (the
#                                          whole-split evaluations stay in the normal
#                                          suite) unless given ctest args; test binaries
#                                          with none of the labels unit, integration,
#                                          concurrency (e2e, fault, netns, gpu) are not
#                                          built there
#   scripts/sanitize.sh tsan [ctest args]  TSan in build-tsan/ (clang); runs -L concurrency,
#                                          building only those tests unless given ctest args
#   scripts/sanitize.sh asan|tsan --build [TARGET...]  configure and build (all) only
# CC/CXX choose another compiler (gcc: no fuzzers; not tried so far); TANDEM_JOBS
# the parallelism. The sanitizer settings the tests run with are in build-*/sanitizer.env
# (written by cmake/sanitizers.cmake); `set -a; . build-asan/sanitizer.env; set +a` applies
# them to a binary run by hand.
set -euo pipefail
cd "$(dirname "$0")/.."

kind="${1:-}"
shift || true
case "$kind" in
  asan)
    dir=build-asan
    configure=(-DTANDEM_SANITIZE=address)
    default_tests=(-L 'unit|integration' -LE heavy)
    ;;
  tsan)
    dir=build-tsan
    configure=(-DTANDEM_SANITIZE=thread)
    default_tests=(-L concurrency)
    ;;
  *)
    echo "usage: scripts/sanitize.sh asan|tsan [--build | ctest args]" >&2
    exit 2
    ;;
esac
export CC="${CC:-clang}" CXX="${CXX:-clang++}"
if [[ "$kind" == asan && "$CXX" == *clang* ]]; then configure+=(-DTANDEM_FUZZ=ON); fi
jobs="${TANDEM_JOBS:-$(nproc)}"
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"

build_only=0
targets=()
if [[ "${1:-}" == --build ]]; then
  build_only=1
  shift
  if (($# > 0)); then targets=(--target "$@"); fi
elif (($# == 0)); then
  set -- "${default_tests[@]}"
  # TSan needs only the concurrency tests and the binaries they start.
  if [[ "$kind" == tsan ]]; then targets=(--target tandem_concurrency_tests); fi
fi

# Benchmarks are never run under sanitizers; CUDA is off (no GPU tests run here).
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_WERROR=ON \
  -DTANDEM_BUILD_BENCH=OFF -DTANDEM_ENABLE_CUDA=OFF "${configure[@]}" >"$dir.configure.log" 2>&1 ||
  { cat "$dir.configure.log"; exit 1; }
rm -f "$dir.configure.log"
# The build runs the test binaries to list their cases: under the same settings as the tests.
set -a
# shellcheck source=/dev/null
. "$dir/sanitizer.env"
set +a
start=$SECONDS
cmake --build "$dir" -j"$jobs" "${targets[@]}"
echo "sanitize: $kind build took $((SECONDS - start)) s"
((build_only)) && exit 0

cd "$dir"
start=$SECONDS
status=0
ctest --output-on-failure -j"$jobs" --timeout 1800 "$@" || status=$?
echo "sanitize: $kind tests took $((SECONDS - start)) s"
exit "$status"
