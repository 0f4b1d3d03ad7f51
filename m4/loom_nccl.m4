# loom_nccl.m4 — optional NCCL for device-buffer collectives: --with-nccl[=DIR] (default: guess
# in the CUDA toolkit and the system paths). NCCL needs the CUDA backend.
AC_DEFUN([LOOM_CHECK_NCCL], [
  AC_ARG_WITH([nccl],
    [AS_HELP_STRING([--with-nccl@<:@=DIR@:>@], [use NCCL for device buffers (default: guess; needs CUDA)])],
    [], [with_nccl=guess])
  loom_nccl_ok=no
  loom_nccl_summary="no (--without-nccl)"
  AS_IF([test "x$with_nccl" != "xno"], [
    AS_IF([test "x$loom_cuda_ok" != "xyes"], [
      AS_IF([test "x$with_nccl" = "xguess"],
        [loom_nccl_summary="no (needs the CUDA backend)"],
        [AC_MSG_ERROR([--with-nccl was requested but the CUDA backend is not built; NCCL needs CUDA (--with-cuda=DIR)])])
    ], [
      AS_CASE(["$with_nccl"],
        [guess|yes], [NCCL_CFLAGS=""; NCCL_LIBS="-lnccl"; loom_nccl_where="the CUDA toolkit or system paths"],
        [loom_nccl_libdir=$with_nccl/lib64
         AS_IF([test ! -d "$loom_nccl_libdir"], [loom_nccl_libdir=$with_nccl/lib])
         NCCL_CFLAGS="-isystem $with_nccl/include"
         NCCL_LIBS="-L$loom_nccl_libdir -Wl,-rpath,$loom_nccl_libdir -lnccl"
         loom_nccl_where=$with_nccl])
      loom_save_CPPFLAGS=$CPPFLAGS; loom_save_LIBS=$LIBS
      CPPFLAGS="$CPPFLAGS $CUDA_CFLAGS $NCCL_CFLAGS"; LIBS="$NCCL_LIBS $CUDA_LIBS $LIBS"
      AC_MSG_CHECKING([for NCCL in $loom_nccl_where])
      AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]], [[int v; ncclGetVersion(&v);]])],
        [loom_nccl_ok=yes], [loom_nccl_ok=no])
      AC_MSG_RESULT([$loom_nccl_ok])
      CPPFLAGS=$loom_save_CPPFLAGS; LIBS=$loom_save_LIBS
      AS_IF([test "x$loom_nccl_ok" = "xyes"],
        [loom_nccl_summary="yes ($loom_nccl_where)"
         AC_DEFINE([LOOM_HAVE_NCCL], [1], [Define if NCCL is used for device buffers])],
        [AS_IF([test "x$with_nccl" = "xguess"],
          [AC_MSG_WARN([NCCL not found in $loom_nccl_where; device collectives disabled. Use --with-nccl=DIR.])
           loom_nccl_summary="no (not found)"],
          [AC_MSG_ERROR([--with-nccl was requested but nccl.h/libnccl were not found in $loom_nccl_where; fix the path or use --without-nccl])])])
    ])
  ])
  AS_IF([test "x$loom_nccl_ok" != "xyes"], [NCCL_CFLAGS=""; NCCL_LIBS=""])
  AM_CONDITIONAL([LOOM_NCCL], [test "x$loom_nccl_ok" = "xyes"])
  AC_SUBST([NCCL_CFLAGS])
  AC_SUBST([NCCL_LIBS])
])
