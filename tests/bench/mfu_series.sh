#!/usr/bin/env bash
# tests/bench/mfu_series.sh — train_gpt's MFU over runs one after the other (np 1, one BLAS thread):
# per run the MFU and the sgemm rate at its start and end, then the medians; a host that drifts shows.
# Usage (from the build folder): ../tests/bench/mfu_series.sh [--runs N] [--steps S]
#   [--max-drift PCT] [-- more train_gpt flags]        defaults: 6 runs of 100 steps, 1.5%
# A run whose sgemm rate moved by more than PCT between its start and end ran on a host whose
# speed changed under it (MFU divides by the start's rate): the "steady" median leaves it out.
set -euo pipefail
runs=6 steps=100 max_drift=1.5
usage() { sed -n '4,5p' "$0" | sed 's/^# //' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --runs) [ $# -ge 2 ] || usage; runs=$2; shift 2 ;;
    --steps) [ $# -ge 2 ] || usage; steps=$2; shift 2 ;;
    --max-drift) [ $# -ge 2 ] || usage; max_drift=$2; shift 2 ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) echo "mfu_series: unknown flag '$1'" >&2; usage ;;
  esac
done
for v in "$runs" "$steps"; do # each a whole number of 1 to 6 digits, >= 1
  case $v in
    '' | *[!0-9]* | ???????*) echo "mfu_series: --runs and --steps take whole numbers 1..999999, got '$v'" >&2; exit 2 ;;
  esac
  [ "$v" -ge 1 ] || { echo "mfu_series: --runs and --steps must be >= 1, got '$v'" >&2; exit 2; }
done
awk -v d="$max_drift" 'BEGIN { exit !(d + 0 == d && d >= 0) }' ||
  { echo "mfu_series: --max-drift takes a percentage >= 0, got '$max_drift'" >&2; exit 2; }
b=${LOOM_BUILDDIR:-.}
[ -x "$b/examples/train_gpt" ] ||
  { echo "mfu_series: run it from the build folder (no examples/train_gpt)" >&2; exit 2; }
export LOOM_BLAS_THREADS=${LOOM_BLAS_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

num() { sed -n "s/.*\"$1\": \([-0-9.e+]*\).*/\1/p" "$2"; } # a number from the JSON
printf '%-4s %10s %9s %13s %11s %7s %7s %9s %12s\n' run tokens/s ms/step "sgemm start" "sgemm end" drift mfu mfu_attn mfu_sampled
for i in $(seq 1 "$runs"); do
  "$b/examples/train_gpt" --steps "$steps" --sample 0 --val-every 0 --log-every "$steps" \
    --json "$tmp/$i.json" "$@" >"$tmp/$i.log" 2>&1 ||
    { cat "$tmp/$i.log"; echo "mfu_series: run $i failed" >&2; exit 1; }
  j=$tmp/$i.json
  start=$(num sgemm_gflops "$j") end=$(num sgemm_end_gflops "$j") mfu=$(num mfu "$j")
  awk -v s="$start" -v m="$mfu" 'BEGIN { exit !(s > 0 && m > 0) }' ||
    { echo "mfu_series: run $i measured no MFU (sgemm $start): drop --sgemm-reps 0 or --sync comm-only" >&2; exit 1; }
  drift=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%+.1f", (e > 0 ? 100 * (e - s) / s : 0) }')
  sampled=$(num mfu_sampled "$j")
  printf '%-4s %10.0f %9.1f %13.1f %11.1f %6s%% %7.3f %9.3f %12.3f\n' "$i" "$(num tokens_per_s "$j")" \
    "$(num step_ms "$j")" "$start" "$end" "$drift" "$mfu" "$(num mfu_attn "$j")" "$sampled"
  echo "$mfu $drift $sampled" >>"$tmp/all"
done
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) printf "%.3f", v[(NR + 1) / 2]; else printf "%.3f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
all=$(awk '{ print $1 }' "$tmp/all" | median)
steady=$(awk -v d="$max_drift" '{ x = $2 < 0 ? -$2 : $2; if (x <= d) print $1 }' "$tmp/all")
nsteady=$(echo "$steady" | grep -c . || true)
echo "median mfu: $all over $runs runs; $(echo "$steady" | grep . | median) over the $nsteady whose sgemm rate moved by at most $max_drift%"
echo "runs at mfu >= 0.85: $(awk '$1 >= 0.85' "$tmp/all" | wc -l) of $runs"
echo "median mfu_sampled (against the rate sampled every 20 steps, or --sgemm-every): $(awk '{ print $3 }' "$tmp/all" | median); runs at >= 0.85: $(awk '$3 >= 0.85' "$tmp/all" | wc -l) of $runs"
