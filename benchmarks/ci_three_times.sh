#!/usr/bin/env bash
# `make test` on three fresh clones in a row while a spinning process keeps one core busy
# (issue 10's "green 3 of 3"). Usage: benchmarks/ci_three_times.sh COMMIT [OUTDIR]
# Appends one line per run (rc, seconds, load, pytest's summary) to OUTDIR/summary.txt.
set -u
COMMIT=$1
OUT=${2:-/tmp/autotune-ci-runs}
REPO=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
mkdir -p "$OUT"
for i in 1 2 3; do
  dir=$OUT/run-$COMMIT-$i
  rm -rf "$dir"; git clone -q "$REPO" "$dir" && git -C "$dir" checkout -q "$COMMIT"
  python3 -c 'while True: pass' & busy=$!
  start=$(date +%s)
  (cd "$dir" && CI=true timeout 5400 bash .ci/run) > "$dir.log" 2>&1
  rc=$?
  kill $busy
  end=$(date +%s)
  echo "$(date -u +%H:%M) $COMMIT run $i rc=$rc $((end-start))s load=$(cut -d' ' -f1-3 /proc/loadavg) $(grep -E '^(FAILED|ERROR)|[0-9]+ (passed|failed)' "$dir.log" | tail -8 | tr '\n' ' ')" >> "$OUT/summary.txt"
done
cat "$OUT/summary.txt"
