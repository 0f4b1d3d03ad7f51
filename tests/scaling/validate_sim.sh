#!/usr/bin/env bash
# tests/scaling/validate_sim.sh — loom_sim against measurement on this machine: a profile at np 1,
# then train_gpt at np 1..4 unlimited and under slownet 1 and 10 Gbit/s, each beside its prediction.
# Usage (from the build folder): ../tests/scaling/validate_sim.sh [OUT_DIR]   (needs root: slownet)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
b=${LOOM_BUILDDIR:-$PWD}
out=${1:-$b/sim-validate}
steps=${STEPS:-40}
model=${MODEL:---layers 2 --width 128 --heads 4 --ctx 128 --batch 4}
[ -x "$b/examples/train_gpt" ] && [ -x "$b/loom_sim" ] ||
  { echo "validate_sim: run it from the build folder (examples/train_gpt, loom_sim)" >&2; exit 2; }
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 LOOM_BLAS_THREADS=1 OPENBLAS_NUM_THREADS=1
common="$model --sample 0 --val-every 0 --compress none"
run() { # NET NP: one measured run, its JSON in out/NET-npNP.json
  local net=$1 np=$2 pre=()
  [ "$net" = shm ] || pre=("$here/../bench/slownet" "$net" --)
  # shellcheck disable=SC2086
  "${pre[@]}" mpirun -np "$np" --oversubscribe -x LOOM_BLAS_THREADS -x OPENBLAS_NUM_THREADS \
    "$b/examples/train_gpt" $common --steps "$steps" --json "$out/$net-np$np.json" \
    >"$out/$net-np$np.log" 2>&1 || { echo "validate_sim: the $net np $np run failed:"; tail -5 "$out/$net-np$np.log"; exit 1; }
}
echo "validate_sim: profile at np 1"
# shellcheck disable=SC2086
mpirun -np 1 -x LOOM_BLAS_THREADS -x OPENBLAS_NUM_THREADS "$b/examples/train_gpt" $common \
  --steps "$steps" --profile "$out/profile.txt" >"$out/profile.log" 2>&1
printf "%-6s %3s %12s %12s %8s\n" net np measured_ms predicted_ms error
worst=0
for net in shm 1gbit 10gbit; do
  "$b/loom_sim" --profile "$out/profile.txt" --cluster "$here/clusters/here-$net.cluster" \
    --ranks 1,2,3,4 --grad none --attn off --csv "$out/sim-$net.csv" >"$out/sim-$net.txt"
  for np in 1 2 3 4; do
    run "$net" "$np"
    m=$(sed -n 's/.*"step_ms": \([0-9.]*\).*/\1/p' "$out/$net-np$np.json")
    p=$(awk -F, -v np="$np" '$1 == np {print $3}' "$out/sim-$net.csv")
    e=$(awk -v m="$m" -v p="$p" 'BEGIN {printf "%+.1f", 100 * (p - m) / m}')
    printf "%-6s %3s %12.2f %12.2f %7s%%\n" "$net" "$np" "$m" "$p" "$e"
    worst=$(awk -v w="$worst" -v e="$e" 'BEGIN {a = e < 0 ? -e : e; print (a > w ? a : w)}')
  done
done
echo "validate_sim: worst |error| ${worst}% (goal 10%)"
