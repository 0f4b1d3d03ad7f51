#!/bin/sh
# run_all.sh — on a machine with a GPU: build loom with CUDA, run every GPU test and the GPU
# benchmarks, and write a summary (tests/gpu/summary.txt in the build directory, or $OUT).
# usage: tests/gpu/run_all.sh [BUILD_DIR]   (default: _build_gpu; configure runs if needed)
# LOOM_GPU_PREBUILT=1: BUILD_DIR already holds the GPU tests, benchmarks and examples (built on
# another machine with the same CUDA); nothing is configured or built, only run.
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/_build_gpu}
out=${OUT:-$build}
jobs=$(nproc 2>/dev/null || echo 4)
summary=$out/gpu_summary.txt
mkdir -p "$build" "$out"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }

say "loom GPU suite, $(date -u +%Y-%m-%dT%H:%M:%SZ), host $(hostname)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader | sed 's/^/gpu: /' | tee -a "$summary"

cd "$build" || exit 1
gpu_tests="test_gpu_ops test_gpu_gemm test_gpu_attention test_gpu_codecs test_gpu_sched"
gpu_mpi_tests="test_gpu_compress_coll test_gpu_moe test_gpu_compress_staged" # under mpirun
if [ -n "${LOOM_GPU_PREBUILT:-}" ]; then
  for t in $gpu_tests $gpu_mpi_tests; do
    [ -x "tests/gpu/$t" ] || { say "FAIL: LOOM_GPU_PREBUILT is set but $build/tests/gpu/$t is not built"; exit 1; }
  done
  say "build: prebuilt ($build)"
else
  if [ ! -f Makefile ]; then
    [ -x "$src/configure" ] || (cd "$src" && ./autogen.sh) || exit 1
    "$src/configure" --with-cuda ${LOOM_CONFIGURE_FLAGS:-} > configure.log 2>&1 ||
      { say "FAIL: configure (see $build/configure.log)"; tail -20 configure.log; exit 1; }
  fi
  t0=$(date +%s)
  make -j"$jobs" > make.log 2>&1 || { say "FAIL: build (see $build/make.log)"; tail -30 make.log; exit 1; }
  make -j"$jobs" $(for t in $gpu_tests $gpu_mpi_tests; do printf 'tests/gpu/%s ' "$t"; done) \
    tests/bench/gpu_gemm_perf tests/bench/gpu_attn_perf >> make.log 2>&1 ||
    { say "FAIL: building the GPU tests (see $build/make.log)"; tail -30 make.log; exit 1; }
  say "build: $(($(date +%s) - t0)) s"
fi

fails=0
# run_test NAME NOTE CMD...: run one test, log it, count a failure (77 is a SKIP).
run_test() {
  rt_name=$1 rt_note=$2
  shift 2
  rt_start=$(date +%s)
  "$@" > "$out/$rt_name.log" 2>&1
  rt_rc=$?
  case $rt_rc in
    0) rt_verdict=PASS ;;
    77) rt_verdict=SKIP ;;
    *) rt_verdict="FAIL (exit $rt_rc)"; fails=$((fails + 1)) ;;
  esac
  say "$rt_verdict: $rt_name (${rt_note}$(($(date +%s) - rt_start)) s)"
  if [ "$rt_rc" -ne 0 ] && [ "$rt_rc" -ne 77 ]; then
    tail -15 "$out/$rt_name.log" | sed 's/^/    /' | tee -a "$summary"
  fi
}
for t in $gpu_tests; do
  run_test "$t" "" "./tests/gpu/$t"
done

# The MPI GPU tests: np 2 where there are two GPUs (NCCL needs one GPU per rank), else np 1 (the
# device path still runs: encode, an NCCL exchange among one rank, decode).
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
np=2
[ "${ngpu:-0}" -lt 2 ] && np=1
for t in $gpu_mpi_tests; do
  run_test "$t" "mpirun -np $np, ${ngpu:-0} GPU(s); " env OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np "$np" --oversubscribe "./tests/gpu/$t"
done
# The hierarchical scheme across emulated nodes (LOOM_NODE_SIZE): two nodes of one rank (np 2),
# two nodes of two (np 4), where there are enough GPUs.
for cfg in 2:1 4:2; do
  hnp=${cfg%:*} hns=${cfg#*:}
  [ "${ngpu:-0}" -ge "$hnp" ] || continue
  run_test "test_gpu_compress_coll_np${hnp}_node${hns}" "mpirun -np $hnp, LOOM_NODE_SIZE=$hns; " \
    env LOOM_NODE_SIZE="$hns" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun -np "$hnp" --oversubscribe ./tests/gpu/test_gpu_compress_coll
done
# The trainers' device paths (--compress, --moe-experts, auto, resume) against their host runs.
run_test trainers_device "np 1$([ "${ngpu:-0}" -ge 2 ] && echo ' and 2'); " env srcdir="$src" \
  LOOM_BUILDDIR="$build" LOOM_SRCDIR="$src" OMPI_ALLOW_RUN_AS_ROOT=1 \
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 sh "$src/tests/gpu/trainers_device.sh"

say "--- benchmarks"
./tests/bench/gpu_gemm_perf --json "$out/gpu_gemm_perf.json" 2>&1 | tee -a "$summary"
./tests/bench/gpu_attn_perf --json "$out/gpu_attn_perf.json" 2>&1 | tee -a "$summary"
if [ -x ./examples/train_gpt ] && [ "${ngpu:-0}" -ge 1 ]; then
  # The default corpus is Debian's fortunes; a GPU host without them trains on the test corpus.
  data=
  [ -d /usr/share/games/fortunes ] || data="--data $src/tests/mpi/gpt_corpus.txt"
  say "--- train_gpt --device cuda (one rank, 60 steps${data:+, the test corpus})"
  # shellcheck disable=SC2086 # $data is two words or none
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 1 ./examples/train_gpt \
    --device cuda --steps 60 --layers 4 --width 512 --heads 8 --ctx 512 --batch 16 $data \
    --json "$out/train_gpt_cuda.json" > "$out/train_gpt_cuda.log" 2>&1 ||
    { say "FAIL: train_gpt --device cuda (see train_gpt_cuda.log)"; fails=$((fails + 1)); }
  tail -8 "$out/train_gpt_cuda.log" | tee -a "$summary"
fi
say "--- $fails GPU test(s) failed"
exit $((fails > 0))
