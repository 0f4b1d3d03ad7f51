#!/bin/sh
# pack_prebuilt.sh — pack a CUDA build's GPU tests, benchmarks and trainers into one tarball that
# tests/gpu/run_all.sh can run (LOOM_GPU_PREBUILT=1) on a GPU host without compilers or MPI headers.
#
# usage: tests/gpu/pack_prebuilt.sh BUILD_DIR OUT.tar.gz
#
# On the GPU host (same CUDA major version, an MPI runtime of the same ABI on PATH, NCCL's
# libnccl.so.2 findable), from the source tree:
#   mkdir /tmp/lb && tar -C /tmp/lb -xzf OUT.tar.gz
#   LD_LIBRARY_PATH=/tmp/lb/lib:$LD_LIBRARY_PATH LOOM_GPU_PREBUILT=1 tests/gpu/run_all.sh /tmp/lb
# The tarball holds the programs (libtool's real binaries, not its wrapper scripts), libloom.so.0,
# the BLAS and Fortran runtime libraries they load (a GPU image may have none), and
# tests/mpirun.sh taking mpirun from PATH. CUDA, NCCL, MPI and the C library come from the host.
set -eu
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR OUT.tar.gz" >&2; exit 2; }
build=$(cd "$1" && pwd)
out=$2
[ -f "$build/tests/mpirun.sh" ] || { echo "$0: $build is not a configured loom build" >&2; exit 1; }
grep -q '^#define LOOM_HAVE_CUDA 1' "$build/config.h" ||
  { echo "$0: $build was configured without CUDA: reconfigure with --with-cuda" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests/gpu" "$stage/tests/bench" "$stage/examples" "$stage/lib"
progs="tests/gpu/test_gpu_ops tests/gpu/test_gpu_gemm tests/gpu/test_gpu_attention
  tests/gpu/test_gpu_codecs tests/gpu/test_gpu_sched tests/gpu/test_gpu_compress_coll
  tests/gpu/test_gpu_moe tests/gpu/test_gpu_compress_staged tests/bench/gpu_gemm_perf
  tests/bench/gpu_attn_perf examples/train_gpt examples/train_fmnist"
for p in $progs; do
  dir=$(dirname "$p") name=$(basename "$p")
  if [ -x "$build/$dir/.libs/$name" ]; then # libtool keeps the real program there
    cp "$build/$dir/.libs/$name" "$stage/$p"
  elif [ -x "$build/$p" ]; then
    cp "$build/$p" "$stage/$p"
  else
    echo "$0: $build/$p is not built: run make, then make it (run_all.sh lists the GPU" \
      "tests and benchmarks)" >&2
    exit 1
  fi
done
sed "s|^MPIRUN=.*|MPIRUN='mpirun'|" "$build/tests/mpirun.sh" > "$stage/tests/mpirun.sh"
[ -f "$build/.libs/libloom.so.0" ] && cp -L "$build/.libs/libloom.so.0" "$stage/lib/"
# The BLAS and Fortran runtime the programs load, wherever this host keeps them.
for p in $progs; do ldd "$stage/$p"; done 2>/dev/null |
  awk '/=> \// && /lib(openblas|blas|gfortran|quadmath|cblas)/ {print $3}' | sort -u |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
tar -C "$stage" -czf "$out" .
echo "$out: $(du -h "$out" | cut -f1), $(echo "$progs" | wc -w) programs and" \
  "$(find "$stage/lib" -type f | wc -l) libraries"
