#!/bin/sh
# gpt_resume.sh — checkpoint and resume are bit-exact: 2N steps straight equal N steps, a SIGKILL
# of every rank in the middle of step N+k, and a --resume to 2N (np 2, int8 compression with
# error feedback, so the residuals must survive); a damaged checkpoint, another world size and
# files whose --compress auto plans differ are refused, not loaded.
set -u
export LOOM_COMPRESS=none
. "${srcdir:-.}/tests/mpi/gpt_lib.sh" # $b, $exe, $tmp/corpus, run, run_env, same
common="--layers 2 --width 32 --heads 2 --ctx 32 --batch 2 --steps 8 --seed 5 --lr 0.003"
common="$common --warmup 2 --sample 0 --val-every 0 --val-rows 4 --data $tmp/corpus"
common="$common --compress int8 --sgemm-reps 0"
ck=$tmp/ckpt

run straight 2 --dump-params "$tmp/straight.bin"

# Killed in the middle of step 6 (0-based), after the checkpoint of step 4 was written.
cat >"$tmp/killed.mpi" <<SPEC
np=2
prog=examples/train_gpt
args='$common --ckpt $ck --save-every 4 --die-at 6'
expect=fail
SPEC
"$sh" "$b/tests/mpirun.sh" "$tmp/killed.mpi" >"$tmp/killed.log" 2>&1 ||
  { cat "$tmp/killed.log"; echo "FAIL: the killed run did not end as expected"; exit 1; }
if [ "$(cat "$ck/latest" 2>/dev/null)" = 4 ] && [ -f "$ck/step-00000004/rank-00001.ckpt" ]; then
  echo "ok: the killed run left the checkpoint of step 4"
else
  echo "FAIL: no checkpoint of step 4 in $ck"; ls -R "$ck"; exit 1
fi

run resumed 2 --ckpt "$ck" --save-every 4 --resume --dump-params "$tmp/resumed.bin"
grep -q "resume: step 4" "$tmp/resumed.log" && echo "ok: resumed at step 4" ||
  { echo "FAIL: the resumed run did not start at step 4"; fail=1; }
same "8 steps straight equal 4 + SIGKILL mid-step 6 + resume to 8, bitwise" \
  "$tmp/straight.bin" "$tmp/resumed.bin"
[ -f "$ck/step-00000008/rank-00000.ckpt" ] && [ "$(cat "$ck/latest")" = 8 ] &&
  echo "ok: the resumed run saved step 8" || { echo "FAIL: no checkpoint of step 8"; fail=1; }

# A file copied in from another save (rank 1's of step 4 in the folder of step 8) is refused,
# naming the step it holds: loaded, the replicas would train apart without a word.
mkdir -p "$tmp/stale" && cp -r "$ck/step-00000004" "$ck/step-00000008" "$ck/latest" "$tmp/stale/" &&
  cp "$tmp/stale/step-00000004/rank-00001.ckpt" "$tmp/stale/step-00000008/rank-00001.ckpt"
cat >"$tmp/stale.mpi" <<SPEC
np=2
prog=examples/train_gpt
args='$common --steps 12 --ckpt $tmp/stale --resume'
expect=fail
grep='rank-00001.ckpt holds step 4, not 8'
SPEC
if "$sh" "$b/tests/mpirun.sh" "$tmp/stale.mpi" >"$tmp/stale.log" 2>&1; then
  echo "ok: a file of another save is refused, naming its step"
else
  cat "$tmp/stale.log"; echo "FAIL: a stale checkpoint file was not refused as expected"; fail=1
fi

# A damaged file is refused on every rank with a message, and nothing trains.
printf 'X' | dd of="$ck/step-00000008/rank-00001.ckpt" bs=1 seek=200 conv=notrunc 2>/dev/null
cat >"$tmp/damaged.mpi" <<SPEC
np=2
prog=examples/train_gpt
args='$common --steps 12 --ckpt $ck --resume'
expect=fail
grep='CRC32C'
SPEC
if "$sh" "$b/tests/mpirun.sh" "$tmp/damaged.mpi" >"$tmp/damaged.log" 2>&1; then
  echo "ok: a damaged checkpoint is refused with its CRC named"
else
  cat "$tmp/damaged.log"; echo "FAIL: the damaged checkpoint was not refused as expected"; fail=1
fi
# Another world size is refused too.
cat >"$tmp/np3.mpi" <<SPEC
np=3
prog=examples/train_gpt
args='$common --steps 12 --ckpt $ck --resume'
expect=fail
grep='resume with the world size'
SPEC
if "$sh" "$b/tests/mpirun.sh" "$tmp/np3.mpi" >"$tmp/np3.log" 2>&1; then
  echo "ok: a checkpoint of 2 ranks is refused at np 3"
else
  cat "$tmp/np3.log"; echo "FAIL: np 3 resumed a 2-rank checkpoint"; fail=1
fi
# Ranks whose checkpoints hold different --compress auto plans (rank 1's file from another run)
# are refused at the resume, naming the cause, not at the first exchange as a corrupt payload.
# The link speed set by hand makes the plans differ: compressed on a slow link, not on a fast one.
run_env auto_slow 2 "LOOM_NET_GBPS=0.001" --compress auto --ckpt "$tmp/ck_slow" --save-every 8
run_env auto_fast 2 "LOOM_NET_GBPS=10000" --compress auto --ckpt "$tmp/ck_fast" --save-every 8
cp "$tmp/ck_fast/step-00000008/rank-00001.ckpt" "$tmp/ck_slow/step-00000008/rank-00001.ckpt"
cat >"$tmp/mixed.mpi" <<SPEC
np=2
prog=examples/train_gpt
args='$common --compress auto --steps 10 --ckpt $tmp/ck_slow --resume'
expect=fail
grep='hold different --compress auto plans'
SPEC
if "$sh" "$b/tests/mpirun.sh" "$tmp/mixed.mpi" >"$tmp/mixed.log" 2>&1; then
  echo "ok: checkpoints with different --compress auto plans are refused at the resume"
else
  cat "$tmp/mixed.log"; echo "FAIL: mixed --compress auto plans were not refused as expected"
  fail=1
fi
exit $fail
