#!/bin/sh
# fmnist_resume.sh — train_fmnist checkpoint and resume are bit-exact across an epoch boundary:
# 16 steps straight equal 10 steps, a SIGKILL of both ranks mid-step 13 and a --resume to 16
# (np 2, momentum buffers), once with int8 compression and error feedback, once with PowerSGD
# (whose warm-started Q must be saved too). A resume with another --seed is refused.
set -u
b=${LOOM_BUILDDIR:-.}
sh=${SHELL:-/bin/sh}
exe=$b/examples/train_fmnist
[ -x "$exe" ] || { echo "FAIL: $exe is not built"; exit 99; }
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "SKIP: the Debian package dataset-fashion-mnist is not installed"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# 12 steps per epoch (--batch 2500 at np 2 of 60000 rows): the resume crosses into epoch 2.
fail=0
spec() { # name args expect [grep]: write and run one mpirun spec
  printf "np=2\nprog=examples/train_fmnist\nargs='%s'\nexpect=%s\ngrep='%s'\n" "$2" "$3" "${4:-}" \
    >"$tmp/$1.mpi"
  "$sh" "$b/tests/mpirun.sh" "$tmp/$1.mpi" >"$tmp/$1.log" 2>&1 ||
    { cat "$tmp/$1.log"; echo "FAIL: the $1 run"; exit 1; }
}
for c in int8 powersgd:2; do
  rm -rf "$tmp/ck"
  common="--hidden 32 --batch 2500 --steps 16 --seed 9 --lr 0.05 --compress $c"
  spec straight "$common --dump-params $tmp/straight.bin" pass
  spec killed "$common --ckpt $tmp/ck --save-every 10 --die-at 13" fail "exited on signal 9"
  [ "$(cat "$tmp/ck/latest" 2>/dev/null)" = 10 ] && echo "ok: $c: the killed run left step 10" ||
    { echo "FAIL: $c: no checkpoint of step 10"; exit 1; }
  grep -q "step 10/16  checkpoint $tmp/ck/step-00000010 (" "$tmp/killed.log" &&
    echo "ok: $c: the checkpoint is announced" ||
    { cat "$tmp/killed.log"; echo "FAIL: $c: no checkpoint line"; fail=1; }
  spec resumed "$common --ckpt $tmp/ck --save-every 10 --resume --dump-params $tmp/resumed.bin" pass
  grep -q "resume: step 10" "$tmp/resumed.log" && echo "ok: $c: resumed at step 10" ||
    { echo "FAIL: $c: the resumed run did not start at step 10"; fail=1; }
  if cmp -s "$tmp/straight.bin" "$tmp/resumed.bin"; then
    echo "ok: $c: 16 steps straight equal 10 + SIGKILL mid-step 13 + resume, bitwise"
  else
    echo "FAIL: $c: the resumed parameters differ from the straight run's"; fail=1
  fi
done
# --compress auto resumed from a checkpoint without a plan (PowerSGD's, step 10, past the steps
# auto profiles from the start) profiles from the resumed step and plans (it trained
# uncompressed, calling the plan one "from the checkpoint").
spec auto "--hidden 32 --batch 2500 --steps 17 --seed 9 --ckpt $tmp/ck --resume --compress auto" \
  pass
if grep -q "^compression plan (auto): " "$tmp/auto.log" &&
  ! grep -q "plan: from the checkpoint" "$tmp/auto.log"; then
  echo "ok: --compress auto resumed from a PowerSGD checkpoint profiles and plans"
else
  cat "$tmp/auto.log"; echo "FAIL: --compress auto resumed from a PowerSGD checkpoint"; fail=1
fi
# A checkpoint at or past the last step: said so, nothing trained, a clean exit.
spec past "--hidden 32 --batch 2500 --steps 8 --seed 9 --ckpt $tmp/ck --resume \
  --compress powersgd:2 --json $tmp/past.json" pass
if grep -q "resume: step 10 .* past the last step (8): nothing left to train" "$tmp/past.log" &&
  grep -q "^done: nothing trained" "$tmp/past.log" && ! grep -q "^epoch" "$tmp/past.log" &&
  grep -q '"test_acc": -1.000000, "samples_per_s": -1.0,' "$tmp/past.json" &&
  ! grep -qi 'nan\|inf' "$tmp/past.json"; then
  echo "ok: resuming past the end says so, trains nothing and reports no rate (-1)"
else
  cat "$tmp/past.log"; echo "FAIL: resuming past the end"; fail=1
fi
# Another --seed shuffles the epochs otherwise: the run would not continue the one it resumes.
spec seed "--hidden 32 --batch 2500 --steps 16 --seed 10 --ckpt $tmp/ck --resume \
  --compress powersgd:2" fail
if grep -q "was saved with --seed 9, this run has --seed 10" "$tmp/seed.log"; then
  echo "ok: a resume with another --seed is refused, naming the flag"
else
  cat "$tmp/seed.log"; echo "FAIL: a resume with another --seed"; fail=1
fi
# A damaged latest (not only digits and a newline): refused, naming the file, nothing trained.
for bad in 10abc 99999999999999999999; do # (each run loads the dataset: two cases, not more)
  printf '%s\n' "$bad" >"$tmp/ck/latest"
  spec "latest_$bad" "--hidden 32 --batch 2500 --steps 16 --seed 9 --ckpt $tmp/ck --resume" fail
  if grep -q "latest does not hold a step number" "$tmp/latest_$bad.log"; then
    echo "ok: latest '$bad' is refused"
  else
    cat "$tmp/latest_$bad.log"; echo "FAIL: latest '$bad' was not refused clearly"; fail=1
  fi
done
exit $fail
