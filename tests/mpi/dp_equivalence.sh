#!/bin/sh
# dp_equivalence.sh — data-parallel training equals one process with the summed batch: train_fmnist
# at np 1 --batch 64 and np 2 --batch 32 end with the same parameters, both np 2 ranks bitwise equal;
# with --compress topk:0.1 at np 3 the replicas stay bitwise equal.
set -u
# Uncompressed unless a run asks: LOOM_COMPRESS defaults to auto, whose plan depends on timing.
export LOOM_COMPRESS=none
b=${LOOM_BUILDDIR:-.}
data=${LOOM_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
sh=${SHELL:-/bin/sh}
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
  t10k-labels-idx1-ubyte.gz; do
  if [ ! -r "$data/$f" ]; then
    echo "SKIP: $data/$f is missing: apt-get install dataset-fashion-mnist (or set LOOM_FMNIST_DIR)"
    exit 77
  fi
done
exe=$b/examples/train_fmnist
[ -x "$exe" ] || { echo "FAIL: $exe is not built"; exit 99; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A constant learning rate and clipping keep every step's update large and exercise the clip,
# which must see the averaged gradient on every rank.
common="--steps 6 --seed 3 --schedule const --clip 1 --data $data"
cat >"$tmp/np1.mpi" <<EOF
np=1
prog=examples/train_fmnist
args='$common --batch 64 --dump-params $tmp/p1.bin'
EOF
cat >"$tmp/np2.mpi" <<EOF
np=2
prog=examples/train_fmnist
args='$common --batch 32 --dump-params $tmp/p2_%r.bin'
EOF
cat >"$tmp/np3c.mpi" <<EOF
np=3
prog=examples/train_fmnist
args='$common --batch 32 --compress topk:0.1 --dump-params $tmp/p3c_%r.bin'
EOF

for spec in np1 np2 np3c; do
  "$sh" "$b/tests/mpirun.sh" "$tmp/$spec.mpi"
  rc=$?
  [ "$rc" -eq 0 ] || { echo "FAIL: the $spec run exited with $rc"; exit "$rc"; }
done

fail=0
# Both ranks of np 2 applied the same averaged gradients: bitwise identical parameters.
if cmp "$tmp/p2_0.bin" "$tmp/p2_1.bin"; then
  echo "ok: np 2 ranks hold bitwise identical parameters"
else
  echo "FAIL: np 2 ranks 0 and 1 hold different parameters"
  fail=1
fi
# Compressed gradients (top-k with error feedback, divisible scheme): still one model.
for r in 1 2; do
  if cmp "$tmp/p3c_0.bin" "$tmp/p3c_$r.bin"; then
    echo "ok: np 3 --compress topk:0.1 ranks 0 and $r hold bitwise identical parameters"
  else
    echo "FAIL: np 3 --compress topk:0.1 ranks 0 and $r hold different parameters"
    fail=1
  fi
done
# np 1 with the whole global batch and np 2 with half each: equal up to summation order.
if "$exe" --compare "$tmp/p1.bin" "$tmp/p2_0.bin" --rtol 1e-5; then
  echo "ok: np 1 --batch 64 equals np 2 --batch 32 within rtol 1e-5"
else
  echo "FAIL: np 1 and np 2 parameters differ"
  fail=1
fi
# The comparison itself must be able to fail: one float changed must be caught.
cp "$tmp/p1.bin" "$tmp/bad.bin"
printf '\001\002\003\077' | dd of="$tmp/bad.bin" bs=1 seek=4000 conv=notrunc 2>/dev/null
if "$exe" --compare "$tmp/p1.bin" "$tmp/bad.bin" >/dev/null 2>&1; then
  echo "FAIL: --compare accepted a dump with one element changed"
  fail=1
else
  echo "ok: --compare rejects a changed element"
fi
exit $fail
