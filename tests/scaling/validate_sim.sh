#!/usr/bin/env bash
# tests/scaling/validate_sim.sh — loom_sim against measurement on this machine: a profile at np 1
# per model (np 2 for the attention servers, whose exchanges one rank cannot time), then
# train_gpt at np 1..4 beside its prediction: the dense model unlimited and under slownet 1 and
# 10 Gbit/s, a MoE model (fine overlap), skewed documents without attention servers
# (the straggler) and with them.
# Usage (from the build folder): ../tests/scaling/validate_sim.sh [OUT_DIR]   (root: slownet)
# Environment: STEPS (default 40), CONFIGS (default "dense moe skew attn"), NETS (default
# "shm 1gbit 10gbit", the dense model's), REPEAT (default 1: runs of each measured cell, whose
# median step is compared; runs of one command differ by up to 5% on a shared host).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
b=${LOOM_BUILDDIR:-$PWD}
out=${1:-$b/sim-validate}
steps=${STEPS:-40}
repeat=${REPEAT:-1}
case $repeat in '' | *[!0-9]* | 0) echo "validate_sim: REPEAT=$repeat: pass a count >= 1" >&2; exit 2 ;; esac
configs=${CONFIGS:-dense moe skew attn}
nets=${NETS:-shm 1gbit 10gbit}
model="--layers 2 --width 128 --heads 4 --ctx 128 --batch 4 --sample 0 --val-every 0 --compress none"
[ -x "$b/examples/train_gpt" ] && [ -x "$b/loom_sim" ] ||
  { echo "validate_sim: run it from the build folder (examples/train_gpt, loom_sim)" >&2; exit 2; }
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 LOOM_BLAS_THREADS=1 OPENBLAS_NUM_THREADS=1

flags_of() { # CONFIG: train_gpt flags of the model; then the run's extra flags after '|'
  case $1 in
    dense) echo "|" ;;
    moe) echo "--moe-experts 4 --moe-topk 2 --moe-every 2|" ;;
    skew) echo "--doc-lengths skewed|" ;;
    attn) echo "--doc-lengths skewed --attn-servers inplace|" ;; # profiled with the servers
  esac
}
sim_flags_of() { # CONFIG: the loom_sim strategy that matches the measured run
  case $1 in
    dense) echo "--grad none --attn off" ;;
    moe) echo "--grad none --attn off --moe fine" ;;
    skew) echo "--grad none --attn off" ;;
    attn) echo "--grad none --attn inplace" ;;
  esac
}
run() { # NAME NET NP FLAGS...: one measured run, its JSON in out/NAME.json
  local name=$1 net=$2 np=$3 pre=()
  shift 3
  [ "$net" = shm ] || pre=("$here/../bench/slownet" "$net" --)
  "${pre[@]}" mpirun -np "$np" --oversubscribe -x LOOM_BLAS_THREADS -x OPENBLAS_NUM_THREADS \
    "$b/examples/train_gpt" "$@" --json "$out/$name.json" >"$out/$name.log" 2>&1 ||
    { echo "validate_sim: the $name run failed:"; tail -5 "$out/$name.log"; exit 1; }
}

printf "%-6s %-7s %3s %12s %12s %8s\n" config net np measured_ms predicted_ms error
worst=0
for config in $configs; do
  f=$(flags_of "$config")
  model_flags=${f%%|*} run_flags=${f#*|}
  # The attention servers' profile comes from 2 ranks: on one there is no exchange to time.
  pnp=1
  [ "$config" = attn ] && pnp=2
  # shellcheck disable=SC2086
  mpirun -np "$pnp" -x LOOM_BLAS_THREADS -x OPENBLAS_NUM_THREADS "$b/examples/train_gpt" $model \
    $model_flags --steps "$steps" --profile "$out/profile-$config.txt" >"$out/profile-$config.log" 2>&1
  config_nets=$nets
  [ "$config" = dense ] || config_nets=shm
  for net in $config_nets; do
    # shellcheck disable=SC2046
    "$b/loom_sim" --profile "$out/profile-$config.txt" --cluster "$here/clusters/here-$net.cluster" \
      --ranks 1,2,3,4 $(sim_flags_of "$config") --csv "$out/sim-$config-$net.csv" \
      >"$out/sim-$config-$net.txt"
    for np in 1 2 3 4; do
      runs=""
      for k in $(seq 1 "$repeat"); do
        name="$config-$net-np$np"
        [ "$k" -eq 1 ] || name="$name-r$k"
        # shellcheck disable=SC2086
        run "$name" "$net" "$np" $model $model_flags $run_flags --steps "$steps"
        runs="$runs $(sed -n 's/.*"step_ms_median": \([0-9.]*\).*/\1/p' "$out/$name.json")"
      done
      # the median of the runs' medians (REPEAT runs of the same command)
      # shellcheck disable=SC2086 # one value a word
      m=$(printf '%s\n' $runs | sort -g |
        awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
      p=$(awk -F, -v np="$np" '$1 == np {print $3}' "$out/sim-$config-$net.csv")
      e=$(awk -v m="$m" -v p="$p" 'BEGIN {printf "%+.1f", 100 * (p - m) / m}')
      printf "%-6s %-7s %3s %12.2f %12.2f %7s%%\n" "$config" "$net" "$np" "$m" "$p" "$e"
      worst=$(awk -v w="$worst" -v e="$e" 'BEGIN {a = e < 0 ? -e : e; print (a > w ? a : w)}')
    done
  done
done
echo "validate_sim: worst |error| ${worst}% (goal 10%)"
