# loom_sanitizers.m4 — --enable-sanitizers (AddressSanitizer + UndefinedBehaviorSanitizer on every
# C compile and link) and --enable-fuzz (that, plus libFuzzer coverage and the tests/fuzz targets).
#
# The flags go into LOOM_CFLAGS, which automake passes to every compile and every link (libloom,
# programs, tests); nvcc-compiled CUDA objects (.cu) take only -I/-D from it and stay
# unsanitized. loom.pc carries them in Libs (LOOM_SANITIZER_LIBS), because a program linked
# against a sanitized libloom needs the sanitizer runtime too. The test harness sets ASAN_OPTIONS
# and UBSAN_OPTIONS (Makefile.am, tests/mpirun.sh). --enable-fuzz needs clang: with Open MPI run
# configure and make with OMPI_CC=clang in the environment (tests/fuzz/build_and_run.sh does).
AC_DEFUN([LOOM_CHECK_SANITIZERS], [
  AC_ARG_ENABLE([sanitizers],
    [AS_HELP_STRING([--enable-sanitizers],
      [build everything with -fsanitize=address,undefined (CUDA kernels stay unsanitized)])],
    [], [enable_sanitizers=no])
  AC_ARG_ENABLE([fuzz],
    [AS_HELP_STRING([--enable-fuzz],
      [build the libFuzzer targets of tests/fuzz (needs clang: OMPI_CC=clang; implies --enable-sanitizers)])],
    [], [enable_fuzz=no])
  AS_IF([test "x$enable_fuzz" = "xyes"], [enable_sanitizers=yes])
  LOOM_SANITIZER_FLAGS=""
  LOOM_SANITIZER_LIBS=""
  LOOM_FUZZ_LDFLAGS=""
  loom_sanitizers_summary=no
  AS_IF([test "x$enable_sanitizers" = "xyes"], [
    loom_san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
    AC_MSG_CHECKING([whether $CC builds and links with $loom_san])
    loom_save_CFLAGS=$CFLAGS; CFLAGS="$CFLAGS $loom_san"
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <stdlib.h>]], [[free(malloc(8));]])],
      [AC_MSG_RESULT([yes])],
      [AC_MSG_RESULT([no])
       AC_MSG_ERROR([$CC cannot build with $loom_san: on Debian install libasan8 and libubsan1 (gcc) or libclang-rt-14-dev (clang)])])
    CFLAGS=$loom_save_CFLAGS
    LOOM_SANITIZER_FLAGS=$loom_san
    LOOM_SANITIZER_LIBS="-fsanitize=address,undefined"
    loom_sanitizers_summary="address,undefined (CUDA kernels excluded)"
  ])
  AS_IF([test "x$enable_fuzz" = "xyes"], [
    AC_MSG_CHECKING([whether $CC is clang])
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[
#ifndef __clang__
#error not clang
#endif
]], [])],
      [AC_MSG_RESULT([yes])],
      [AC_MSG_RESULT([no])
       AC_MSG_ERROR([--enable-fuzz needs clang (libFuzzer): with Open MPI, export OMPI_CC=clang for configure and make (MPICH: MPICH_CC=clang), or run tests/fuzz/build_and_run.sh])])
    AC_MSG_CHECKING([whether $CC links a libFuzzer target])
    loom_save_CFLAGS=$CFLAGS; CFLAGS="$CFLAGS -fsanitize=fuzzer,address,undefined"
    AC_LINK_IFELSE([AC_LANG_SOURCE([[
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return size && !data; }
]])],
      [AC_MSG_RESULT([yes])],
      [AC_MSG_RESULT([no])
       AC_MSG_ERROR([$CC cannot link -fsanitize=fuzzer: on Debian 12 install libclang-rt-14-dev])])
    CFLAGS=$loom_save_CFLAGS
    LOOM_SANITIZER_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
    LOOM_FUZZ_LDFLAGS="-fsanitize=fuzzer"
    loom_sanitizers_summary="$loom_sanitizers_summary; libFuzzer targets (tests/fuzz)"
  ])
  LOOM_CFLAGS="$LOOM_CFLAGS $LOOM_SANITIZER_FLAGS"
  AC_SUBST([LOOM_SANITIZER_FLAGS])
  AC_SUBST([LOOM_SANITIZER_LIBS])
  AC_SUBST([LOOM_FUZZ_LDFLAGS])
  AM_CONDITIONAL([LOOM_SANITIZERS], [test "x$enable_sanitizers" = "xyes"])
  AM_CONDITIONAL([LOOM_FUZZ], [test "x$enable_fuzz" = "xyes"])
])
