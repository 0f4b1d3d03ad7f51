#!/bin/sh
# rank_mismatch.sh — ranks started differently (an MPMD line) end together, quickly, with one
# message that names the rank and the difference: another command line, a bad flag on one rank,
# a tunable set on one rank. Each once hung the job or corrupted the heap (MPI collectives of
# mismatched sizes), or trained silently apart.
set -u
export LOOM_COMPRESS=none
. "${srcdir:-.}/tests/mpi/gpt_lib.sh" # $b, $exe, $tmp/corpus, fail
mpirun_exe=$(sed -n "s/^MPIRUN='\(.*\)'$/\1/p" "$b/tests/mpirun.sh")
common="--layers 1 --width 32 --heads 2 --ctx 32 --batch 2 --steps 3 --sample 0 --val-every 0"
common="$common --val-rows 2 --data $tmp/corpus --sgemm-reps 0"

mpmd() { # NAME EXPECTED-TEXT RANK-1-PREFIX RANK-1-ARGS: rank 0 runs $common
  name=$1 want=$2 pre=$3 args1=$4
  # shellcheck disable=SC2086 # the argument lists split on purpose
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 120 "${mpirun_exe:-mpirun}" \
    --oversubscribe ${LOOM_MPIRUN_FLAGS:-} -np 1 "$exe" $common : -np 1 $pre "$exe" $args1 \
    >"$tmp/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 124 ]; then
    echo "FAIL: $name: the job hung (killed after 120 s)"
    fail=1
  elif [ "$rc" -eq 0 ]; then
    cat "$tmp/$name.log"; echo "FAIL: $name: exit 0"; fail=1
  elif grep -q -E 'exited on signal|Segmentation fault|free\(\)|corrupted|MPI_ERR_TRUNCATE' \
    "$tmp/$name.log"; then
    cat "$tmp/$name.log"; echo "FAIL: $name: a rank crashed instead of an error"; fail=1
  elif ! grep -q -- "$want" "$tmp/$name.log"; then
    cat "$tmp/$name.log"; echo "FAIL: $name: no '$want'"; fail=1
  else
    echo "ok: $name: rc $rc, '$want'"
  fi
}

# Where the arguments sit in $common: the message gives their position (1 = the first).
# shellcheck disable=SC2086
set -- $common
nargs=$#
at=1
for a in "$@"; do
  [ "$a" = --width ] && break
  at=$((at + 1))
done
wide=$(echo "$common" | sed 's/--width 32/--width 64/')
mpmd width "rank 1 was started with other arguments than rank 0: argument $((at + 1)) is '64' here and '32' on rank 0" "" "$wide"
mpmd extra_flag "argument $((nargs + 1)) is '--seed' here and '(none)' on rank 0" "" "$common --seed 7"
badb=$(echo "$common" | sed 's/--batch 2/--batch 0/')
mpmd bad_flag_rank1 "train_gpt: rank 1: --batch" "" "$badb"
mpmd bad_json_rank1 "train_gpt: rank 1: --json" "" "$common --json /nonexistent-loom-dir/x.json"
mpmd fusion_env "LOOM_FUSION_THRESHOLD differs between ranks (rank 0 has '67108864', rank 1 has '0')" \
  "env LOOM_FUSION_THRESHOLD=0" "$common"
exit $fail
