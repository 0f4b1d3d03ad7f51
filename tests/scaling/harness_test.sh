#!/usr/bin/env bash
# harness_test.sh — the scaling harness end to end at np 1 and 2 (--quick): run_scaling.sh, then
# collect.py and plot.sh; checks the CSV rows, the PNGs, a malformed JSON and a failing run.
# shellcheck disable=SC2015 # "test && ok || bad": ok only echoes, it cannot fail
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -euo pipefail

# Under --enable-sanitizers: no leak report for the MPI programs (Open MPI never frees some of its
# own allocations), as tests/mpirun.sh does; ASan still stops at the first bad access.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export ASAN_OPTIONS
b=${LOOM_BUILDDIR:-.}
src=${LOOM_SRCDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
dir=$src/tests/scaling
[ -x "$b/examples/train_gpt" ] && [ -x "$b/tests/bench/coll_perf" ] || {
  echo "FAIL: $b/examples/train_gpt or $b/tests/bench/coll_perf is not built"
  exit 99
}
py=python3
command -v "$py" >/dev/null 2>&1 || py=/usr/bin/python3
command -v "$py" >/dev/null 2>&1 || {
  echo "SKIP: no python3 for collect.py"
  exit 77
}
corpus=$src/tests/mpi/gpt_corpus.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() {
  echo "FAIL: $*"
  fail=1
}

# ---- the runs: dense and coll_perf, compress none and int8, weak, np 1 and 2
out=$tmp/out
if ! bash "$dir/run_scaling.sh" --quick --np 1,2 --configs dense,coll --compress none,int8 \
  --mode weak --builddir "$b" --out "$out" --timeout 120 \
  --train-args "--data $corpus --sgemm-reps 0" >"$tmp/run.log" 2>&1; then
  cat "$tmp/run.log"
  echo "FAIL: run_scaling.sh failed"
  exit 1
fi
cat "$tmp/run.log"
grep -q '^\[4/8\] dense int8 weak unlimited np 2 \.\.\. [0-9.]* tokens/s' "$tmp/run.log" &&
  ok "progress lines" || bad "no progress line '[4/8] dense int8 weak unlimited np 2 ... N tokens/s'"
n=$(find "$out/runs" -name '*.json' | wc -l)
[ "$n" -eq 8 ] && ok "8 JSON files" || bad "$n JSON files in $out/runs, expected 8"
[ "$(find "$out/runs" -name '*.log' | wc -l)" -eq 8 ] && ok "8 logs" || bad "not 8 logs"

# ---- collect: the expected rows
"$py" "$dir/collect.py" "$out" >"$tmp/collect.log" 2>&1 || {
  cat "$tmp/collect.log"
  bad "collect.py failed"
}
cat "$tmp/collect.log"
csv=$out/scaling.csv
check_csv() { # what: the 4 train rows (dense, none|int8, weak, np 1|2, tokens_per_s > 0) and coll rows
  awk -F, '
    NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    $c["kind"] == "train" {
      t++
      k = $c["config"] "/" $c["compress"] "/" $c["mode"] "/" $c["np"]
      seen[k]++
      if (!($c["tokens_per_s"] > 0)) { print "tokens_per_s not > 0: " $0; bad = 1 }
      if ($c["np"] == 1 && $c["speedup"] != 1) { print "speedup at np 1 is not 1: " $0; bad = 1 }
      if ($c["nodes"] != 1) { print "nodes is not 1: " $0; bad = 1 }
      if ($c["batch_per_rank"] != 2) { print "batch_per_rank is not 2: " $0; bad = 1 }
      if ($c["compress"] == "int8" && $c["np"] == 2 && !($c["bytes_sent_per_step"] > 0)) {
        print "int8 at np 2 sent no bytes: " $0; bad = 1 }
    }
    $c["kind"] == "coll" {
      if ($c["np"] == 2 && $c["op"] == "allreduce" && $c["busbw"] > 0) ar[$c["compress"]] = 1
      if ($c["op"] == "alltoall") a2a = 1
    }
    END {
      split("none int8", cs, " ")
      for (i = 1; i <= 2; i++) for (n = 1; n <= 2; n++) {
        k = "dense/" cs[i] "/weak/" n
        if (seen[k] != 1) { print "expected one train row " k ", found " seen[k] + 0; bad = 1 }
      }
      if (t != 4) { print "expected 4 train rows, found " t; bad = 1 }
      if (!ar["none"] || !ar["int8"]) { print "no allreduce busbw > 0 at np 2 for none and int8"; bad = 1 }
      if (!a2a) { print "no alltoall rows (coll_perf --op all)"; bad = 1 }
      exit bad
    }' "$csv"
}
if check_csv; then ok "scaling.csv has the 4 train rows and the coll_perf rows"; else bad "scaling.csv rows"; fi

# ---- plot (skipped without gnuplot)
is_png() { [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; }
if command -v gnuplot >/dev/null 2>&1; then
  if bash "$dir/plot.sh" "$out"; then
    for p in throughput efficiency coll_busbw; do
      [ -s "$out/$p.png" ] && is_png "$out/$p.png" && ok "$p.png is a PNG" || bad "$out/$p.png is not a PNG"
    done
  else
    bad "plot.sh failed"
  fi
else
  echo "skip: gnuplot not installed (apt-get install gnuplot-nox): no PNG checks"
fi
# plot.sh without gnuplot on PATH: exit 1 and the package's name.
mkdir "$tmp/nognuplot"
for t in awk mktemp rm sort grep; do ln -s "$(command -v $t)" "$tmp/nognuplot/$t"; done
rc=0
PATH=$tmp/nognuplot "$BASH" "$dir/plot.sh" "$out" >"$tmp/plot.log" 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -q gnuplot-nox "$tmp/plot.log" && ok "plot.sh without gnuplot: exit 1 naming gnuplot-nox" ||
  bad "plot.sh without gnuplot: exit $rc, $(cat "$tmp/plot.log")"

# ---- a malformed JSON is reported and skipped
printf '{"harness": {"kind": "train", "np": 2}, "tokens_per_s": ' >"$out/runs/broken.json"
rc=0
"$py" "$dir/collect.py" "$out" --quiet >"$tmp/collect2.log" 2>&1 || rc=$?
cat "$tmp/collect2.log"
[ $rc -eq 0 ] && grep -q 'skipping .*broken.json: not valid JSON' "$tmp/collect2.log" &&
  grep -q '(1 skipped)' "$tmp/collect2.log" && ok "malformed JSON reported and skipped" ||
  bad "malformed JSON: exit $rc"
check_csv >/dev/null && ok "the CSV is unchanged by the malformed file" || bad "CSV after broken.json"

# ---- a failing run is reported with its log, and the harness exits non-zero at the end
rc=0
bash "$dir/run_scaling.sh" --quick --np 1 --configs dense --compress none,int8 --mode weak \
  --builddir "$b" --out "$tmp/out2" --train-args "--data $corpus --layers 0" >"$tmp/run2.log" 2>&1 || rc=$?
cat "$tmp/run2.log"
[ $rc -eq 1 ] && grep -q '^\[1/2\] dense none weak unlimited np 1 \.\.\. FAILED' "$tmp/run2.log" &&
  grep -q '^\[2/2\] dense int8 weak unlimited np 1 \.\.\. FAILED' "$tmp/run2.log" &&
  grep -q '    | ' "$tmp/run2.log" && grep -q '2 of 2 runs failed' "$tmp/run2.log" &&
  ok "failed runs reported with the tail of their logs, exit 1" || bad "failed runs: exit $rc"

# ---- --dry-run prints the commands and runs nothing; bad flags exit 2
bash "$dir/run_scaling.sh" --dry-run --np 1,2,3,4 --mode strong --global-batch 8 --configs dense \
  --compress none --builddir "$b" --out "$tmp/out3" --ranks-per-node 2 \
  --mpirun-args "-x FOO=1" >"$tmp/dry.log" 2>&1 || bad "--dry-run failed"
cat "$tmp/dry.log"
grep -q 'skip: dense none strong unlimited np 3' "$tmp/dry.log" &&
  grep -q -- '-np 4 --map-by ppr:2:node --oversubscribe -x FOO=1 .*train_gpt .*--batch 2 ' "$tmp/dry.log" &&
  [ ! -e "$tmp/out3" ] && ok "--dry-run: strong batches, np 3 skipped, launcher flags" || bad "--dry-run output"
rc=0
bash "$dir/run_scaling.sh" --configs dense,bogus >/dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] && ok "a bad --configs exits 2" || bad "a bad --configs exited $rc"

exit $fail
