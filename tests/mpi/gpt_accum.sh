#!/bin/sh
# gpt_accum.sh — train_gpt --accum K (gradient accumulation over micro-batches) equals the same
# step in one batch, at np 1..4, with --sync fused, MoE blocks (expert parallel too) and
# attention servers; replicas stay bitwise identical; bad values are refused.
set -u
# Uncompressed: LOOM_COMPRESS defaults to auto, whose plan depends on timing.
export LOOM_COMPRESS=none
. "${srcdir:-.}/tests/mpi/gpt_lib.sh" # $exe, $tmp/corpus, run, run_env, same, close, refused
# As gpt_equivalence.sh: large constant lr, clipping, adam-eps 1e-5 (see there). --clip 0 in the
# runs that check the loss gradient's 1/K: clipping and Adam would hide a gradient K times too
# large, so those runs print the unclipped norm (grad_norm) and compare it.
common="--layers 2 --width 32 --heads 2 --ctx 32 --steps 5 --seed 3 --lr 0.003 --warmup 0"
common="$common --min-lr-frac 1 --clip 0.5 --adam-eps 1e-5 --sample 0 --val-every 0"
common="$common --val-rows 4 --data $tmp/corpus --sgemm-reps 0 --log-every 1"

norms() { # log: every step's grad_norm, one line
  sed -n 's/^step .* grad_norm \([0-9.]*\) .*/\1/p' "$1" | tr '\n' ' '
}
same_text() { # what a b: two strings are equal and not empty
  if [ -n "$2" ] && [ "$2" = "$3" ]; then
    echo "ok: $1 ($2)"
  else
    echo "FAIL: $1: '$2' against '$3'"
    fail=1
  fi
}

# (a) one process: K = 2 and 4 micro-batches equal the whole batch; the progress says so.
run np1_b8 1 --batch 8 --clip 0 --dump-params "$tmp/np1_b8.bin"
run np1_k2 1 --batch 8 --clip 0 --accum 2 --dump-params "$tmp/np1_k2.bin" --json "$tmp/k2.json"
run np1_k4 1 --batch 8 --clip 0 --accum 4 --dump-params "$tmp/np1_k4.bin"
close "np 1: --accum 2 equals one batch of 8 rows" "$tmp/np1_b8.bin" "$tmp/np1_k2.bin"
close "np 1: --accum 4 equals one batch of 8 rows" "$tmp/np1_b8.bin" "$tmp/np1_k4.bin" 3e-5
same_text "np 1: --accum 2 has the same gradient norms" "$(norms "$tmp/np1_b8.log")" \
  "$(norms "$tmp/np1_k2.log")"
same_text "np 1: --accum 4 has the same gradient norms" "$(norms "$tmp/np1_b8.log")" \
  "$(norms "$tmp/np1_k4.log")"
grep -q '^batch: 8 rows as 4 micro-batches of 2 x 32 tokens per rank' "$tmp/np1_k4.log" || {
  echo "FAIL: --accum 4: no 'as 4 micro-batches of 2' in the batch line"
  fail=1
}
grep -q '"batch": 8, "accum": 2,' "$tmp/k2.json" || {
  echo "FAIL: --json has no \"accum\": 2"
  fail=1
}

# (b) data parallel: np N --batch B --accum K equals np 1 --batch N*B; replicas bitwise identical,
# and --sync fused equals the overlapped step bitwise.
run np1_b4 1 --batch 4 --dump-params "$tmp/np1_b4.bin"
run np1_b6 1 --batch 6 --dump-params "$tmp/np1_b6.bin"
run np1_b8c 1 --batch 8 --dump-params "$tmp/np1_b8c.bin"
run np2_k2 2 --batch 2 --accum 2 --dump-params "$tmp/np2_%r.bin"
run np2_k2f 2 --batch 2 --accum 2 --sync fused --dump-params "$tmp/np2f_%r.bin"
run np3_k2 3 --batch 2 --accum 2 --dump-params "$tmp/np3_%r.bin"
run np4_k2 4 --batch 2 --accum 2 --dump-params "$tmp/np4_%r.bin"
same_ranks "np 2 --accum 2: replicas bitwise identical" "$tmp/np2" 2
same_ranks "np 3 --accum 2: replicas bitwise identical" "$tmp/np3" 3
same_ranks "np 4 --accum 2: replicas bitwise identical" "$tmp/np4" 4
same "np 2 --accum 2: --sync fused equals --sync overlap bitwise" "$tmp/np2_0.bin" "$tmp/np2f_0.bin"
close "np 2 --batch 2 --accum 2 equals np 1 --batch 4" "$tmp/np1_b4.bin" "$tmp/np2_0.bin"
close "np 3 --batch 2 --accum 2 equals np 1 --batch 6" "$tmp/np1_b6.bin" "$tmp/np3_0.bin"
close "np 4 --batch 2 --accum 2 equals np 1 --batch 8" "$tmp/np1_b8c.bin" "$tmp/np4_0.bin"

# (c) MoE blocks (no aux loss: it is computed per micro-batch, like per rank): --accum 2 equals
# one batch; with the aux loss on and experts split over 2 ranks (LOOM_EP_SIZE 2) it equals
# every rank holding every expert, and the loss line is the same.
moe="--moe-experts 4 --moe-every 1"
run_env moe_b4 1 "LOOM_EP_SIZE=1" "$moe" --batch 4 --moe-aux 0 --dump-params "$tmp/moe_b4.bin"
run_env moe_k2 1 "LOOM_EP_SIZE=1" "$moe" --batch 4 --moe-aux 0 --accum 2 \
  --dump-params "$tmp/moe_k2.bin"
close "MoE, np 1: --accum 2 equals one batch (aux 0)" "$tmp/moe_b4.bin" "$tmp/moe_k2.bin"
run_env moe_ep1 2 "LOOM_EP_SIZE=1" "$moe" --batch 4 --accum 2 --dump-params "$tmp/moe_ep1_%r.bin"
run_env moe_ep2 2 "LOOM_EP_SIZE=2" "$moe" --batch 4 --accum 2 --dump-params "$tmp/moe_ep2_%r.bin"
same "MoE np 2 --accum 2, LOOM_EP_SIZE 2: ranks bitwise identical" "$tmp/moe_ep2_0.bin" \
  "$tmp/moe_ep2_1.bin"
close "MoE np 2 --accum 2: LOOM_EP_SIZE 2 equals LOOM_EP_SIZE 1" "$tmp/moe_ep1_0.bin" \
  "$tmp/moe_ep2_0.bin"
aux1=$(sed -n 's/^step *5\/5  loss \([0-9.]*\) .* aux \([0-9.]*\) .*/\1 \2/p' "$tmp/moe_ep1.log")
aux2=$(sed -n 's/^step *5\/5  loss \([0-9.]*\) .* aux \([0-9.]*\) .*/\1 \2/p' "$tmp/moe_ep2.log")
same_text "MoE np 2 --accum 2: loss and aux loss alike over LOOM_EP_SIZE 1 and 2" "$aux1" "$aux2"
# The aux loss of a step is the mean over its micro-batches (each layer's weight divided by K),
# not their sum: at step 1 (the same parameters) it is near the one-batch run's, not twice it.
run_env moe_k1 2 "LOOM_EP_SIZE=1" "$moe" --batch 4 --dump-params "$tmp/moe_k1_%r.bin"
a1=$(sed -n 's/^step *1\/5  .* aux \([0-9.]*\) .*/\1/p' "$tmp/moe_k1.log")
a2=$(sed -n 's/^step *1\/5  .* aux \([0-9.]*\) .*/\1/p' "$tmp/moe_ep1.log")
if [ -n "$a1" ] && [ -n "$a2" ] && awk -v a="$a1" -v b="$a2" 'BEGIN { exit !(b > 0.8 * a && b < 1.25 * a) }'; then
  echo "ok: MoE step 1: aux loss $a2 with --accum 2, $a1 in one batch"
else
  echo "FAIL: MoE step 1: aux loss '$a2' with --accum 2 against '$a1' in one batch (want within 25%)"
  fail=1
fi

# (d) attention servers (inplace at np 2, dedicated at np 3): each micro-batch is planned and
# shipped; the result equals local attention with the same micro-batches.
run np2_k2_attn 2 --batch 2 --accum 2 --attn-servers inplace --dump-params "$tmp/np2a_%r.bin"
same_ranks "np 2 --accum 2 --attn-servers inplace: replicas bitwise identical" "$tmp/np2a" 2
close "np 2 --accum 2: attention servers equal local attention" "$tmp/np2_0.bin" \
  "$tmp/np2a_0.bin"
# A dedicated server (np 3: ranks 0 and 1 train, rank 2 serves) serves every micro-batch's plan,
# forward and backward as the trainers make them, and the result is still local attention's.
run np3_k2_ded 3 --batch 2 --accum 2 --attn-servers 1 --dump-params "$tmp/np3d_%r.bin"
same "np 3 --accum 2, 1 dedicated server: trainers 0 and 1 bitwise identical" "$tmp/np3d_0.bin" \
  "$tmp/np3d_1.bin"
close "np 3 --accum 2, 1 dedicated server: equals np 2 --accum 2" "$tmp/np2_0.bin" \
  "$tmp/np3d_0.bin"

# (e) refused: K that does not divide --batch, K out of range, and --profile with K > 1.
refused "--accum 3 --batch 8" "--accum 3 does not divide --batch 8" --batch 8 --accum 3
refused "--accum 0" "--accum" --accum 0
refused "--profile with --accum 2" "--profile with --accum 2" --batch 4 --accum 2 \
  --profile "$tmp/prof.json"
exit $fail
