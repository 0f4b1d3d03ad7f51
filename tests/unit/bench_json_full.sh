#!/bin/sh
# bench_json_full.sh — a benchmark whose --json file cannot be written whole (/dev/full: every
# write fails) exits non-zero naming the file and the error; compute_perf and gemm_perf exited 0.
# The GPU benches refuse a --json path they cannot create before they look for a device.
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
# The GPU benches (CUDA builds) check the path before anything else, even without a device.
for p in gpu_gemm_perf gpu_attn_perf; do
  [ -x "$b/tests/bench/$p" ] || continue
  timeout 60 "$b/tests/bench/$p" --json "$tmp/no/such/dir/x.json" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -ne 2 ] || ! grep -q -- "--json $tmp/no/such/dir/x.json" "$tmp/err"; then
    echo "FAIL: $p --json into a missing folder: exit $rc (want 2), stderr: $(tail -2 "$tmp/err")"
    fail=1
  else
    echo "ok: $p refuses an unwritable --json before running"
  fi
done
exit $fail
