# loom_mpi.m4 — find MPI (required): mpicc becomes the C compiler, mpirun runs the MPI tests.
# LOOM_CHECK_MPI runs before AC_PROG_CC; LOOM_CHECK_MPI_LINK after it.
AC_DEFUN([LOOM_CHECK_MPI], [
  AC_ARG_VAR([MPICC], [MPI C compiler wrapper (default: mpicc)])
  AC_ARG_VAR([MPIRUN], [MPI launcher used by make check (default: mpirun)])
  AS_IF([test -z "$MPICC"], [AC_PATH_PROGS([MPICC], [mpicc mpicc.openmpi mpicc.mpich])])
  AS_IF([test -z "$MPICC"],
    [AC_MSG_ERROR([mpicc not found: MPI is required. On Debian: apt-get install openmpi-bin libopenmpi-dev, or set MPICC=/path/to/mpicc])])
  AS_IF([test -z "$CC"], [CC="$MPICC"])
  AS_IF([test -z "$MPIRUN"], [AC_PATH_PROGS([MPIRUN], [mpirun mpiexec])])
  AS_IF([test -z "$MPIRUN"],
    [AC_MSG_ERROR([mpirun not found: MPI is required. On Debian: apt-get install openmpi-bin, or set MPIRUN=/path/to/mpirun])])
])

AC_DEFUN([LOOM_CHECK_MPI_LINK], [
  AC_MSG_CHECKING([whether $CC compiles and links an MPI program])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>]],
                                  [[int p; MPI_Init_thread(0, 0, MPI_THREAD_MULTIPLE, &p); MPI_Finalize();]])],
    [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([$CC cannot build an MPI program: set CC or MPICC to your MPI compiler wrapper])])
  # Compile and link flags for pkg-config users who do not compile with mpicc.
  MPI_CFLAGS=`$MPICC --showme:compile 2>/dev/null || $MPICC -compile-info 2>/dev/null | cut -d' ' -f2-`
  MPI_LIBS=`$MPICC --showme:link 2>/dev/null || $MPICC -link-info 2>/dev/null | cut -d' ' -f2-`
  MPI_VENDOR_GUESS=unknown
  AS_IF([$MPIRUN --version 2>/dev/null | grep -q "Open MPI"], [MPI_VENDOR_GUESS="Open MPI"],
        [$MPIRUN --version 2>/dev/null | grep -qi "mpich\|hydra"], [MPI_VENDOR_GUESS="MPICH"])
  AS_IF([test "x$MPI_VENDOR_GUESS" = "xOpen MPI"],
        [AC_DEFINE([LOOM_OPEN_MPI], [1], [Define if the MPI library is Open MPI])])
  AC_SUBST([MPI_CFLAGS])
  AC_SUBST([MPI_LIBS])
])
