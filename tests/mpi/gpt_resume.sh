#!/bin/sh
# gpt_resume.sh — checkpoint and resume are bit-exact: 2N steps straight equal N steps, a SIGKILL
# of every rank in the middle of step N+k, and a --resume to 2N (np 2, int8 compression with
# error feedback, so the residuals must survive); a damaged checkpoint, another world size or
# --heads or --seed and files whose --compress auto plans differ, or whose plan is damaged, are refused.
set -u
export LOOM_COMPRESS=none
. "${srcdir:-.}/tests/mpi/gpt_lib.sh" # $b, $exe, $tmp/corpus, run, run_env, same
common="--layers 2 --width 32 --heads 2 --ctx 32 --batch 2 --steps 8 --seed 5 --lr 0.003"
common="$common --warmup 2 --sample 0 --val-every 0 --val-rows 4 --data $tmp/corpus"
common="$common --compress int8 --sgemm-reps 0"
ck=$tmp/ckpt

refused() { # NAME NP "ARGS" GREP WHAT: a resume that must fail on every rank, naming GREP
  cat >"$tmp/$1.mpi" <<SPEC
np=$2
prog=examples/train_gpt
args='$common $3'
expect=fail
grep='$4'
SPEC
  if "$sh" "$b/tests/mpirun.sh" "$tmp/$1.mpi" >"$tmp/$1.log" 2>&1; then
    echo "ok: $5 is refused ('$4')"
  else
    cat "$tmp/$1.log"; echo "FAIL: $5 was not refused as expected"; fail=1
  fi
}

run straight 2 --dump-params "$tmp/straight.bin"

# Killed in the middle of step 6 (0-based), after the checkpoint of step 4 was written.
cat >"$tmp/killed.mpi" <<SPEC
np=2
prog=examples/train_gpt
args='$common --ckpt $ck --save-every 4 --die-at 6'
expect=fail
grep='exited on signal 9'
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

# Resumed at the last step: nothing trained, said so, and no rate in the JSON (-1, never NaN).
run past 2 --ckpt "$ck" --resume --json "$tmp/past.json"
if grep -q "^done: nothing trained (the checkpoint is at step 8, --steps is 8)" "$tmp/past.log" &&
  grep -q '"tokens_per_s": -1.0, "step_ms": -1.000,' "$tmp/past.json" &&
  ! grep -qi 'nan\|inf' "$tmp/past.json"; then
  echo "ok: a resume at the last step trains nothing and reports no rate"
else
  cat "$tmp/past.log" "$tmp/past.json"; echo "FAIL: a resume at the last step"; fail=1
fi

# Resumed under --compress auto from a checkpoint of another --compress (no plan in it), past
# the steps auto profiles from the start: it profiles from the resumed step and plans (it never
# planned, trained uncompressed, and called the plan one "from the checkpoint").
run auto_resumed 2 --ckpt "$ck" --resume --compress auto --steps 16
if grep -q "^compression plan (auto): " "$tmp/auto_resumed.log" &&
  ! grep -q "plan: from the checkpoint" "$tmp/auto_resumed.log"; then
  echo "ok: --compress auto resumed from an int8 checkpoint profiles and plans"
else
  cat "$tmp/auto_resumed.log"; echo "FAIL: --compress auto resumed from an int8 checkpoint"; fail=1
fi

# A file copied in from another save (rank 1's of step 4 in the folder of step 8) is refused,
# naming the step it holds: loaded, the replicas would train apart without a word.
mkdir -p "$tmp/stale" && cp -r "$ck/step-00000004" "$ck/step-00000008" "$ck/latest" "$tmp/stale/" &&
  cp "$tmp/stale/step-00000004/rank-00001.ckpt" "$tmp/stale/step-00000008/rank-00001.ckpt" ||
  { echo "FAIL: could not prepare the checkpoint with a stale file"; fail=1; }
refused stale 2 "--steps 12 --ckpt $tmp/stale --resume" \
  "rank-00001.ckpt holds step 4, not 8" "a file of another save"

# Other --heads split the same parameters into other heads: refused, naming the flag (a
# checkpoint holds "flag:--heads"; the shapes alone let it train on as another model).
refused heads 2 "--heads 4 --steps 12 --ckpt $ck --resume" \
  "was saved with --heads 2, this run has --heads 4" "a resume with other --heads"

# Another --seed picks other held-out documents (the run would train on validation ones):
# refused the same way.
refused seed 2 "--seed 6 --steps 12 --ckpt $ck --resume" \
  "was saved with --seed 5, this run has --seed 6" "a resume with another --seed"

# A residual holding NaN (CRCs right: ckpt_edit rewrites the file whole) is refused with the
# library's reason, not only a guess that --compress changed (it did not).
rm -rf "$tmp/ck_nan" && cp -r "$ck" "$tmp/ck_nan" ||
  { echo "FAIL: could not copy the checkpoint for the NaN residual"; fail=1; }
for r in 0 1; do
  f="$tmp/ck_nan/step-00000008/rank-0000$r.ckpt"
  "$b/tests/mpi/ckpt_edit" "$f" "$f.new" fill ef:grad.embed nan && mv "$f.new" "$f" ||
    { echo "FAIL: ckpt_edit could not write a NaN residual into $f"; fail=1; }
done
refused nan_residual 2 "--steps 12 --ckpt $tmp/ck_nan --resume" \
  "ckpt: entry .ef:grad.embed. is refused: loom_ef_set: .grad.embed. value 0 of" "a NaN residual"

# A damaged file is refused on every rank with a message, and nothing trains.
printf 'X' | dd of="$ck/step-00000008/rank-00001.ckpt" bs=1 seek=200 conv=notrunc 2>/dev/null
refused damaged 2 "--steps 12 --ckpt $ck --resume" \
  "CRC32C" "a damaged checkpoint"
# Another world size is refused too.
refused np3 3 "--steps 12 --ckpt $ck --resume" \
  "resume with the world size" "a checkpoint of 2 ranks at np 3"
# Ranks whose checkpoints hold different --compress auto plans (rank 1's file from another run)
# are refused at the resume, naming the cause, not at the first exchange as a corrupt payload.
# The link speed set by hand makes the plans differ: compressed on a slow link, not on a fast one.
run_env auto_slow 2 "LOOM_NET_GBPS=0.001" --compress auto --ckpt "$tmp/ck_slow" --save-every 8
run_env auto_fast 2 "LOOM_NET_GBPS=10000" --compress auto --ckpt "$tmp/ck_fast" --save-every 8
cp "$tmp/ck_fast/step-00000008/rank-00001.ckpt" "$tmp/ck_slow/step-00000008/rank-00001.ckpt"
refused mixed 2 "--compress auto --steps 10 --ckpt $tmp/ck_slow --resume" \
  "hold different --compress auto plans" "a folder of ranks with different --compress auto plans"
# A plan whose codec index is out of range, or with its codecs but not its schemes: refused as
# damaged (the files' CRCs are right: ckpt_edit rewrites them whole).
edited() { # NAME OP ENTRY [VALUE]: ck_slow's step 8 with both ranks' files edited, in $tmp/NAME
  rm -rf "$tmp/$1" && cp -r "$tmp/ck_slow" "$tmp/$1" ||
    { echo "FAIL: could not copy the checkpoint for $1"; fail=1; }
  for r in 0 1; do
    f="$tmp/$1/step-00000008/rank-0000$r.ckpt"
    "$b/tests/mpi/ckpt_edit" "$f" "$f.new" "$2" "$3" ${4:+"$4"} && mv "$f.new" "$f" ||
      { echo "FAIL: ckpt_edit $2 $3 on $f"; fail=1; }
  done
}
edited ck_codec fill auto.codec 99
refused bad_codec 2 "--compress auto --steps 10 --ckpt $tmp/ck_codec --resume" \
  "holds codec 99 for part 0" "a plan with codec 99"
edited ck_half drop auto.scheme
refused half_plan 2 "--compress auto --steps 10 --ckpt $tmp/ck_half --resume" \
  "holds the codecs of a --compress auto plan but not its schemes" "half a plan"
exit $fail
