#!/usr/bin/env bash
# Runs the exposition dump through `promtool check metrics`; fails on any complaint.
set -euo pipefail
dump="$1"
if ! command -v promtool >/dev/null; then
  echo "promtool not found: install Debian's prometheus package (scripts/setup.sh does)" >&2
  exit 1
fi
page=$("$dump")
echo "$page" | head -5
out=$(echo "$page" | promtool check metrics 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then echo "promtool complained:"; echo "$out"; exit 1; fi
echo "promtool check metrics: clean"
