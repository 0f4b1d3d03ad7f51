#!/bin/sh
# gpt_moe.sh — train_gpt with MoE blocks (--moe-experts): data parallel equals one process with
# the summed batch, expert parallelism (LOOM_EP_SIZE 2) equals every rank holding every expert,
# the replicas stay bitwise identical, the three overlap modes and --sync fused give the same
# bits, generation runs over the expert-parallel group, and the progress line shows the routing.
set -u
# Uncompressed: LOOM_COMPRESS defaults to auto, whose plan depends on timing.
export LOOM_COMPRESS=none
. "${srcdir:-.}/tests/mpi/gpt_lib.sh" # $b, $exe, $tmp/corpus, run, run_env, same, close
# As gpt_equivalence.sh (large constant lr, clipping, adam-eps 1e-5), with two MoE blocks of 4
# experts (top-2). --val-rows 3: at np 2 one rank has a single validation row and joins the
# other's collective MoE forward with a repeated row.
common="--layers 2 --width 32 --heads 2 --ctx 32 --steps 6 --seed 3 --lr 0.003 --warmup 0"
common="$common --min-lr-frac 1 --clip 0.5 --adam-eps 1e-5 --sample 0 --val-every 0"
common="$common --val-rows 3 --log-every 3 --data $tmp/corpus --moe-experts 4 --moe-every 1"
common="$common --sgemm-reps 0" # no MFU: its sgemm timing would be most of each run

# The dumps hold the dense parameters, then every MoE layer's router and all its experts
# (gathered over the expert-parallel group), so they compare across LOOM_EP_SIZE.

# (a) data parallel, every rank holding every expert: np 1 --batch 4 = np 2 --batch 2 (no aux
# loss: it is computed per rank, over that rank's tokens).
run_env np1_aux0 1 "LOOM_EP_SIZE=1" --batch 4 --moe-aux 0 --dump-params "$tmp/np1_aux0.bin"
run_env np2_aux0 2 "LOOM_EP_SIZE=1" --batch 2 --moe-aux 0 --dump-params "$tmp/np2_aux0_%r.bin"
same "np 2, LOOM_EP_SIZE 1: ranks bitwise identical" "$tmp/np2_aux0_0.bin" "$tmp/np2_aux0_1.bin"
close "np 1 --batch 4 equals np 2 --batch 2 (aux 0)" "$tmp/np1_aux0.bin" "$tmp/np2_aux0_0.bin"

# (b) expert parallel over 2 ranks equals both ranks holding every expert (aux loss on).
run_env np2_ep1 2 "LOOM_EP_SIZE=1" --batch 2 --dump-params "$tmp/np2_ep1_%r.bin"
run_env np2_ep2 2 "LOOM_EP_SIZE=2" --batch 2 --dump-params "$tmp/np2_ep2_%r.bin"
same "np 2, LOOM_EP_SIZE 1: ranks bitwise identical" "$tmp/np2_ep1_0.bin" "$tmp/np2_ep1_1.bin"
same "np 2, LOOM_EP_SIZE 2: ranks bitwise identical" "$tmp/np2_ep2_0.bin" "$tmp/np2_ep2_1.bin"
close "np 2: LOOM_EP_SIZE 2 equals LOOM_EP_SIZE 1" "$tmp/np2_ep1_0.bin" "$tmp/np2_ep2_0.bin"
loss1=$(sed -n 's/^step *6\/6  loss \([0-9.]*\) .*/\1/p' "$tmp/np2_ep1.log")
loss2=$(sed -n 's/^step *6\/6  loss \([0-9.]*\) .*/\1/p' "$tmp/np2_ep2.log")
if [ -n "$loss1" ] && [ "$loss1" = "$loss2" ]; then
  echo "ok: np 2: the same loss $loss1 with LOOM_EP_SIZE 1 and 2"
else
  echo "FAIL: np 2: loss '$loss1' with LOOM_EP_SIZE 1, '$loss2' with 2"
  fail=1
fi
# --sync fused (one fused allreduce, then the MoE gradients) gives the overlapped step's bits.
run_env np2_ep2_fused 2 "LOOM_EP_SIZE=2" --batch 2 --sync fused --dump-params "$tmp/np2_ep2f_%r.bin"
same "np 2, LOOM_EP_SIZE 2: --sync fused equals --sync overlap" "$tmp/np2_ep2_0.bin" \
  "$tmp/np2_ep2f_0.bin"

# (c) np 4 in two expert-parallel groups of 2: the overlap modes give the same bits, the ranks
# agree, and the result equals np 1 with the summed batch.
for mode in none coarse fine; do
  run_env "np4_$mode" 4 "LOOM_EP_SIZE=2" --batch 1 --moe-aux 0 --moe-overlap "$mode" \
    --dump-params "$tmp/np4_${mode}_%r.bin"
done
same "np 4, LOOM_EP_SIZE 2: coarse equals none bitwise" "$tmp/np4_none_0.bin" "$tmp/np4_coarse_0.bin"
same "np 4, LOOM_EP_SIZE 2: fine equals none bitwise" "$tmp/np4_none_0.bin" "$tmp/np4_fine_0.bin"
same_ranks "np 4, LOOM_EP_SIZE 2: replicas bitwise identical" "$tmp/np4_fine" 4
# rtol 2e-5: the largest difference is in an element 100x below the parameters' rms, where
# Adam's normalised update carries the GEMMs' rounding (8.7e-6 with np 1's default two BLAS
# threads, 1.21e-5 with LOOM_BLAS_THREADS=1).
close "np 1 --batch 4 equals np 4 --batch 1, LOOM_EP_SIZE 2 (aux 0)" "$tmp/np1_aux0.bin" \
  "$tmp/np4_fine_0.bin" 2e-5

# (d) the progress line shows the aux loss and the tokens per expert (and the drops with a
# capacity); generation with the experts over 2 ranks.
run_env np2_show 2 "LOOM_EP_SIZE=2" --batch 2 --moe-capacity 1 --sample 24 --json "$tmp/show.json"
for want in ' aux [0-9]' ' experts \[[0-9]' ' dropped [0-9]' '^sample (' '^moe: 2 MoE block' \
  '^sgemm: not measured (--sgemm-reps 0): no MFU' 'ms/step, mfu not measured (--sgemm-reps 0)'; do
  if grep -q "$want" "$tmp/np2_show.log"; then
    echo "ok: the output shows '$want'"
  else
    cat "$tmp/np2_show.log"
    echo "FAIL: the output lacks '$want'"
    fail=1
  fi
done
if grep -q '"mfu": -1.0000, "mfu_attn": -1.0000, "mfu_sampled": -1.0000, "mfu_attn_sampled": -1.0000, "sgemm_samples": 0, "sgemm_median_gflops": -1.00, "sgemm_gflops": -1.00,' "$tmp/show.json"; then
  echo "ok: --sgemm-reps 0: MFU and the sgemm rate are -1 in the JSON"
else
  cat "$tmp/show.json"
  echo "FAIL: --sgemm-reps 0: the JSON does not give MFU and the sgemm rate as -1"
  fail=1
fi
if grep -q '"moe_experts": 4, .*"moe_topk": 2, .*"moe_aux": [0-9]' "$tmp/show.json"; then
  echo "ok: the JSON has moe_experts, moe_topk and moe_aux"
else
  cat "$tmp/show.json"
  echo "FAIL: the JSON lacks the MoE fields"
  fail=1
fi
# Training moved the MoE parameters too: compare with lr 0.
run_env np1_lr0 1 "LOOM_EP_SIZE=1" --batch 4 --moe-aux 0 --lr 0 --dump-params "$tmp/np1_lr0.bin"
if "$exe" --compare "$tmp/np1_aux0.bin" "$tmp/np1_lr0.bin" --rtol 1e-3 >/dev/null 2>&1; then
  echo "FAIL: 6 steps at lr 0.003 left the parameters where lr 0 leaves them"
  fail=1
else
  echo "ok: training moved the parameters"
fi
exit $fail
