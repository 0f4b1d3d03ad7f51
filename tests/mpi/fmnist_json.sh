#!/bin/sh
# fmnist_json.sh — train_fmnist --json stays JSON when the run diverges: a loss that is not
# finite is written as null (printf wrote "-nan", which no JSON reader takes). --lr 100 blows
# the weights up; LOOM_NONFINITE=skip lets the run end and write its numbers.
set -u
b=${LOOM_BUILDDIR:-.}
sh=${SHELL:-/bin/sh}
[ -x "$b/examples/train_fmnist" ] || { echo "FAIL: $b/examples/train_fmnist is not built"; exit 99; }
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "SKIP: the Debian package dataset-fashion-mnist is not installed"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/diverge.mpi" <<SPEC
np=1
prog=examples/train_fmnist
env='LOOM_NONFINITE=skip'
args='--hidden 32 --batch 64 --steps 30 --lr 100 --momentum 0.99 --json $tmp/out.json'
grep='train_loss -*nan'
SPEC
"$sh" "$b/tests/mpirun.sh" "$tmp/diverge.mpi" >"$tmp/diverge.log" 2>&1 ||
  { cat "$tmp/diverge.log"; echo "FAIL: the diverging run (a NaN train loss expected)"; exit 1; }
if grep -q '"train_loss": null, "test_loss": null, "test_acc": ' "$tmp/out.json" &&
  ! grep -qi 'nan\|inf' "$tmp/out.json"; then
  echo "ok: a diverged run's losses are null in the JSON"
else
  cat "$tmp/out.json"; echo "FAIL: the JSON of a diverged run"; exit 1
fi
if command -v python3 >/dev/null 2>&1 &&
  ! python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/out.json"; then
  echo "FAIL: python3 cannot read $tmp/out.json as JSON"; exit 1
fi
exit 0
