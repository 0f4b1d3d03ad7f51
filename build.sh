#!/usr/bin/env bash
# build.sh — the one command a new user runs on a fresh Debian 12 machine (as root):
#   ./build.sh demo    install what is missing, build, train Fashion-MNIST under mpirun -np 2
#   ./build.sh check   install what is missing, build, run lint and the whole test suite
# Idempotent: packages are installed only when missing; the build reuses _build/.
# Environment: CONFIGURE_FLAGS (extra configure flags), BUILD_DIR (default _build), JOBS.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-_build}
JOBS=${JOBS:-$(nproc)}
CONFIGURE_FLAGS=${CONFIGURE_FLAGS:-}

# Debian packages the build, the tests and the examples need.
PACKAGES=(build-essential autoconf automake libtool pkg-config
          openmpi-bin libopenmpi-dev libhwloc-dev hwloc libopenblas-dev zlib1g-dev
          clang-format cppcheck dataset-fashion-mnist fortunes iproute2
          clang libclang-rt-14-dev   # clang + libFuzzer: tests/fuzz/build_and_run.sh
          gnuplot-nox)               # tests/scaling/plot.sh and loom_sim plots

log() { printf '\n== build.sh: %s\n' "$*"; }

setup() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing missing packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

build() {
  if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ]; then
    log "autogen"
    ./autogen.sh
  fi
  mkdir -p "$BUILD_DIR"
  cd "$BUILD_DIR"
  # The install check installs into the build folder, never into the system.
  local flags="--enable-werror --prefix=$ROOT/$BUILD_DIR/_install $CONFIGURE_FLAGS"
  if [ ! -f Makefile ] || [ ! -f .configure-flags ] || [ "$(cat .configure-flags)" != "$flags" ]; then
    log "configure $flags"
    # shellcheck disable=SC2086
    "$ROOT/configure" $flags
    echo "$flags" > .configure-flags
  fi
  log "make -j$JOBS"
  make -j"$JOBS"
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

case "${1:-demo}" in
  demo)
    setup
    build
    log "demo: loom_info, then train_fmnist (one epoch) under mpirun -np 2"
    mpirun -np 2 --oversubscribe ./loom_info | tail -3
    mpirun -np 2 --oversubscribe ./examples/train_fmnist --epochs 1
    ;;
  check)
    setup
    build
    log "lint"
    make lint
    log "make check"
    make -j"$JOBS" check || { cat test-suite.log 2>/dev/null | tail -100; exit 1; }
    log "install + installcheck"
    make install >/dev/null
    # A sanitized build (--enable-sanitizers): no leak report from Open MPI's own allocations.
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" make installcheck
    ;;
  distcheck)
    setup
    build
    # The suite's subset in Makefile.am's distcheck_tests: CI runs the whole suite from the
    # repository twice besides (FULL=1 runs all of it from the tarball too).
    if [ "${FULL:-0}" = 1 ]; then
      log "make distcheck (every test)"
      make distcheck
    else
      log "make distcheck (tests: Makefile.am's distcheck_tests)"
      make distcheck TESTS='$(distcheck_tests)'
    fi
    ;;
  *)
    echo "usage: ./build.sh [demo|check|distcheck]" >&2
    exit 2
    ;;
esac
