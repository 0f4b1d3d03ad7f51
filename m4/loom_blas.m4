# loom_blas.m4 — find a BLAS with the CBLAS interface (required), OpenBLAS by default.
# --with-blas=DIR looks in DIR/include and DIR/lib first; the OpenBLAS hooks (threads, config,
# core name) are optional.
AC_DEFUN([LOOM_CHECK_BLAS], [
  AC_ARG_WITH([blas],
    [AS_HELP_STRING([--with-blas=DIR], [BLAS with CBLAS installed under DIR (default: system OpenBLAS)])],
    [], [with_blas=default])
  AS_IF([test "x$with_blas" = "xno"], [AC_MSG_ERROR([BLAS is required: --without-blas is not supported])])
  loom_save_CPPFLAGS=$CPPFLAGS; loom_save_LIBS=$LIBS; loom_save_LDFLAGS=$LDFLAGS
  BLAS_CFLAGS=""; BLAS_LDFLAGS=""
  AS_IF([test "x$with_blas" != "xdefault" && test "x$with_blas" != "xyes"],
    [BLAS_CFLAGS="-I$with_blas/include"; BLAS_LDFLAGS="-L$with_blas/lib -Wl,-rpath,$with_blas/lib"])
  CPPFLAGS="$CPPFLAGS $BLAS_CFLAGS"; LDFLAGS="$LDFLAGS $BLAS_LDFLAGS"
  AC_CHECK_HEADER([cblas.h], [],
    [AC_MSG_ERROR([cblas.h not found. On Debian: apt-get install libopenblas-dev, or --with-blas=DIR])])
  LIBS=""
  AC_SEARCH_LIBS([cblas_sgemm], [openblas cblas blas], [],
    [AC_MSG_ERROR([no library provides cblas_sgemm. On Debian: apt-get install libopenblas-dev, or --with-blas=DIR])])
  BLAS_LIBS="$BLAS_LDFLAGS $LIBS"
  AC_CHECK_FUNCS([openblas_set_num_threads openblas_get_config openblas_get_corename])
  CPPFLAGS=$loom_save_CPPFLAGS; LIBS=$loom_save_LIBS; LDFLAGS=$loom_save_LDFLAGS
  AC_SUBST([BLAS_CFLAGS])
  AC_SUBST([BLAS_LIBS])
])
