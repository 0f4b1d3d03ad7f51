# loom_cuda.m4 — optional CUDA backend: --with-cuda[=DIR] (default: guess /usr/local/cuda),
# nvcc detected separately, --with-cuda-arch=LIST (default 80,90 plus PTX of the highest).
AC_DEFUN([LOOM_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@], [build the CUDA backend (default: guess; DIR defaults to $CUDA_HOME or /usr/local/cuda)])],
    [], [with_cuda=guess])
  AC_ARG_WITH([cuda-arch],
    [AS_HELP_STRING([--with-cuda-arch=LIST], [comma-separated SM versions to compile for (default: 80,90; PTX for the last)])],
    [], [with_cuda_arch=80,90])
  AC_ARG_VAR([NVCC], [CUDA compiler (default: DIR/bin/nvcc, then nvcc on PATH)])
  loom_cuda_ok=no
  loom_cuda_summary="no (--without-cuda)"
  AS_IF([test "x$with_cuda" != "xno"], [
    AS_CASE(["$with_cuda"],
      [guess|yes], [loom_cuda_dir=${CUDA_HOME:-/usr/local/cuda}],
      [loom_cuda_dir=$with_cuda])
    loom_cuda_why=""
    loom_save_CPPFLAGS=$CPPFLAGS; loom_save_LIBS=$LIBS; loom_save_LDFLAGS=$LDFLAGS
    CUDA_CFLAGS="-isystem $loom_cuda_dir/include"
    loom_cuda_libdir=$loom_cuda_dir/lib64
    AS_IF([test ! -d "$loom_cuda_libdir"], [loom_cuda_libdir=$loom_cuda_dir/lib])
    CUDA_LIBS="-L$loom_cuda_libdir -Wl,-rpath,$loom_cuda_libdir -lcublasLt -lcublas -lcudart -lstdc++"
    CPPFLAGS="$CPPFLAGS $CUDA_CFLAGS"; LDFLAGS="$LDFLAGS -L$loom_cuda_libdir"
    AC_CHECK_HEADER([cuda_runtime.h], [
      AC_CHECK_LIB([cudart], [cudaGetDeviceCount], [loom_cuda_ok=yes],
        [loom_cuda_why="libcudart not found in $loom_cuda_libdir"])
      AS_IF([test "x$loom_cuda_ok" = "xyes"], [
        AC_CHECK_HEADER([cublas_v2.h], [
          AC_CHECK_LIB([cublas], [cublasCreate_v2], [:],
            [loom_cuda_ok=no; loom_cuda_why="libcublas not found in $loom_cuda_libdir"], [-lcudart])
        ], [loom_cuda_ok=no; loom_cuda_why="cublas_v2.h not found in $loom_cuda_dir/include"])
      ])
    ], [loom_cuda_why="cuda_runtime.h not found in $loom_cuda_dir/include"])
    CPPFLAGS=$loom_save_CPPFLAGS; LIBS=$loom_save_LIBS; LDFLAGS=$loom_save_LDFLAGS
    AS_IF([test "x$loom_cuda_ok" = "xyes"], [
      AS_IF([test -z "$NVCC"], [AC_PATH_PROG([NVCC], [nvcc], [], [$loom_cuda_dir/bin$PATH_SEPARATOR$PATH])])
      AS_IF([test -z "$NVCC"], [loom_cuda_ok=no; loom_cuda_why="nvcc not found in $loom_cuda_dir/bin or on PATH (set NVCC=)"])
    ])
    AS_IF([test "x$loom_cuda_ok" = "xno"], [
      AS_IF([test "x$with_cuda" = "xguess"],
        [AC_MSG_WARN([CUDA backend disabled: $loom_cuda_why. Use --with-cuda=DIR to point at a toolkit.])
         loom_cuda_summary="no ($loom_cuda_why)"],
        [AC_MSG_ERROR([--with-cuda was requested but $loom_cuda_why. Fix the path or use --without-cuda.])])
    ])
  ])
  AS_IF([test "x$loom_cuda_ok" = "xyes"], [
    # nvcc-compiled host code needs the C++ runtime (static guards, personality routine).
    # One -gencode per SM, plus PTX of the last so newer GPUs can JIT.
    NVCC_ARCH_FLAGS=""
    loom_last_sm=""
    for loom_sm in `echo "$with_cuda_arch" | tr ',' ' '`; do
      AS_CASE(["$loom_sm"], [*[[!0-9]]*|""],
        [AC_MSG_ERROR([--with-cuda-arch=$with_cuda_arch: '$loom_sm' is not an SM number; use e.g. --with-cuda-arch=80,90])])
      # bf16 tensor-core products (mma.sync, wmma) and cp.async need sm_80 (Ampere) or newer.
      AS_IF([test "$loom_sm" -lt 80],
        [AC_MSG_ERROR([--with-cuda-arch=$with_cuda_arch: sm_$loom_sm is older than sm_80, which loom's CUDA kernels need (bf16 tensor cores, cp.async); use 80 or newer, or --without-cuda])])
      NVCC_ARCH_FLAGS="$NVCC_ARCH_FLAGS -gencode arch=compute_$loom_sm,code=sm_$loom_sm"
      loom_last_sm=$loom_sm
    done
    NVCC_ARCH_FLAGS="$NVCC_ARCH_FLAGS -gencode arch=compute_$loom_last_sm,code=compute_$loom_last_sm"
    AC_MSG_CHECKING([whether $NVCC compiles for sm $with_cuda_arch])
    cat > conftest.cu <<_LOOMEOF
__global__ void k(float *x) { x[[threadIdx.x]] = 1.0f; }
_LOOMEOF
    AS_IF([$NVCC $NVCC_ARCH_FLAGS -c conftest.cu -o conftest.$OBJEXT >&AS_MESSAGE_LOG_FD 2>&1],
      [AC_MSG_RESULT([yes])],
      [AC_MSG_RESULT([no])
       AC_MSG_ERROR([$NVCC cannot compile for --with-cuda-arch=$with_cuda_arch; see config.log])])
    rm -f conftest.cu conftest.$OBJEXT
    loom_nvcc_version=`$NVCC --version | sed -n 's/.*release \([[0-9.]]*\).*/\1/p'`
    loom_cuda_summary="yes ($loom_cuda_dir, nvcc $loom_nvcc_version, sm $with_cuda_arch + PTX)"
    AC_DEFINE([LOOM_HAVE_CUDA], [1], [Define if the CUDA backend is built])
  ], [CUDA_CFLAGS=""; CUDA_LIBS=""])
  AM_CONDITIONAL([LOOM_CUDA], [test "x$loom_cuda_ok" = "xyes"])
  AC_SUBST([CUDA_CFLAGS])
  AC_SUBST([CUDA_LIBS])
  AC_SUBST([NVCC_ARCH_FLAGS])
])
