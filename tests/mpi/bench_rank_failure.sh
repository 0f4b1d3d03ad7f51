#!/bin/sh
# bench_rank_failure.sh — coll_perf, moe_perf and attn_perf end the whole job at once when one
# rank fails (an MPMD line gives rank 1 other arguments, or less memory): ranks started with
# other arguments that each accepts exit 2 naming the first that differs; with that check off
# (BENCH_ALLOW_OTHER_ARGS=1), a loom or raw MPI call that fails on one rank aborts the job naming
# the rank and the error (MPI's own text for a raw call); arguments or buffers one rank cannot
# have end every rank. Every case once went wrong: the job hung (the other ranks waited in a
# collective until LOOM_TIMEOUT, or for ever), crashed (the fusion test wrote to tensors it never
# got), or reported another error than the cause (a later MPI_ERR_TRUNCATE instead of the
# differing arguments, attn_plan's backward), or an incomplete one (a raw call's "(MPI error)").
set -u
b=${LOOM_BUILDDIR:-.}
for p in coll_perf moe_perf attn_perf; do
  [ -x "$b/tests/bench/$p" ] || { echo "FAIL: $b/tests/bench/$p is not built"; exit 99; }
done
mpirun_exe=$(sed -n "s/^MPIRUN='\(.*\)'$/\1/p" "$b/tests/mpirun.sh")
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
# Under --enable-sanitizers (the harness sets ASAN_OPTIONS), as tests/mpirun.sh: no leak report
# (Open MPI never frees some of its own allocations, and a leak report turns exit 2 into 1); ASan
# still stops at the first bad access.
sanitized=${ASAN_OPTIONS:+1}
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export ASAN_OPTIONS
fail=0

# mpmd NAME RC TEXT PROG ARGS0 ARGS1 [PRE1]: rank 0 runs PROG ARGS0, rank 1 PRE1 PROG ARGS1, both
# with the environment $menv; the job must end within 60 s (LOOM_TIMEOUT stays at its 300 s
# unless $menv sets it) with exit RC, TEXT (a basic regular expression) in its output and no crash
menv=
mpmd() {
  name=$1 want_rc=$2 want=$3 exe=$b/tests/bench/$4 args0=$5 args1=$6 pre1=${7:-}
  # shellcheck disable=SC2086 # the argument lists split on purpose
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none $menv timeout 60 "${mpirun_exe:-mpirun}" \
    --oversubscribe ${LOOM_MPIRUN_FLAGS:-} -np 1 "$exe" $args0 : -np 1 $pre1 "$exe" $args1 \
    >"$tmp/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 124 ]; then
    echo "FAIL: $name: the job hung (killed after 60 s)"
    fail=1
  elif [ "$rc" -ne "$want_rc" ]; then
    cat "$tmp/$name.log"; echo "FAIL: $name: exit $rc (want $want_rc)"; fail=1
  elif grep -q -E 'exited on signal|Segmentation fault|free\(\)|corrupted' "$tmp/$name.log"; then
    cat "$tmp/$name.log"; echo "FAIL: $name: a rank crashed instead of an error"; fail=1
  elif ! grep -q -- "$want" "$tmp/$name.log"; then
    cat "$tmp/$name.log"; echo "FAIL: $name: no '$want'"; fail=1
  else
    echo "ok: $name: rc $rc, '$want'"
  fi
}

c="--op allreduce -d float -o sum -n 1 -w 0 -c 0"
m="--tokens 16 --hidden 8 --ffn 16 --topk 1 --iters 1 --warmup 0 --modes none"
a="--docs 2 --mean-len 32 --heads 1 --iters 1"
# Arguments that each rank accepts but that differ: every rank exits 2 at start, and rank 1 names
# the first argument that differs. Before the check the jobs ran collectives of other counts: the
# first ended in a late MPI_ERR_TRUNCATE, the others waited until LOOM_TIMEOUT (10 s here) or,
# moe_perf's, for ever (killed after 60 s).
menv="LOOM_TIMEOUT=10"
differ="was started with other arguments than rank 0: argument"
mpmd coll_args_size 2 "coll_perf: rank 1 $differ 14 is '2K' here and '1K' on rank 0" \
  coll_perf "$c -b 1K" "$c -b 2K"
mpmd coll_args_iters 2 "coll_perf: rank 1 $differ 6 is '3' here and '2' on rank 0" \
  coll_perf "-b 1K -e 1K -n 2 -w 0" "-b 1K -e 1K -n 3 -w 0"
mpmd moe_args_iters 2 "moe_perf: rank 1 $differ 10 is '2' here and '1' on rank 0" \
  moe_perf "$m" "$(echo "$m" | sed 's/--iters 1/--iters 2/')"
mpmd attn_args_docs 2 "attn_perf: rank 1 $differ 2 is '3' here and '2' on rank 0" \
  attn_perf "$a --head-dim 8" "$(echo "$a" | sed 's/--docs 2/--docs 3/') --head-dim 8"

# The cases below give rank 1 other arguments on purpose, so that a call fails there only.
menv="BENCH_ALLOW_OTHER_ARGS=1"
# Counts that differ: rank 0's receive is shorter than what rank 1 sends (MPI_ERR_TRUNCATE on
# rank 0 only), while rank 1 waits for rank 0's data. The raw MPI call's abort gives MPI's own
# text (it gave "(MPI error)" and nothing more).
mpmd coll_count 1 "rank 0 aborts the job: coll_perf: allreduce of 256 float elements failed" \
  coll_perf "$c -b 1K -e 1K" "$c -b 2K -e 2K"
mpmd coll_raw_count 1 "aborts the job: coll_perf: MPI allreduce of [0-9]* float elements failed: MPI_ERR_TRUNCATE" \
  coll_perf "$c --raw-mpi -b 1K -e 1K" "$c --raw-mpi -b 2K -e 2K"
# Rank 1 alone cannot allocate its two 1 GiB buffers (1.5 GB of address space); not under ASan,
# which reserves far more address space than that at start.
if [ -z "$sanitized" ]; then
  printf '#!/bin/sh\nulimit -v 1500000 && exec "$@"\n' >"$tmp/lowmem"
  chmod +x "$tmp/lowmem"
  mpmd coll_alloc 1 "coll_perf: rank 1 cannot allocate 2 x 1073741824 bytes" \
    coll_perf "$c -b 8 -e 1G" "$c -b 8 -e 1G" "$tmp/lowmem"
  # The fusion test's 200000 tensors of 4 KiB and one of 819 MB (it crashed writing to the
  # tensors it did not get)
  f="$c -b 8 -e 8 --fusion-test --fusion-tensors 200000"
  mpmd fusion_alloc 1 "coll_perf: fusion test: rank 1 cannot allocate 200000 tensors of 4096 bytes" \
    coll_perf "$f" "$f" "$tmp/lowmem"
fi
mpmd moe_create 1 "rank 1 aborts the job: moe_perf: loom_moe_create failed (invalid argument)" \
  moe_perf "$m --experts 2" "$m --experts 3"
# Arguments one rank refuses: its own message, not the comparison's (which would hide it)
menv=
mpmd moe_args 2 "moe_perf: --tokens >= 0, --hidden, --ffn, --iters >= 1" \
  moe_perf "$m --experts 2" "$m --experts 2 --iters 0"
menv="BENCH_ALLOW_OTHER_ARGS=1"
# (both ranks may find the other's message the wrong size: either one aborts)
mpmd attn_plan 1 "aborts the job: attn_perf: loom_attn_exec_forward failed" \
  attn_perf "$a --head-dim 8" "$a --head-dim 4"
menv=
mpmd attn_args 2 "attn_perf: --mean-len 12abc: expected a whole number" \
  attn_perf "$a --head-dim 8" "$a --head-dim 8 --mean-len 12abc"
exit $fail
