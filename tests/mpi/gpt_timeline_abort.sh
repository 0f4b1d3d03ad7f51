#!/bin/sh
# gpt_timeline_abort.sh — a job that aborts keeps its timelines: train_gpt at np 2 with
# LOOM_TIMELINE and a NaN injected at step 4 (LOOM_NONFINITE=abort: loom_abort on every rank).
# Each rank's trace must be complete JSON holding the events of the steps before the abort (the
# buffer of 65536 events was never full, so before loom_abort wrote it out the file held none).
set -u
. "${srcdir:-.}/tests/mpi/gpt_lib.sh" # $b, $exe, $tmp/corpus, run, run_env
py=$(command -v python3) || { echo "SKIP: no python3 to read the traces as JSON"; exit 77; }
common="--layers 1 --width 32 --heads 2 --ctx 32 --batch 2 --steps 6 --seed 3 --sample 0 \
  --val-every 0 --sgemm-reps 0 --data $tmp/corpus --inject-nan 3"
cat >"$tmp/abort.mpi" <<SPEC
np=2
prog=examples/train_gpt
env='LOOM_COMPRESS=none LOOM_NONFINITE=abort LOOM_TIMELINE=$tmp/tl.%r.json'
args='$common'
expect=fail
grep='aborts the job: train_gpt: step 4: non-finite gradient (LOOM_NONFINITE=abort)'
SPEC
"$sh" "$b/tests/mpirun.sh" "$tmp/abort.mpi" >"$tmp/abort.log" 2>&1 ||
  { cat "$tmp/abort.log"; echo "FAIL: the aborting run"; exit 1; }
echo "ok: the run aborted at step 4 with its reason"
for r in 0 1; do
  f=$tmp/tl.$r.json
  # Valid JSON, with events of steps 0 to 2 (step 3 aborts: its events may or may not be in).
  if "$py" "$src/tests/mpi/trace_steps.py" "$f"; then
    echo "ok: rank $r's timeline is complete JSON with the events of steps 0-2"
  else
    echo "FAIL: rank $r's timeline $f is not complete JSON with the steps before the abort:"
    head -c 600 "$f"; echo
    fail=1
  fi
done
exit $fail
