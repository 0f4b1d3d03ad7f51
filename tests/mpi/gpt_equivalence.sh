#!/bin/sh
# gpt_equivalence.sh — train_gpt in data parallel equals one process with the summed batch (np 2,
# 3 and 4), every replica is bitwise identical, the fused path equals the overlapped one bitwise,
# and compressed runs (--compress) keep the replicas identical.
set -u
# Uncompressed unless a run asks: LOOM_COMPRESS defaults to auto, whose plan depends on timing.
export LOOM_COMPRESS=none
. "${srcdir:-.}/tests/mpi/gpt_lib.sh" # $b, $exe, $tmp/corpus, run, run_env, same, same_ranks, close
# A high constant learning rate and clipping keep every update large and exercise the clip,
# which must see the averaged gradient on every rank. --adam-eps 1e-5: Adam divides by sqrt(v),
# so a gradient element that is only summation noise (~1e-9, its sign set by the order of the
# sum, which np changes) would get a full-size update of either sign; the larger eps keeps such
# elements from being amplified while every real gradient still goes through Adam's scaling.
common="--layers 2 --width 32 --heads 2 --ctx 32 --steps 5 --seed 3 --lr 0.003 --warmup 0"
common="$common --min-lr-frac 1 --clip 0.5 --adam-eps 1e-5 --sample 0 --val-every 0"
common="$common --val-rows 4 --data $tmp/corpus --sgemm-reps 0"

run np1_b4 1 --batch 4 --dump-params "$tmp/np1_b4.bin"
run np1_b6 1 --batch 6 --dump-params "$tmp/np1_b6.bin"
run np2 2 --batch 2 --dump-params "$tmp/np2_%r.bin"
run np2_fused 2 --batch 2 --sync fused --dump-params "$tmp/np2f_%r.bin"
run np3 3 --batch 2 --dump-params "$tmp/np3_%r.bin"
run np4 4 --batch 1 --dump-params "$tmp/np4_%r.bin"

same_ranks "np 2 replicas bitwise identical" "$tmp/np2" 2
same_ranks "np 3 replicas bitwise identical" "$tmp/np3" 3
same_ranks "np 4 replicas bitwise identical" "$tmp/np4" 4
same "np 2: --sync fused equals --sync overlap bitwise" "$tmp/np2_0.bin" "$tmp/np2f_0.bin"
close "np 1 --batch 4 equals np 2 --batch 2" "$tmp/np1_b4.bin" "$tmp/np2_0.bin"
close "np 1 --batch 4 equals np 4 --batch 1" "$tmp/np1_b4.bin" "$tmp/np4_0.bin"
close "np 1 --batch 6 equals np 3 --batch 2" "$tmp/np1_b6.bin" "$tmp/np3_0.bin"
# Compressed gradients (int8, divisible scheme, error feedback): the replicas stay bitwise
# identical, and compression changed the result (it is not silently skipped); none through the
# compressed path equals the plain allreduce up to the order of the sum.
run np3_int8 3 --batch 2 --compress int8 --dump-params "$tmp/np3i_%r.bin"
run np3_none 3 --batch 2 --compress none --compress-scheme indivisible --dump-params "$tmp/np3n_%r.bin"
same_ranks "np 3 --compress int8: replicas bitwise identical" "$tmp/np3i" 3
same_ranks "np 3 --compress none: replicas bitwise identical" "$tmp/np3n" 3
close "np 3 --compress none equals np 3 uncompressed" "$tmp/np3_0.bin" "$tmp/np3n_0.bin"
if cmp -s "$tmp/np3_0.bin" "$tmp/np3i_0.bin"; then
  echo "FAIL: --compress int8 gave the uncompressed parameters bit for bit"
  fail=1
else
  echo "ok: --compress int8 changed the parameters"
fi
grep -q 'bytes sent per rank per step' "$tmp/np3_int8.log" || {
  echo "FAIL: --compress int8 printed no bytes-sent line"
  fail=1
}
# Training moved the parameters: the comparison is not between two initialisations.
run np1_b4_0 1 --batch 4 --lr 0 --dump-params "$tmp/np1_lr0.bin"
if "$exe" --compare "$tmp/np1_b4.bin" "$tmp/np1_lr0.bin" --rtol 1e-3 >/dev/null 2>&1; then
  echo "FAIL: 5 steps at lr 0.003 left the parameters where lr 0 leaves them"
  fail=1
else
  echo "ok: training moved the parameters"
fi
exit $fail
