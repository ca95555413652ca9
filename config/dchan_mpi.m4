dnl SPDX-License-Identifier: BSD-3-Clause
dnl DCHAN_CHECK_MPI: --with-mpi (yes|no|auto). Sets MPI_CFLAGS, MPI_LIBS,
dnl MPICC, HAVE_MPI and the HAVE_MPI conditional. The flags come from the
dnl MPI compiler wrapper (Open MPI --showme, MPICH -compile-info), or from
dnl pkg-config (mpi-c, ompi-c, mpich).
AC_DEFUN([DCHAN_CHECK_MPI], [
  AC_ARG_WITH([mpi],
    [AS_HELP_STRING([--with-mpi], [build the mpi provider and bootstrap (default: when found)])],
    [], [with_mpi=auto])
  AC_ARG_VAR([MPICC], [MPI C compiler wrapper used to find MPI's flags])
  AC_ARG_VAR([MPIRUN], [MPI launcher for the multi-process tests])
  have_mpi=no
  AS_IF([test "x$with_mpi" != xno], [
    AC_PATH_PROGS([MPICC], [mpicc mpicc.openmpi mpicc.mpich], [])
    AS_IF([test -z "$MPI_CFLAGS$MPI_LIBS" && test -n "$MPICC"], [
      MPI_CFLAGS=`$MPICC --showme:compile 2>/dev/null` && MPI_LIBS=`$MPICC --showme:link 2>/dev/null` || {
        MPI_CFLAGS=`$MPICC -compile-info 2>/dev/null | cut -d' ' -f2-`
        MPI_LIBS=`$MPICC -link-info 2>/dev/null | cut -d' ' -f2-`
      }])
    AS_IF([test -z "$MPI_CFLAGS$MPI_LIBS"], [
      PKG_CHECK_MODULES([MPI], [mpi-c], [], [
        PKG_CHECK_MODULES([MPI], [ompi-c], [], [
          PKG_CHECK_MODULES([MPI], [mpich], [], [:])])])])
    dchan_save_CPPFLAGS=$CPPFLAGS; dchan_save_LIBS=$LIBS
    CPPFLAGS="$CPPFLAGS $MPI_CFLAGS"; LIBS="$MPI_LIBS $LIBS"
    AC_CHECK_HEADER([mpi.h], [
      AC_MSG_CHECKING([whether MPI programs link])
      AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>]],
                       [[int f = 0; MPI_Initialized(&f); MPI_Comm c; MPI_Comm_dup(MPI_COMM_WORLD, &c);]])],
                     [have_mpi=yes], [have_mpi=no])
      AC_MSG_RESULT([$have_mpi])])
    CPPFLAGS=$dchan_save_CPPFLAGS; LIBS=$dchan_save_LIBS
    AS_IF([test "x$have_mpi" = xno && test "x$with_mpi" = xyes],
          [AC_MSG_ERROR([--with-mpi was given but no usable MPI was found (install libopenmpi-dev or set MPICC)])])
  ])
  AS_IF([test "x$have_mpi" = xyes], [
    AC_DEFINE([HAVE_MPI], [1], [Define to 1 to build the mpi provider and bootstrap])
    AC_PATH_PROGS([MPIRUN], [mpirun mpiexec], [])
    dchan_mpi_version=`$MPIRUN --version 2>/dev/null | head -n 1`
  ], [MPI_CFLAGS=; MPI_LIBS=])
  AC_SUBST([MPI_CFLAGS])
  AC_SUBST([MPI_LIBS])
  AM_CONDITIONAL([HAVE_MPI], [test "x$have_mpi" = xyes])
])
