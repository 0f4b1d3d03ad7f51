#!/bin/sh
# watchdog_timeline.sh — a LOOM_TIMEOUT abort keeps the waiting ranks' timelines: test_watchdog
# skip-sched at np 3 (a step scheduler; rank 1 skips the fourth step and sleeps) with
# LOOM_TIMELINE. Ranks 0 and 2 time out; each writes out its trace before the abort, which must
# be complete JSON holding steps 0-2 (three steps fill nothing like the 65536-event buffer).
set -u
b=${LOOM_BUILDDIR:-.}
src=${srcdir:-.}
sh=${SHELL:-/bin/sh}
[ -x "$b/tests/mpi/test_watchdog" ] || { echo "FAIL: $b/tests/mpi/test_watchdog is not built"; exit 99; }
py=$(command -v python3) || { echo "SKIP: no python3 to read the traces as JSON"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/hang.mpi" <<SPEC
np=3
prog=test_watchdog
args='skip-sched 1'
env='LOOM_TIMEOUT=3 LOOM_STALL_WARN=0 LOOM_TIMELINE=$tmp/tl.%r.json'
expect=fail
timeout_s=40
grep="LOOM_TIMEOUT: allreduce('grad.sched', 256 f32, sum) on group world (3 ranks) did not complete"
SPEC
"$sh" "$b/tests/mpirun.sh" "$tmp/hang.mpi" >"$tmp/hang.log" 2>&1 ||
  { cat "$tmp/hang.log"; echo "FAIL: the hanging run"; exit 1; }
echo "ok: the job aborted on LOOM_TIMEOUT"
fail=0
for r in 0 2; do
  f=$tmp/tl.$r.json
  if "$py" "$src/tests/mpi/trace_steps.py" "$f" grad.sched; then
    echo "ok: rank $r's timeline is complete JSON with steps 0-2"
  else
    echo "FAIL: rank $r's timeline $f lacks the steps before the timeout:"
    head -c 600 "$f"; echo
    fail=1
  fi
done
exit $fail
