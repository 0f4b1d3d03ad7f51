#!/bin/sh
# help_flags.sh — every program answers --help and -h alike: the usage on stdout, nothing on
# stderr, exit 0; an unknown flag is named on stderr with exit 2, and so is a last flag that
# lacks its value (compute_perf called --json an unknown argument) (no MPI, no GPU needed).
set -u
b=${LOOM_BUILDDIR:-.}
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
fail=0
# help PROG ARGS...: usage on stdout only, exit 0
help() {
  p=$1
  shift
  timeout 60 "$b/$p" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q 'usage' "$tmp/out" || [ -s "$tmp/err" ]; then
    echo "FAIL: $p $*: exit $rc (want 0), usage on stdout: $(head -1 "$tmp/out"), stderr: $(head -2 "$tmp/err")"
    fail=1
  fi
}
# refused PROG FLAG TEXT: PROG given FLAG alone exits 2 with TEXT on stderr
refused() {
  timeout 60 "$b/$1" "$2" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -ne 2 ] || ! grep -q -e "$3" "$tmp/err"; then
    echo "FAIL: $1 $2: exit $rc (want 2 and '$3'), stderr: $(head -2 "$tmp/err")"
    fail=1
  fi
}
# unknown PROG FLAG: a message that names the flag
unknown() { refused "$1" "$2" "'$2'"; }
# novalue PROG FLAG: FLAG last, without its value: "FLAG needs a value"
novalue() { refused "$1" "$2" "$2 needs a value"; }
progs="loom_info loom_timeline_merge tests/bench/gemm_perf tests/bench/coll_perf tests/bench/plan_perf"
[ -x "$b/tests/bench/gpu_attn_perf" ] && progs="$progs tests/bench/gpu_attn_perf" # --with-cuda
for p in $progs; do
  [ -x "$b/$p" ] || { echo "FAIL: $b/$p is not built"; fail=1; continue; }
  help "$p" --help
  help "$p" -h
done
help loom_sim --help
for p in tests/bench/gemm_perf tests/bench/gpu_attn_perf tests/bench/plan_perf; do
  [ -x "$b/$p" ] && unknown "$p" --x
done
novalue tests/bench/compute_perf --json
novalue tests/bench/gemm_perf --json
for p in tests/bench/gpu_gemm_perf tests/bench/gpu_attn_perf; do # --with-cuda
  [ -x "$b/$p" ] && novalue "$p" --json
done
# The trainers' usage fits 100 columns (train_gpt's --data line, with its default path, ran to 109)
for p in examples/train_gpt examples/train_fmnist loom_sim; do
  [ -x "$b/$p" ] || continue
  help "$p" --help
  wide=$(awk 'length > 100' "$tmp/out")
  if [ -n "$wide" ]; then
    echo "FAIL: $p --help: lines wider than 100 columns: $wide"
    fail=1
  fi
done
# (the merge tool's usage with -f first is help too, not an unknown option)
help loom_timeline_merge -f --help
[ $fail -eq 0 ] && echo "ok: --help and -h print the usage on stdout and exit 0; unknown flags and missing values named"
exit $fail
