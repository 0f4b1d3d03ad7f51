#!/bin/sh
# gpt_attn.sh — train_gpt with attention servers in place (--attn-servers inplace) equals the run
# without them (np 2 and 3, corpus and skewed document lengths), replicas stay bitwise identical,
# --sync fused gives the same bits, and the progress line shows the attention balance; dedicated
# servers (--attn-servers N, or LOOM_ATTN_SERVERS=N) train the remaining ranks like a run of
# that many ranks without servers.
set -u
# Uncompressed: LOOM_COMPRESS defaults to auto, whose plan depends on timing.
export LOOM_COMPRESS=none
. "${srcdir:-.}/tests/mpi/gpt_lib.sh" # $b, $exe, $tmp/corpus, run, run_env, same, close
# As gpt_equivalence.sh (large constant lr, clipping, adam-eps 1e-5), with rows of 64 tokens so
# that the balancer (min_shard ctx / 4 = 16) can cut sequences.
common="--layers 2 --width 32 --heads 2 --ctx 64 --batch 2 --steps 5 --seed 3 --lr 0.003"
common="$common --warmup 0 --min-lr-frac 1 --clip 0.5 --adam-eps 1e-5 --sample 0 --val-every 0"
common="$common --val-rows 4 --log-every 1 --data $tmp/corpus --sgemm-reps 0"

for np in 2 3; do
  for d in corpus skewed; do
    run "off_${np}_$d" "$np" --doc-lengths "$d" --dump-params "$tmp/off_${np}_${d}_%r.bin"
    run "in_${np}_$d" "$np" --doc-lengths "$d" --attn-servers inplace \
      --dump-params "$tmp/in_${np}_${d}_%r.bin"
    close "np $np --doc-lengths $d: --attn-servers inplace equals off" \
      "$tmp/off_${np}_${d}_0.bin" "$tmp/in_${np}_${d}_0.bin"
    same_ranks "np $np --doc-lengths $d inplace: replicas bitwise identical" \
      "$tmp/in_${np}_${d}" "$np"
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
# A row cost: measured (auto: rank 0 times the kernels and every rank plans with its value) and
# given; either way the training equals the run without servers, and replicas stay identical.
run in_3_rc_auto 3 --doc-lengths skewed --attn-servers inplace --attn-row-cost auto \
  --dump-params "$tmp/in3rca_%r.bin"
close "np 3 skewed, --attn-row-cost auto: equals off" "$tmp/off_3_skewed_0.bin" \
  "$tmp/in3rca_0.bin"
same_ranks "np 3 skewed, --attn-row-cost auto: replicas bitwise identical" "$tmp/in3rca" 3
if grep -q 'attn-servers: a query row costs [0-9.]* (query, key) pairs' "$tmp/in_3_rc_auto.log"
then
  echo "ok: np 3 --attn-row-cost auto: the measured row cost is printed"
else
  cat "$tmp/in_3_rc_auto.log"
  echo "FAIL: np 3 --attn-row-cost auto: no 'a query row costs' line"
  fail=1
fi
run in_2_rc_500 2 --doc-lengths skewed --attn-servers inplace --attn-row-cost 500 \
  --dump-params "$tmp/in2rc_%r.bin"
close "np 2 skewed, --attn-row-cost 500: equals off" "$tmp/off_2_skewed_0.bin" "$tmp/in2rc_0.bin"
# A profile of 2 ranks with the servers times their exchanges (the sixth field of the attn
# line, within the attention time), and loom_sim takes it: without the exchanges at one rank.
run prof_2 2 --doc-lengths skewed --attn-servers inplace --steps 12 --profile "$tmp/prof2.txt"
if awk '$1 == "attn" { ok = NF == 7 && $7 > 0 && $7 <= $2 } END { exit !ok }' "$tmp/prof2.txt" &&
  "$b/loom_sim" --profile "$tmp/prof2.txt" --cluster "${srcdir:-.}/tests/scaling/clusters/here-shm.cluster" \
    --ranks 1,2 --grad none --attn inplace --csv "$tmp/prof2.csv" >"$tmp/prof2_sim.log" 2>&1 &&
  awk -F, '$1 == 1 { one = $3 } $1 == 2 { two = $3 } END { exit !(one > 0 && two > one) }' \
    "$tmp/prof2.csv"; then
  echo "ok: np 2 --profile with servers: the exchange time is recorded and loom_sim reads it"
else
  grep '^attn' "$tmp/prof2.txt"
  cat "$tmp/prof2_sim.log" "$tmp/prof2.csv"
  echo "FAIL: np 2 --profile with servers: no exchange time in the attn line, or loom_sim"
  fail=1
fi
# loom_sim's flags: a value it cannot use is refused with one message that names the flag (an
# empty --ep was read as 0, a negative --seed wrapped, --attn off,off ran the strategy twice).
sim_bad() { # EXPECTED-TEXT FLAGS...
  local want=$1 msg
  shift
  if msg=$("$b/loom_sim" --profile "$tmp/prof2.txt" --cluster \
    "${srcdir:-.}/tests/scaling/clusters/here-shm.cluster" "$@" 2>&1); then
    echo "FAIL: loom_sim $*: accepted"
    fail=1
  elif [ "$(printf '%s\n' "$msg" | grep -c .)" -ne 1 ] || ! printf '%s\n' "$msg" | grep -q -- "$want"; then
    echo "FAIL: loom_sim $*: wanted one line with '$want', got: $msg"
    fail=1
  else
    echo "ok: loom_sim $*: $msg"
  fi
}
sim_bad "--ep '': expected a whole number" --ep ''
sim_bad "--seed '-1': expected a whole number" --seed -1
sim_bad "--attn: unknown or repeated 'off'" --attn off,off
sim_bad "--ranks: '2x' is not a rank count" --ranks 1,2x
sim_bad "--moe: give at least one of" --moe ,
# Dedicated servers: np 3 with one server and np 4 with two train the 2 remaining ranks exactly
# like np 2 without servers (the same rows), and the servers end when the training does.
run ded_3 3 --doc-lengths skewed --attn-servers 1 --dump-params "$tmp/ded3_%r.bin"
close "np 3, 1 dedicated server: equals np 2 off" "$tmp/off_2_skewed_0.bin" "$tmp/ded3_0.bin"
same "np 3, 1 dedicated server: trainers 0 and 1 bitwise identical" "$tmp/ded3_0.bin" \
  "$tmp/ded3_1.bin"
run_env ded_4 4 "LOOM_ATTN_SERVERS=2" --doc-lengths skewed --dump-params "$tmp/ded4_%r.bin"
close "np 4, LOOM_ATTN_SERVERS=2: equals np 2 off" "$tmp/off_2_skewed_0.bin" "$tmp/ded4_0.bin"
if grep -q 'attn-servers: 2 dedicated (world ranks 2..3 serve the attention of the 2 trainers)' \
  "$tmp/ded_4.log" && grep -q 'attn max/mean [0-9.]* -> 1\.[01]' "$tmp/ded_4.log"; then
  echo "ok: np 4, 2 dedicated servers: announced, and the servers' load balanced"
else
  cat "$tmp/ded_4.log"
  echo "FAIL: np 4, 2 dedicated servers: no 'attn-servers: 2 dedicated' line or balance"
  fail=1
fi
# Dedicated servers beside MoE blocks: everything the trainers agree on (the MoE tile sizes)
# goes over the data-parallel group, never the world the servers are in (a chain broadcast made
# a world-wide one hang).
run_env ded_moe 4 "LOOM_ATTN_SERVERS=2 OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_bcast_algorithm=2" \
  --doc-lengths skewed --moe-experts 2 --dump-params "$tmp/dedmoe_%r.bin"
same "np 4, 2 dedicated servers, MoE: trainers 0 and 1 bitwise identical" "$tmp/dedmoe_0.bin" \
  "$tmp/dedmoe_1.bin"
exit $fail
