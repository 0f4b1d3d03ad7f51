#!/usr/bin/env bash
# tests/bench/soak.sh — the reliability soak: train_gpt for many steps at np 4 (oversubscribed)
# with int8 compression and checkpoints; fails on a hang, a crash or resident memory that grows.
# Usage (from the build folder): ../tests/bench/soak.sh [STEPS] [NP]   (defaults 2000, 4)
set -euo pipefail
steps=${1:-2000}
np=${2:-4}
# RSS is compared from step 200 on (progress every 100 steps): fewer than 300 steps compare
# nothing
case $steps in '' | *[!0-9]* | ???????*) steps=0 ;; esac
case $np in '' | *[!0-9]* | ????*) np=0 ;; esac
if [ "$steps" -lt 300 ] || [ "$np" -lt 1 ]; then
  echo "soak: usage: soak.sh [STEPS (300..999999, default 2000)] [NP (1..999, default 4)], got '${1:-}' '${2:-}'" >&2
  exit 2
fi
b=${LOOM_BUILDDIR:-.}
[ -x "$b/examples/train_gpt" ] || { echo "soak: run it from the build folder (no examples/train_gpt)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# LOOM_TIMEOUT turns a hang into an abort; timeout(1) bounds the whole run.
rc=0
LOOM_TIMEOUT=${LOOM_TIMEOUT:-120} timeout $((steps / 5 + 300)) \
  mpirun -np "$np" --oversubscribe -x LOOM_TIMEOUT "$b/examples/train_gpt" --layers 2 --width 128 \
  --heads 4 --ctx 128 --batch 4 --steps "$steps" --compress int8 --log-every 100 \
  --val-every 500 --sample 0 --ckpt "$tmp/ck" --save-every 500 --json "$tmp/soak.json" |
  tee "$tmp/soak.log" || rc=$?
if [ "$rc" -ne 0 ]; then
  [ "$rc" -eq 124 ] && echo "soak: FAIL: still running after $((steps / 5 + 300)) s (a hang)" ||
    echo "soak: FAIL: the run exited with $rc (a crash, or LOOM_TIMEOUT found a hang)"
  exit 1
fi
# RSS (the largest over the ranks) at each progress line: the first after warm-up (step 200)
# against the last.
rss=$(sed -n 's/^step *\([0-9]*\)\/.* rss \([0-9.]*\) MiB.*/\1 \2/p' "$tmp/soak.log")
first=$(echo "$rss" | awk '$1 >= 200 {print $2; exit}')
last=$(echo "$rss" | tail -1 | awk '{print $2}')
[ -n "$first" ] && [ -n "$last" ] || { echo "soak: FAIL: no rss in the progress lines"; exit 1; }
echo "soak: $steps steps at np $np: rss $first MiB at step 200, $last MiB at the end"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b - a <= 2.0) }' ||
  { echo "soak: FAIL: resident memory grew by more than 2 MiB after warm-up"; exit 1; }
echo "soak: PASS"
