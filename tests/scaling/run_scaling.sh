#!/usr/bin/env bash
# run_scaling.sh — weak and strong scaling of examples/train_gpt (dense, MoE, attention servers, with
# and without gradient compression) and tests/bench/coll_perf under mpirun: one JSON and log per run.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: tests/scaling/run_scaling.sh [flags]

Runs examples/train_gpt and tests/bench/coll_perf under mpirun at each rank count, one run per
(net, config, compress, mode, np); each writes OUT/runs/NAME.json (the program's --json with a
"harness" object added) and OUT/runs/NAME.log. A failed run is reported with the tail of its log
and the rest go on; the exit status is 1 when any run failed. Then:
  tests/scaling/collect.py OUT     (OUT/scaling.csv)     tests/scaling/plot.sh OUT   (PNGs)

where the ranks run
  --np LIST            rank counts (default 1,2,3,4)
  --hostfile FILE      mpirun hostfile (Open MPI --hostfile, MPICH/Hydra -f); without it every
                       rank runs on this machine, oversubscribed (Open MPI --oversubscribe)
  --ranks-per-node N   Open MPI --map-by ppr:N:node, MPICH/Hydra -ppn N
  --mpirun-args "..."  extra mpirun flags, passed through verbatim (shell quoting applies),
                       e.g. "-x LOOM_BLAS_THREADS=1 --mca btl_tcp_if_include eth0"
  --mpirun CMD         the launcher (default: $MPIRUN, else mpirun)
  --net LIST           unlimited (default), or tc rates such as 1gbit,10gbit: each run is wrapped
                       in tests/bench/slownet RATE -- (one machine only, needs root)
what runs
  --configs LIST       any of dense, moe, attn, coll (default dense,moe,attn,coll)
                         dense: train_gpt as is;  moe: + --moe-args;  attn: + --attn-args;
                         coll: coll_perf with --coll-args (compress none: every collective;
                         a codec: its compressed allreduce; auto: no coll_perf run)
  --compress LIST      train_gpt --compress values (default none,auto)
  --mode LIST          weak: --batch per rank fixed;  strong: --global-batch fixed, per-rank
                       batch = global / np, rank counts it does not divide are skipped
                       (default weak,strong)
  --batch N            rows per rank in weak mode (default 8, --quick 2; a --batch inside
                       --train-args sets it too)
  --global-batch G     rows per step in strong mode (default: batch x the largest np)
  --steps N            train_gpt steps (default 20, --quick 3)
  --train-args "..."   more train_gpt flags for every run (model size, --data, ...), after
                       the harness's own (--sample 0 --val-every 0 --log-every 10)
  --moe-args "..."     default "--moe-experts 4 --moe-topk 2 --moe-every 2"
  --attn-args "..."    default "--attn-servers inplace --doc-lengths skewed"
  --coll-args "..."    default "-b 1M -e 16M -f 2 -n 20 -w 5" (--quick: "-b 64K -e 256K -n 5 -w 1")
  --quick              tiny model (2 layers, width 32, ctx 32), 3 steps, small coll_perf sizes
output
  --builddir DIR       where examples/train_gpt and tests/bench/coll_perf are (default: the
                       first of $LOOM_BUILDDIR, ., _build, the source tree that has both)
  --out DIR            results directory (default scaling-out)
  --timeout S          seconds per run before it is killed and counted failed (default 3600)
  --dry-run            print the commands, run nothing
  --help               this text
EOF
}

die() {
  echo "run_scaling: $*" >&2
  exit 2
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
srcroot=$(cd "$here/../.." && pwd)

# ---- flags ----------------------------------------------------------------------------------------
np_list=1,2,3,4
hostfile=
ppn=
mpirun_args=
launcher=${MPIRUN:-mpirun}
nets=unlimited
configs=dense,moe,attn,coll
compresses=none,auto
modes=weak,strong
batch=
global_batch=
steps=
train_args=
moe_args="--moe-experts 4 --moe-topk 2 --moe-every 2"
attn_args="--attn-servers inplace --doc-lengths skewed"
coll_args=
quick=0
builddir=
out=scaling-out
timeout_s=3600
dry=0

need() { [ $# -ge 2 ] || die "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case $1 in
    --help | -h)
      usage
      exit 0
      ;;
    --quick) quick=1 ;;
    --dry-run) dry=1 ;;
    --*=*)
      flag=${1%%=*}
      set -- "$flag" "${1#*=}" "${@:2}"
      continue
      ;;
    --np | --hostfile | --ranks-per-node | --mpirun-args | --mpirun | --net | --configs | \
      --compress | --mode | --batch | --global-batch | --steps | --train-args | --moe-args | \
      --attn-args | --coll-args | --builddir | --out | --timeout)
      need "$@"
      case $1 in
        --np) np_list=$2 ;;
        --hostfile) hostfile=$2 ;;
        --ranks-per-node) ppn=$2 ;;
        --mpirun-args) mpirun_args=$2 ;;
        --mpirun) launcher=$2 ;;
        --net) nets=$2 ;;
        --configs) configs=$2 ;;
        --compress) compresses=$2 ;;
        --mode) modes=$2 ;;
        --batch) batch=$2 ;;
        --global-batch) global_batch=$2 ;;
        --steps) steps=$2 ;;
        --train-args) train_args=$2 ;;
        --moe-args) moe_args=$2 ;;
        --attn-args) attn_args=$2 ;;
        --coll-args) coll_args=$2 ;;
        --builddir) builddir=$2 ;;
        --out) out=$2 ;;
        --timeout) timeout_s=$2 ;;
      esac
      shift
      ;;
    *) die "unknown flag '$1' (see --help)" ;;
  esac
  shift
done

posint() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, not '$2'"; }
split() { # LIST -> words (commas)
  local IFS=,
  # shellcheck disable=SC2206 # splitting on commas is the point
  words=($1)
}
# Shell words of a user string, quotes honoured (the user's own command line, as mpirun's).
shwords() {
  eval "words=($1)" || die "cannot parse '$1' as shell words"
}

split "$np_list"
nps=("${words[@]}")
[ ${#nps[@]} -gt 0 ] || die "--np is empty"
for n in "${nps[@]}"; do posint --np "$n"; done
split "$nets"
net_l=("${words[@]}")
split "$configs"
config_l=("${words[@]}")
split "$compresses"
compress_l=("${words[@]}")
split "$modes"
mode_l=("${words[@]}")
for c in "${config_l[@]}"; do
  case $c in dense | moe | attn | coll) ;; *) die "--configs: '$c' is not dense, moe, attn or coll" ;; esac
done
for m in "${mode_l[@]}"; do
  case $m in weak | strong) ;; *) die "--mode: '$m' is not weak or strong" ;; esac
done
for r in "${net_l[@]}"; do
  case $r in
    unlimited) ;;
    none | *bit)
      [ -z "$hostfile" ] || die "--net $r: slownet emulates a link on one machine; not with --hostfile"
      ;;
    *) die "--net: '$r' is not unlimited or a tc rate such as 1gbit, 10gbit (or none: TCP, no limit)" ;;
  esac
done
[ -z "$ppn" ] || posint --ranks-per-node "$ppn"
posint --timeout "$timeout_s"
[ -z "$hostfile" ] || [ -r "$hostfile" ] || die "--hostfile $hostfile: not readable"

# The per-rank batch may come inside --train-args (--batch N): take it out, the harness sets it.
shwords "$train_args"
targs=()
skip_next=0
for w in "${words[@]}"; do
  if [ $skip_next = 1 ]; then
    batch=${batch:-$w}
    skip_next=0
  elif [ "$w" = --batch ]; then
    skip_next=1
  elif [[ $w == --batch=* ]]; then
    batch=${batch:-${w#--batch=}}
  else
    targs+=("$w")
  fi
done
[ $skip_next = 0 ] || die "--train-args: --batch needs a value"
if [ $quick = 1 ]; then
  batch=${batch:-2}
  steps=${steps:-3}
  coll_args=${coll_args:-"-b 64K -e 256K -n 5 -w 1"}
  base_args=(--layers 2 --width 32 --heads 2 --ctx 32 --val-rows 4)
  moe_args="${moe_args/--moe-every 2/--moe-every 1}"
else
  batch=${batch:-8}
  steps=${steps:-20}
  coll_args=${coll_args:-"-b 1M -e 16M -f 2 -n 20 -w 5"}
  base_args=()
fi
posint --batch "$batch"
posint --steps "$steps"
maxnp=0
for n in "${nps[@]}"; do [ "$n" -gt "$maxnp" ] && maxnp=$n; done
global_batch=${global_batch:-$((batch * maxnp))}
posint --global-batch "$global_batch"

# ---- the programs ---------------------------------------------------------------------------------
has_progs() { [ -x "$1/examples/train_gpt" ] && [ -x "$1/tests/bench/coll_perf" ]; }
if [ -z "$builddir" ]; then
  for d in "${LOOM_BUILDDIR:-}" . _build "$srcroot/_build" "$srcroot"; do
    if [ -n "$d" ] && has_progs "$d"; then
      builddir=$d
      break
    fi
  done
  [ -n "$builddir" ] || die "no build with examples/train_gpt and tests/bench/coll_perf found \
(looked in \$LOOM_BUILDDIR, ., _build, $srcroot): build loom (make), or give --builddir DIR"
fi
has_progs "$builddir" || die "--builddir $builddir: examples/train_gpt or tests/bench/coll_perf \
is not built there (make; coll_perf is built by make too)"
builddir=$(cd "$builddir" && pwd)
slownet=$srcroot/tests/bench/slownet
mpi_kind=openmpi
if [ $dry = 0 ] || command -v "$launcher" >/dev/null 2>&1; then
  command -v "$launcher" >/dev/null 2>&1 || die "$launcher not found: install Open MPI \
(apt-get install openmpi-bin) or give --mpirun CMD"
  "$launcher" --version 2>&1 | grep -q 'Open MPI' || mpi_kind=hydra
fi

# ---- the launch line ------------------------------------------------------------------------------
shwords "$mpirun_args"
extra=("${words[@]}")
mpirun_for() { # np -> cmd=(launcher and its flags)
  cmd=("$launcher" -np "$1")
  if [ $mpi_kind = openmpi ]; then
    [ -z "$hostfile" ] || cmd+=(--hostfile "$hostfile")
    [ -z "$ppn" ] || cmd+=(--map-by "ppr:$ppn:node")
    [ -n "$hostfile" ] || cmd+=(--oversubscribe)
  else
    [ -z "$hostfile" ] || cmd+=(-f "$hostfile")
    [ -z "$ppn" ] || cmd+=(-ppn "$ppn")
  fi
  cmd+=("${extra[@]}")
}
# Open MPI as root needs its two allow variables (read by mpirun only). On one machine also no
# ptrace-based single copy (it fails in containers); on a cluster (--hostfile) that is left alone.
# A value the caller set wins.
if [ $mpi_kind = openmpi ]; then
  if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
    export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
  fi
  [ -n "$hostfile" ] ||
    export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
fi

declare -A nodes_of
nodes_for() { # np -> nodes: distinct hosts that mpirun puts the ranks on (1 without a hostfile)
  local n=$1
  if [ -z "$hostfile" ]; then
    nodes_of[$n]=1
  elif [ -z "${nodes_of[$n]:-}" ]; then
    mpirun_for "$n"
    if [ $dry = 1 ]; then
      nodes_of[$n]=-1
    elif hosts=$(timeout 300 "${cmd[@]}" hostname 2>/dev/null); then
      nodes_of[$n]=$(printf '%s\n' "$hosts" | sort -u | grep -c .)
    else
      echo "run_scaling: could not run hostname under '${cmd[*]}': nodes recorded as -1" >&2
      nodes_of[$n]=-1
    fi
  fi
  nodes=${nodes_of[$n]}
}

# ---- the plan: one line per run -------------------------------------------------------------------
# kind|net|config|compress|mode|np|batch_per_rank
plan=()
skipped=()
for net in "${net_l[@]}"; do
  for cfg in "${config_l[@]}"; do
    for comp in "${compress_l[@]}"; do
      if [ "$cfg" = coll ]; then
        if [ "$comp" = auto ]; then
          skipped+=("coll $comp $net: coll_perf has no --compress auto")
          continue
        fi
        for n in "${nps[@]}"; do plan+=("coll|$net|coll|$comp|bench|$n|0"); done
        continue
      fi
      for mode in "${mode_l[@]}"; do
        for n in "${nps[@]}"; do
          b=$batch
          if [ "$mode" = strong ]; then
            if [ $((global_batch % n)) -ne 0 ]; then
              skipped+=("$cfg $comp strong $net np $n: global batch $global_batch is not a multiple of $n")
              continue
            fi
            b=$((global_batch / n))
          fi
          plan+=("train|$net|$cfg|$comp|$mode|$n|$b")
        done
      done
    done
  done
done
total=${#plan[@]}
[ "$total" -gt 0 ] || die "nothing to run (every combination was skipped)"
for s in "${skipped[@]}"; do echo "skip: $s"; done
echo "run_scaling: $total runs; build $builddir; results in $out/runs; launcher $launcher ($mpi_kind)"

runs=$out/runs
[ $dry = 1 ] || mkdir -p "$runs"
[ $dry = 1 ] || runs=$(cd "$runs" && pwd)

# ---- run ------------------------------------------------------------------------------------------
jnum() { # key file -> the first number after "key": in a one-object JSON file
  sed -n "s/.*\"$1\": *\\(-\\{0,1\\}[0-9][0-9.e+-]*\\).*/\\1/p" "$2" | head -n 1
}
failed=()
i=0
for line in "${plan[@]}"; do
  i=$((i + 1))
  IFS='|' read -r kind net cfg comp mode n b <<<"$line"
  if [ "$kind" = coll ]; then
    name=coll-$comp-$net-np$n
    what="coll_perf $comp $net np $n"
    shwords "$coll_args"
    prog=("$builddir/tests/bench/coll_perf" "${words[@]}")
    if [ "$comp" = none ]; then prog+=(--op all); else prog+=(--compress "$comp"); fi
  else
    name=gpt-$cfg-$comp-$mode-$net-np$n
    what="$cfg $comp $mode $net np $n"
    prog=("$builddir/examples/train_gpt" --sample 0 --val-every 0 --log-every 10 "${base_args[@]}")
    case $cfg in
      moe) shwords "$moe_args" ;;
      attn) shwords "$attn_args" ;;
      *) words=() ;;
    esac
    prog+=("${words[@]}" "${targs[@]}" --steps "$steps" --batch "$b" --compress "$comp")
  fi
  name=${name//[^A-Za-z0-9._-]/_}
  json=$runs/$name.json
  log=$runs/$name.log
  prog+=(--json "$json")
  mpirun_for "$n"
  full=(timeout "$timeout_s" "${cmd[@]}" "${prog[@]}")
  [ "$net" = unlimited ] || full=(timeout "$timeout_s" "$slownet" "$net" -- "${cmd[@]}" "${prog[@]}")
  if [ $dry = 1 ]; then
    printf '[%d/%d] %s:' "$i" "$total" "$what"
    printf ' %q' "${full[@]}"
    printf '\n'
    continue
  fi
  nodes_for "$n"
  printf '[%d/%d] %s ... ' "$i" "$total" "$what"
  rm -f "$json" "$json.failed"
  t0=$(date +%s)
  rc=0
  {
    printf '#'
    printf ' %q' "${full[@]}"
    printf '\n'
  } >"$log"
  "${full[@]}" >>"$log" 2>&1 </dev/null || rc=$?
  secs=$(($(date +%s) - t0))
  if [ $rc -eq 0 ] && [ -s "$json" ]; then
    # The harness's view of the run, as the first key of the program's JSON object.
    st=$steps
    [ "$kind" = train ] || st=0
    meta=$(printf '{"kind": "%s", "config": "%s", "compress": "%s", "mode": "%s", "net": "%s", "np": %d, "nodes": %d, "batch_per_rank": %d, "steps": %d, "name": "%s"}' \
      "$kind" "$cfg" "$comp" "$mode" "$net" "$n" "$nodes" "$b" "$st" "$name")
    sed -i "1s/^{/{\"harness\": ${meta//\//\\/}, /" "$json"
    if [ "$kind" = coll ]; then
      printf 'avg busbw %.2f GB/s (%ss)\n' "$(jnum avg_busbw "$json")" "$secs"
    else
      echo "$(jnum tokens_per_s "$json") tokens/s, $(jnum step_ms "$json") ms/step (${secs}s)"
    fi
  else
    if [ $rc -eq 0 ]; then
      rc="0 but no JSON"
      [ -z "$hostfile" ] || rc="$rc (rank 0 writes it: is $runs on a filesystem that every node shares?)"
    fi
    [ ! -e "$json" ] || mv "$json" "$json.failed"
    [ "$rc" != 124 ] || rc="124: killed after --timeout $timeout_s s"
    echo "FAILED (exit $rc, ${secs}s): log $log"
    tail -n 15 "$log" | sed 's/^/    | /'
    failed+=("$name")
  fi
done
[ $dry = 0 ] || exit 0
if [ ${#failed[@]} -gt 0 ]; then
  echo "run_scaling: ${#failed[@]} of $total runs failed: ${failed[*]}"
  exit 1
fi
echo "run_scaling: all $total runs done; next: $here/collect.py $out && $here/plot.sh $out"
