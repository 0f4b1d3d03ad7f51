# loom_pthread.m4 — POSIX threads (progress threads, worker pools) without the autoconf-archive macro.
# gcc and clang take -pthread; otherwise fall back to -lpthread.
AC_DEFUN([LOOM_CHECK_PTHREAD], [
  AC_MSG_CHECKING([whether $CC accepts -pthread])
  loom_save_CFLAGS=$CFLAGS; CFLAGS="$CFLAGS -pthread"
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <pthread.h>]], [[pthread_self();]])],
    [AC_MSG_RESULT([yes]); PTHREAD_CFLAGS="-pthread"; PTHREAD_LIBS="-pthread"],
    [AC_MSG_RESULT([no]); PTHREAD_CFLAGS=""; PTHREAD_LIBS="-lpthread"])
  CFLAGS=$loom_save_CFLAGS
  AC_SUBST([PTHREAD_CFLAGS])
  AC_SUBST([PTHREAD_LIBS])
])
