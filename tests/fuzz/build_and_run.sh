#!/usr/bin/env bash
# tests/fuzz/build_and_run.sh — build the libFuzzer targets (configure --enable-fuzz, clang through
# Open MPI's mpicc) in a build folder of their own, and run each on its seed corpus for a while.
#   tests/fuzz/build_and_run.sh [SECONDS] [TARGET...]   default: 20 s each, every target
# Environment: BUILD_DIR (default _build-fuzz), FUZZ_FLAGS (more libFuzzer flags, e.g. -jobs=2).
# New inputs that add coverage go to BUILD_DIR/tests/fuzz/work/TARGET (kept between runs); a
# finding stops the run with a non-zero exit and its input in BUILD_DIR/tests/fuzz/findings/.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-_build-fuzz}
case $BUILD_DIR in /*) ;; *) BUILD_DIR=$ROOT/$BUILD_DIR ;; esac
SECONDS_EACH=${1:-20}
[ $# -gt 0 ] && shift
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(fuzz_codec_decode fuzz_tunables fuzz_attn_msg fuzz_moe_msg fuzz_checkpoint
                                        fuzz_sim_profile fuzz_timeline fuzz_fmnist)

log() { printf '\n== fuzz: %s\n' "$*"; }

# Open MPI's mpicc (MPICH's too) compiles with clang when told so; configure and make both need it.
export OMPI_CC=clang MPICH_CC=clang
if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ]; then
  log "autogen"
  ./autogen.sh
fi
mkdir -p "$BUILD_DIR"
cd "$BUILD_DIR"
# No --enable-werror: the gcc builds of build.sh check every warning. clang refuses the 8-float
# vector helpers of compute/cpu/attention_cpu.c in the kernels' baseline (non-AVX) clone ("AVX
# vector argument ... changes the ABI"), which gcc accepts: the fuzz binaries only run here, so
# they are built for this CPU's AVX2.
flags="--enable-fuzz --without-cuda --disable-shared"
cflags="-g -O2"
grep -qw avx2 /proc/cpuinfo 2>/dev/null && cflags="$cflags -mavx2"
stamp="$flags CFLAGS=$cflags"
if [ ! -f Makefile ] || [ ! -f .configure-flags ] || [ "$(cat .configure-flags)" != "$stamp" ]; then
  log "configure $stamp (OMPI_CC=clang)"
  # shellcheck disable=SC2086
  "$ROOT/configure" $flags CFLAGS="$cflags" >configure.out || { tail -30 configure.out; exit 1; }
  echo "$stamp" >.configure-flags
fi
log "make ${TARGETS[*]}"
make -j"${JOBS:-1}" "${TARGETS[@]/#/tests/fuzz/}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p tests/fuzz/findings
for t in "${TARGETS[@]}"; do
  log "$t for ${SECONDS_EACH}s"
  mkdir -p "tests/fuzz/work/$t"
  # The first folder receives new inputs; the seed corpus in the source tree is only read.
  # shellcheck disable=SC2086
  if ! "./tests/fuzz/$t" -max_total_time="$SECONDS_EACH" -print_final_stats=1 \
    -artifact_prefix="$BUILD_DIR/tests/fuzz/findings/$t-" ${FUZZ_FLAGS:-} \
    "tests/fuzz/work/$t" "$ROOT/tests/fuzz/corpus/$t" >"tests/fuzz/$t.out" 2>&1; then
    tail -80 "tests/fuzz/$t.out"
    echo "fuzz: $t found a problem (full log tests/fuzz/$t.out; input in $BUILD_DIR/tests/fuzz/findings/)" >&2
    exit 1
  fi
  grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss|#[0-9]+ *DONE)' "tests/fuzz/$t.out" || true
done
log "no findings"
