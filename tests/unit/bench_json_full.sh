#!/bin/sh
# bench_json_full.sh — a benchmark whose --json file cannot be written whole (/dev/full: every
# write fails) exits non-zero naming the file and the error; compute_perf and gemm_perf exited 0.
set -u
b=${LOOM_BUILDDIR:-.}
[ -c /dev/full ] || { echo "SKIP: no /dev/full here"; exit 77; }
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
fail=0
want='--json /dev/full: writing failed: No space left on device'
# full PROG ARGS...: exit 1 and $want on stderr
full() {
  p=$1
  shift
  [ -x "$b/tests/bench/$p" ] || { echo "FAIL: $b/tests/bench/$p is not built"; fail=1; return; }
  LOOM_BLAS_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout 300 "$b/tests/bench/$p" "$@" \
    --json /dev/full >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -eq 1 ] && grep -q 'lacks AVX2' "$tmp/err"; then
    echo "($p: no AVX2 here, not checked)"
  elif [ $rc -ne 1 ] || ! grep -q -- "$want" "$tmp/err"; then
    echo "FAIL: $p: exit $rc (want 1), stderr: $(tail -2 "$tmp/err")"
    fail=1
  else
    echo "ok: $p"
  fi
}
full compute_perf --quick -n 1 -w 0
full gemm_perf -n 1 --width 8 --tokens 8
exit $fail
