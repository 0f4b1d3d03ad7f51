#!/bin/sh
# fmnist_accum.sh — train_fmnist --accum K (gradient accumulation over micro-batches) equals the
# same step in one batch, at np 1..4, with --no-overlap and with compression; replicas stay
# bitwise identical; bad values are refused.
set -u
# Uncompressed unless a run asks: LOOM_COMPRESS defaults to auto, whose plan depends on timing.
export LOOM_COMPRESS=none
. "${srcdir:-.}/tests/mpi/fmnist_lib.sh" # $exe, $tmp, $data, run, same, same_ranks, close, refused

# As dp_equivalence.sh: a constant learning rate keeps every step's update large. A narrower
# model keeps the 11 runs short. Clipping and a gradient K times too large would clip to the same
# update, so the runs of (a) do not clip, print every step's loss and unclipped gradient norm,
# and compare them.
common="--steps 6 --seed 3 --schedule const --hidden 128 --log-every 1 --data $data"

steps() { # log: every step's loss and gradient norm, "loss norm" per line
  sed -n 's/^  step [0-9/]*  epoch [0-9]*  loss \([0-9.]*\)  grad_norm \([0-9.]*\) .*/\1 \2/p' "$1"
}
close_steps() { # what log-a log-b: the same steps, each loss and norm within 1e-4 relative
  # (printed to 4 and 3 decimals: equal but for a last digit that rounds the other way)
  steps "$2" >"$tmp/steps_a"
  steps "$3" >"$tmp/steps_b"
  if [ "$(wc -l <"$tmp/steps_a")" -eq 6 ] && paste -d ' ' "$tmp/steps_a" "$tmp/steps_b" | awk '
      function off(x, y, q) { return (x - y > q || y - x > q) }
      NF != 4 || off($1, $3, 1e-4 * $1 + 1e-4) || off($2, $4, 1e-4 * $2 + 1e-3) { bad = 1 }
      END { exit bad }'; then
    echo "ok: $1 ($(awk '{ printf "%s ", $2 }' "$tmp/steps_a"))"
  else
    echo "FAIL: $1: loss and grad_norm per step:"
    paste -d ' ' "$tmp/steps_a" "$tmp/steps_b"
    fail=1
  fi
}

# (a) one process, no clipping: K = 2 and 4 micro-batches equal the whole batch (parameters, and
# every step's loss and gradient norm); the start line and the JSON say so.
run np1_b64 1 --batch 64 --dump-params "$tmp/np1_b64.bin"
run np1_k2 1 --batch 64 --accum 2 --dump-params "$tmp/np1_k2.bin" --json "$tmp/k2.json"
run np1_k4 1 --batch 64 --accum 4 --dump-params "$tmp/np1_k4.bin"
close "np 1: --accum 2 equals one batch of 64" "$tmp/np1_b64.bin" "$tmp/np1_k2.bin"
close "np 1: --accum 4 equals one batch of 64" "$tmp/np1_b64.bin" "$tmp/np1_k4.bin"
close_steps "np 1: --accum 2 has the same losses and gradient norms" "$tmp/np1_b64.log" \
  "$tmp/np1_k2.log"
close_steps "np 1: --accum 4 has the same losses and gradient norms" "$tmp/np1_b64.log" \
  "$tmp/np1_k4.log"
grep -q 'batch 64 per rank as 4 micro-batches of 16 (global 64)' "$tmp/np1_k4.log" || {
  echo "FAIL: --accum 4: no 'as 4 micro-batches of 16' in the start line"
  fail=1
}
grep -q '"batch": 64, "accum": 2,' "$tmp/k2.json" || {
  cat "$tmp/k2.json"
  echo "FAIL: --json has no \"accum\": 2 after the batch"
  fail=1
}

# (b) data parallel, clipping (--clip 0.5, under the norms of (a): the clip acts, on the
# accumulated average): np N --batch 16 --accum 2 equals np 1 --batch 16N; replicas bitwise
# identical; --no-overlap (one fused allreduce) equals the overlapped step bitwise; compressed
# (top-k, error feedback) replicas stay one model.
run np1_b32 1 --clip 0.5 --batch 32 --dump-params "$tmp/np1_b32.bin"
run np1_b48 1 --clip 0.5 --batch 48 --dump-params "$tmp/np1_b48.bin"
run np1_b64c 1 --clip 0.5 --batch 64 --dump-params "$tmp/np1_b64c.bin"
run np2_k2 2 --clip 0.5 --batch 16 --accum 2 --dump-params "$tmp/np2_%r.bin"
run np2_k2f 2 --clip 0.5 --batch 16 --accum 2 --no-overlap --dump-params "$tmp/np2f_%r.bin"
run np3_k2 3 --clip 0.5 --batch 16 --accum 2 --dump-params "$tmp/np3_%r.bin"
run np4_k2 4 --clip 0.5 --batch 16 --accum 2 --dump-params "$tmp/np4_%r.bin"
run np2_k2c 2 --clip 0.5 --batch 16 --accum 2 --compress topk:0.1 --dump-params "$tmp/np2c_%r.bin"
same_ranks "np 2 --accum 2: replicas bitwise identical" "$tmp/np2" 2
same_ranks "np 3 --accum 2: replicas bitwise identical" "$tmp/np3" 3
same_ranks "np 4 --accum 2: replicas bitwise identical" "$tmp/np4" 4
same_ranks "np 2 --accum 2 --compress topk:0.1: replicas bitwise identical" "$tmp/np2c" 2
same "np 2 --accum 2: --no-overlap equals the overlapped step bitwise" "$tmp/np2_0.bin" \
  "$tmp/np2f_0.bin"
close "np 2 --batch 16 --accum 2 equals np 1 --batch 32" "$tmp/np1_b32.bin" "$tmp/np2_0.bin"
close "np 3 --batch 16 --accum 2 equals np 1 --batch 48" "$tmp/np1_b48.bin" "$tmp/np3_0.bin"
close "np 4 --batch 16 --accum 2 equals np 1 --batch 64" "$tmp/np1_b64c.bin" "$tmp/np4_0.bin"
if cmp -s "$tmp/np2_0.bin" "$tmp/np2c_0.bin"; then
  echo "FAIL: --compress topk:0.1 left the parameters as uncompressed (was it applied?)"
  fail=1
fi

# (c) refused: K that does not divide --batch, and K out of range (exit 2, the reason named).
refused "--accum 3 --batch 64" \
  "--accum 3 does not divide --batch 64: each micro-batch takes --batch/--accum rows" \
  --batch 64 --accum 3
refused "--accum 0" "--accum" --accum 0
refused "--accum 65537" "--accum" --accum 65537
exit $fail
