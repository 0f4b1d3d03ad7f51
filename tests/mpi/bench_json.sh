#!/bin/sh
# bench_json.sh — the benchmarks' --json stays JSON where a number is not measured: attn_perf at
# np 1 (no ping-pong) and moe_perf without the `none` mode (no T_seq) once printed nan.
set -u
b=${LOOM_BUILDDIR:-.}
sh=${SHELL:-/bin/sh}
for p in attn_perf moe_perf; do
  [ -x "$b/tests/bench/$p" ] || { echo "FAIL: $b/tests/bench/$p is not built"; exit 99; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
# run NAME NP PROG ARGS: the spec under tests/mpirun.sh, then NAME.json checked
run() {
  name=$1 np=$2 prog=$3
  shift 3
  cat >"$tmp/$name.mpi" <<SPEC
np=$np
prog=tests/bench/$prog
args='$* --json $tmp/$name.json'
SPEC
  if ! "$sh" "$b/tests/mpirun.sh" "$tmp/$name.mpi" >"$tmp/$name.log" 2>&1; then
    cat "$tmp/$name.log"
    echo "FAIL: $name: the run failed"
    fail=1
    return
  fi
  if grep -qi 'nan\|inf' "$tmp/$name.json"; then
    cat "$tmp/$name.json"
    echo "FAIL: $name: nan or inf in the JSON"
    fail=1
  elif command -v python3 >/dev/null 2>&1 &&
    ! python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/$name.json"; then
    echo "FAIL: $name: python3 cannot read $tmp/$name.json as JSON"
    fail=1
  else
    echo "ok: $name"
  fi
}
run attn_np1 1 attn_perf --docs 2 --mean-len 32 --heads 1 --head-dim 8 --iters 1
grep -q '"pingpong": {"serial_ms": null' "$tmp/attn_np1.json" 2>/dev/null ||
  { echo "FAIL: attn_np1: the unmeasured ping-pong is not null"; fail=1; }
run moe_coarse 2 moe_perf --tokens 16 --hidden 8 --ffn 16 --experts 2 --topk 1 --iters 1 \
  --warmup 0 --modes coarse
grep -q '"t_seq_ms": null' "$tmp/moe_coarse.json" 2>/dev/null ||
  { echo "FAIL: moe_coarse: T_seq without the none mode is not null"; fail=1; }
exit $fail
