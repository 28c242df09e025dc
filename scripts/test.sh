#!/usr/bin/env bash
# Sets up, builds (warnings are errors) and runs every test: CTest labels unit, integration,
# e2e; gpu tests skip with a message when there is no GPU. Extra arguments go to ctest
# (e.g. scripts/test.sh -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DTANDEM_WERROR=ON
cd build
ctest --output-on-failure -j"${TANDEM_JOBS:-$(nproc)}" --timeout 600 "$@"
