# loom_zlib.m4 — find zlib (required): the example trainers read gzip-compressed datasets.
# Sets ZLIB_CFLAGS and ZLIB_LIBS.
AC_DEFUN([LOOM_CHECK_ZLIB], [
  PKG_CHECK_MODULES([ZLIB], [zlib], [], [
    AC_CHECK_HEADER([zlib.h], [],
      [AC_MSG_ERROR([zlib.h not found: zlib is required. On Debian: apt-get install zlib1g-dev])])
    AC_CHECK_LIB([z], [gzopen], [ZLIB_LIBS="-lz"],
      [AC_MSG_ERROR([libz not found: zlib is required. On Debian: apt-get install zlib1g-dev])])
  ])
  AC_SUBST([ZLIB_CFLAGS])
  AC_SUBST([ZLIB_LIBS])
])
