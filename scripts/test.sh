#!/usr/bin/env bash
# Sets up, builds (warnings are errors) and runs every test: CTest labels unit, integration,
# e2e; gpu tests skip with a message when there is no GPU. Extra arguments go to ctest
# (e.g. scripts/test.sh -L unit).
# Then the same tests built with ASan+UBSan (scripts/sanitize.sh asan: by default the unit and
# integration tests, else the ones asked for) and every fuzz harness for a bounded time
# (scripts/fuzz.sh, TANDEM_FUZZ_SECONDS each, default 20). TANDEM_SANITIZERS=0 skips both.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DTANDEM_WERROR=ON
(cd build && ctest --output-on-failure -j"${TANDEM_JOBS:-$(nproc)}" --timeout 600 "$@")

if [[ "${TANDEM_SANITIZERS:-1}" == 0 ]]; then
  echo "test: sanitizers and fuzzers skipped (TANDEM_SANITIZERS=0)"
  exit 0
fi
scripts/sanitize.sh asan "$@"
scripts/fuzz.sh "${TANDEM_FUZZ_SECONDS:-20}"
