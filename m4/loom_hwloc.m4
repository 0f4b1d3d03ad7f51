# loom_hwloc.m4 — find hwloc >= 2.0 (required): topology discovery and core binding.
# Uses pkg-config when it knows hwloc, otherwise a plain header and library check.
AC_DEFUN([LOOM_CHECK_HWLOC], [
  PKG_CHECK_MODULES([HWLOC], [hwloc >= 2.0], [loom_hwloc_ok=yes], [loom_hwloc_ok=no])
  AS_IF([test "x$loom_hwloc_ok" = "xno"], [
    AC_CHECK_HEADER([hwloc.h], [AC_CHECK_LIB([hwloc], [hwloc_topology_init],
      [HWLOC_LIBS="-lhwloc"; loom_hwloc_ok=yes])])
  ])
  AS_IF([test "x$loom_hwloc_ok" = "xno"],
    [AC_MSG_ERROR([hwloc >= 2.0 not found: it is required for topology and binding. On Debian: apt-get install libhwloc-dev])])
  AC_SUBST([HWLOC_CFLAGS])
  AC_SUBST([HWLOC_LIBS])
])
