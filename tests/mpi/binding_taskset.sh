#!/bin/sh
# binding_taskset.sh — LOOM_BIND=core binds within the affinity a job was started with (taskset
# around the program, or around mpirun --bind-to none): at np 1 without mpirun and at np 2 and 3
# sharing one core. Open MPI's own per-rank binding is still loom's to replace (binding_np*.mpi).
set -eu
b=${LOOM_BUILDDIR:-.}
command -v taskset >/dev/null || { echo "SKIP: no taskset (util-linux)"; exit 77; }
# The last CPU's core, with its hardware threads: what the job may use.
last=$(($(getconf _NPROCESSORS_ONLN) - 1))
[ "$last" -ge 1 ] || { echo "SKIP: one CPU: no narrower set to start within"; exit 77; }
siblings=/sys/devices/system/cpu/cpu$last/topology/thread_siblings_list
cpus=$(cat "$siblings" 2>/dev/null || echo "$last")
case $cpus in *-*) cpus=$(echo "$cpus" | awk -F- '{s=$1; for (i=$1+1;i<=$2;i++) s=s","i; print s}') ;; esac
echo "starting set: CPUs $cpus (the core of CPU $last)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 BINDING_TEST_CPUS="$cpus"
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# Under --enable-sanitizers, as tests/mpirun.sh: no leak report (Open MPI never frees some of its
# own allocations); ASan still stops at the first bad access.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export ASAN_OPTIONS
unset LOOM_BIND
fail=0
LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=TOPO taskset -c "$cpus" "$b/tests/mpi/test_binding" || fail=1
for np in 2 3; do
  taskset -c "$cpus" mpirun -np $np --oversubscribe --bind-to none -x BINDING_TEST_CPUS \
    "$b/tests/mpi/test_binding" || fail=1
done
[ $fail -eq 0 ] && echo "binding_taskset: PASS" || echo "binding_taskset: FAIL"
exit $fail
