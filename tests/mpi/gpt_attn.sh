#!/bin/sh
# gpt_attn.sh — train_gpt with attention servers in place (--attn-servers inplace) equals the run
# without them (np 2 and 3, corpus and skewed document lengths), replicas stay bitwise identical,
# --sync fused gives the same bits, and the progress line shows the attention balance.
set -u
# Uncompressed: LOOM_COMPRESS defaults to auto, whose plan depends on timing.
export LOOM_COMPRESS=none
. "${srcdir:-.}/tests/mpi/gpt_lib.sh" # $b, $exe, $tmp/corpus, run, run_env, same, close
# As gpt_equivalence.sh (large constant lr, clipping, adam-eps 1e-5), with rows of 64 tokens so
# that the balancer (min_shard ctx / 4 = 16) can cut sequences.
common="--layers 2 --width 32 --heads 2 --ctx 64 --batch 2 --steps 5 --seed 3 --lr 0.003"
common="$common --warmup 0 --min-lr-frac 1 --clip 0.5 --adam-eps 1e-5 --sample 0 --val-every 0"
common="$common --val-rows 4 --log-every 1 --data $tmp/corpus"

for np in 2 3; do
  for d in corpus skewed; do
    run "off_${np}_$d" "$np" --doc-lengths "$d" --dump-params "$tmp/off_${np}_${d}_%r.bin"
    run "in_${np}_$d" "$np" --doc-lengths "$d" --attn-servers inplace \
      --dump-params "$tmp/in_${np}_${d}_%r.bin"
    last=$((np - 1))
    close "np $np --doc-lengths $d: --attn-servers inplace equals off" \
      "$tmp/off_${np}_${d}_0.bin" "$tmp/in_${np}_${d}_0.bin"
    same "np $np --doc-lengths $d inplace: ranks 0 and $last bitwise identical" \
      "$tmp/in_${np}_${d}_0.bin" "$tmp/in_${np}_${d}_$last.bin"
    if grep -q 'attn max/mean [0-9.]* -> [0-9.]*' "$tmp/in_${np}_$d.log" &&
      grep -q 'attn-servers: inplace, balancer tolerance 0.1' "$tmp/in_${np}_$d.log"; then
      echo "ok: np $np --doc-lengths $d: the attention balance is printed"
    else
      cat "$tmp/in_${np}_$d.log"
      echo "FAIL: np $np --doc-lengths $d: no 'attn max/mean' progress or 'attn-servers' line"
      fail=1
    fi
  done
done
# Skewed lengths change the batch (the comparison above is not of two corpus runs), and the
# balancer had something to do: some step started above its tolerance.
if cmp -s "$tmp/off_3_corpus_0.bin" "$tmp/off_3_skewed_0.bin"; then
  echo "FAIL: --doc-lengths skewed gave the corpus run's parameters bit for bit"
  fail=1
else
  echo "ok: --doc-lengths skewed changed the training"
fi
if grep -q 'attn max/mean \(1\.[2-9]\|[2-9]\)' "$tmp/in_3_skewed.log"; then
  echo "ok: np 3 skewed: some step was imbalanced before the balancer"
else
  cat "$tmp/in_3_skewed.log"
  echo "FAIL: np 3 skewed: no step above 1.2 before balancing"
  fail=1
fi
# The fused step (no scheduler) runs the same executors: the same bits.
run in_2_fused 2 --doc-lengths skewed --attn-servers inplace --sync fused \
  --dump-params "$tmp/in_2f_%r.bin"
same "np 2 skewed inplace: --sync fused equals --sync overlap bitwise" \
  "$tmp/in_2_skewed_0.bin" "$tmp/in_2f_0.bin"
exit $fail
