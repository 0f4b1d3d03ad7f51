#!/bin/sh
# gpt_learns.sh — train_gpt at np 2 on the fortunes corpus (Debian package fortunes) brings the
# validation loss well below the unigram entropy of the bytes, and writes its JSON; it runs with
# the default gradient compression (auto), so the planned path trains too.
set -u
# With the defaults, compression included (LOOM_COMPRESS unset: auto profiles, plans, applies).
unset LOOM_COMPRESS
b=${LOOM_BUILDDIR:-.}
sh=${SHELL:-/bin/sh}
data=${LOOM_GPT_DATA:-/usr/share/games/fortunes}
exe=$b/examples/train_gpt
[ -x "$exe" ] || { echo "FAIL: $exe is not built"; exit 99; }
if [ ! -d "$data" ] && [ ! -f "$data" ]; then
  echo "SKIP: $data is missing: apt-get install fortunes (or set LOOM_GPT_DATA)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/learn.mpi" <<SPEC
np=2
prog=examples/train_gpt
args='--layers 2 --width 64 --heads 2 --ctx 64 --batch 4 --steps 250 --lr 0.003 --warmup 20 --val-every 125 --val-rows 16 --sample 64 --sgemm-every 125 --data $data --json $tmp/out.json'
grep='sample ('
SPEC
"$sh" "$b/tests/mpirun.sh" "$tmp/learn.mpi" || { echo "FAIL: the training run failed"; exit 1; }
[ -s "$tmp/out.json" ] || { echo "FAIL: no JSON written"; exit 1; }
val=$(sed -n 's/.*"val_loss": \([0-9.e+-]*\).*/\1/p' "$tmp/out.json")
uni=$(sed -n 's/.*"unigram_entropy": \([0-9.e+-]*\).*/\1/p' "$tmp/out.json")
tps=$(sed -n 's/.*"tokens_per_s": \([0-9.e+-]*\).*/\1/p' "$tmp/out.json")
mfu=$(sed -n 's/.*"mfu": \([0-9.e+-]*\).*/\1/p' "$tmp/out.json")
sgemm=$(sed -n 's/.*"sgemm_gflops": \([0-9.e+-]*\).*/\1/p' "$tmp/out.json")
mfu_s=$(sed -n 's/.*"mfu_sampled": \([0-9.e+-]*\).*/\1/p' "$tmp/out.json")
samples=$(sed -n 's/.*"sgemm_samples": \([0-9]*\).*/\1/p' "$tmp/out.json")
echo "val_loss $val, unigram entropy $uni, tokens/s $tps, mfu $mfu, sgemm $sgemm GFLOP/s"
# The default --sgemm-reps 10: the rate measured, MFU a fraction (small at this width).
if awk -v m="$mfu" -v g="$sgemm" 'BEGIN { exit !(m > 0 && m < 1.5 && g > 0.1) }'; then
  echo "ok: mfu $mfu against a measured sgemm rate of $sgemm GFLOP/s"
else
  echo "FAIL: mfu '$mfu' or sgemm_gflops '$sgemm' is not a measured value"
  exit 1
fi
# --sgemm-every 125 over 250 steps: the start, step 125 and the end (the last step takes none).
if [ "$samples" = 3 ] && awk -v m="$mfu_s" 'BEGIN { exit !(m > 0 && m < 1.5) }'; then
  echo "ok: mfu_sampled $mfu_s against $samples samples of the rate"
else
  echo "FAIL: sgemm_samples '$samples' (want 3: start, step 125, end) or mfu_sampled '$mfu_s'"
  exit 1
fi
# "Well below": at least 0.4 nats under the unigram entropy (a model that learned nothing but
# byte frequencies sits at it).
if awk -v v="$val" -v u="$uni" -v t="$tps" 'BEGIN { exit !(v > 0 && v < u - 0.4 && t > 0) }'; then
  echo "ok: val_loss $val < unigram entropy $uni - 0.4"
else
  echo "FAIL: val_loss $val is not well below the unigram entropy $uni"
  exit 1
fi
