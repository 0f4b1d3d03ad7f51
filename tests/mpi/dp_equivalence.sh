#!/bin/sh
# dp_equivalence.sh — data-parallel training equals one process with the summed batch: train_fmnist
# at np 1 --batch 64 and np 2 --batch 32 end with the same parameters, both np 2 ranks bitwise equal;
# with --compress topk:0.1 at np 3 the replicas stay bitwise equal.
set -u
# Uncompressed unless a run asks: LOOM_COMPRESS defaults to auto, whose plan depends on timing.
export LOOM_COMPRESS=none
. "${srcdir:-.}/tests/mpi/fmnist_lib.sh" # $exe, $tmp, $data, run, same_ranks, close
# A constant learning rate and clipping keep every step's update large and exercise the clip,
# which must see the averaged gradient on every rank.
common="--steps 6 --seed 3 --schedule const --clip 1 --data $data"
run np1 1 --batch 64 --dump-params "$tmp/p1.bin"
run np2 2 --batch 32 --dump-params "$tmp/p2_%r.bin"
run np3c 3 --batch 32 --compress topk:0.1 --dump-params "$tmp/p3c_%r.bin"

# Both ranks of np 2 applied the same averaged gradients: bitwise identical parameters.
same_ranks "np 2 ranks hold bitwise identical parameters" "$tmp/p2" 2
# Compressed gradients (top-k with error feedback, divisible scheme): still one model.
same_ranks "np 3 --compress topk:0.1: bitwise identical parameters" "$tmp/p3c" 3
# np 1 with the whole global batch and np 2 with half each: equal up to summation order.
close "np 1 --batch 64 equals np 2 --batch 32" "$tmp/p1.bin" "$tmp/p2_0.bin"
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
