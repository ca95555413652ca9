dnl SPDX-License-Identifier: BSD-3-Clause
dnl The Fortran module's configure fragment.
dnl
dnl --enable-fortran[=yes|no|auto] (default auto): build the `dchan' module
dnl (lib/fortran), its library libdchan_fortran and its tests when a
dnl Fortran 2008 compiler with C interoperability works; yes makes a missing
dnl or broken compiler an error, no skips the checks. The Fortran demo
dnl (apps/jacobi3d/jacobi3d_f) and the MPI Fortran tests also need MPI's
dnl Fortran bindings (the `mpi' module), found through the MPI Fortran
dnl wrapper (MPIFC: Open MPI --showme, MPICH -compile-info) or pkg-config
dnl (ompi-fort); MPI_FCFLAGS and MPI_FCLIBS override both.
dnl
dnl Sets have_fortran, have_mpi_fortran, FC, FC_MODINC, FC_MODOUT, FC_MODEXT,
dnl DCHAN_FCFLAGS, MPI_FCFLAGS, MPI_FCLIBS, DCHAN_PC_FLIBS and the
dnl HAVE_FORTRAN and HAVE_MPI_FORTRAN conditionals.
AC_ARG_ENABLE([fortran],
  [AS_HELP_STRING([--enable-fortran],
                  [build the Fortran module dchan (default: when a Fortran 2008 compiler works)])],
  [], [enable_fortran=auto])
AC_ARG_VAR([MPIFC], [MPI Fortran compiler wrapper used to find MPI's Fortran flags])
AC_ARG_VAR([MPI_FCFLAGS], [Fortran flags to use MPI's `mpi' module (default: from MPIFC)])
AC_ARG_VAR([MPI_FCLIBS], [libraries of MPI's Fortran bindings (default: from MPIFC)])
AS_CASE([$enable_fortran], [yes|no|auto], [],
        [AC_MSG_ERROR([--enable-fortran=$enable_fortran: expected yes, no or auto])])

have_fortran=no
have_mpi_fortran=no
dchan_fortran_missing=
dnl AC_PROG_FC stays at the top level, where libtool's hook on it (the
dnl Fortran tag) expands cleanly; FC=no is libtool's way to skip the tag,
dnl and leaves AC_PROG_FC nothing to find. gfortran first (Debian:
dnl gfortran); FC is empty when no compiler is found.
AS_IF([test "x$enable_fortran" = xno], [FC=no])
AC_PROG_FC([gfortran f95 f2008 f2003 ifx ifort nvfortran flang-new flang])
AS_IF([test "x$enable_fortran" = xno], [FC=])
AS_IF([test "x$enable_fortran" != xno], [
  AS_IF([test -z "$FC"], [dchan_fortran_missing="no Fortran compiler found (set FC)"], [
    AC_LANG_PUSH([Fortran])
    dnl Free-form .f90 sources (the tests below are written in it too).
    AC_FC_SRCEXT([f90], [], [dchan_fortran_missing="$FC does not compile .f90 files"])
    dnl Everything the module relies on: bind(C) types and interfaces,
    dnl value arguments, c_loc/c_funloc/c_f_pointer, c_signed_char.
    AC_MSG_CHECKING([whether $FC handles Fortran 2008 C interoperability])
    AS_IF([test -n "$dchan_fortran_missing"], [AC_MSG_RESULT([skipped])], [
      AC_LINK_IFELSE([AC_LANG_SOURCE([[
module conftest_mod
  use, intrinsic :: iso_c_binding
  implicit none
  type, bind(C) :: conftest_t
    integer(c_size_t) :: n
    type(c_ptr) :: p
    type(c_funptr) :: f
    integer(c_signed_char) :: b(16)
  end type
contains
  subroutine conftest_cb(h, arg) bind(C)
    type(c_ptr), value :: h, arg
  end subroutine
end module
program main
  use conftest_mod
  type(conftest_t), target :: t
  integer(c_int64_t), pointer :: q
  integer(c_int64_t), target :: v = 1
  t%f = c_funloc(conftest_cb)
  t%p = c_loc(v)
  call c_f_pointer(t%p, q)
  if (c_sizeof(t) < 16 .or. q /= 1 .or. .not. c_associated(t%f)) stop 1
end program
]])], [AC_MSG_RESULT([yes])], [
      AC_MSG_RESULT([no])
      dchan_fortran_missing="$FC cannot build Fortran 2008 C interoperability (see config.log)"])])
    dnl Module files go to a folder of the build tree and are found there.
    AS_IF([test -z "$dchan_fortran_missing"], [
      AC_FC_MODULE_EXTENSION
      AC_FC_MODULE_FLAG([], [dchan_fortran_missing="no flag found for $FC to search module folders"])
      AC_FC_MODULE_OUTPUT_FLAG([], [dchan_fortran_missing="no flag found for $FC to write module files to a folder"])
      AS_IF([test -z "$FC_MODEXT"], [dchan_fortran_missing="cannot tell $FC's module file extension"])])
    AC_LANG_POP([Fortran])])
  AS_IF([test -z "$dchan_fortran_missing"], [have_fortran=yes],
        [test "x$enable_fortran" = xyes],
        [AC_MSG_ERROR([--enable-fortran: $dchan_fortran_missing; install gfortran or set FC])],
        [AC_MSG_WARN([not building the Fortran module: $dchan_fortran_missing])])
])

dnl Compiler flags of our own Fortran sources: the standard they are written
dnl to (so that the module stays portable beyond gfortran), the warnings of
dnl the C sources, less two that only flag what the code means to do (a
dnl callback takes (h, arg) whether it uses them or not; the tests compare
dnl doubles exactly), and -Werror with --enable-werror (parsed from the
dnl command line by now).
DCHAN_FCFLAGS=
AS_IF([test "x$have_fortran" = xyes && test "x$ac_cv_fc_compiler_gnu" = xyes], [
  DCHAN_FCFLAGS="-std=f2018 -Wall -Wextra -Wno-unused-dummy-argument -Wno-compare-reals"
  AS_IF([test "x$enable_werror" = xyes], [DCHAN_FCFLAGS="$DCHAN_FCFLAGS -Werror"])])
AC_SUBST([DCHAN_FCFLAGS])

AS_IF([test "x$have_fortran" = xyes && test "x$have_mpi" = xyes], [
  AS_IF([test -z "$MPI_FCFLAGS$MPI_FCLIBS"], [
    AC_PATH_PROGS([MPIFC], [mpifort mpif90 mpifort.openmpi mpif90.openmpi mpifort.mpich mpif90.mpich], [])
    AS_IF([test -n "$MPIFC"], [
      MPI_FCFLAGS=`$MPIFC --showme:compile 2>/dev/null` && MPI_FCLIBS=`$MPIFC --showme:link 2>/dev/null` || {
        dnl MPICH prints the whole command line, compiler first.
        MPI_FCFLAGS=`$MPIFC -compile-info 2>/dev/null | cut -d' ' -f2-`
        MPI_FCLIBS=`$MPIFC -link-info 2>/dev/null | cut -d' ' -f2-`
      }])])
  AS_IF([test -z "$MPI_FCFLAGS$MPI_FCLIBS"], [
    PKG_CHECK_MODULES([MPI_FORT], [ompi-fort],
                      [MPI_FCFLAGS=$MPI_FORT_CFLAGS; MPI_FCLIBS=$MPI_FORT_LIBS], [:])])
  AC_LANG_PUSH([Fortran])
  dchan_save_FCFLAGS=$FCFLAGS; dchan_save_LIBS=$LIBS
  FCFLAGS="$FCFLAGS $MPI_FCFLAGS"; LIBS="$MPI_FCLIBS $LIBS"
  AC_MSG_CHECKING([whether Fortran programs can use MPI's mpi module])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([], [[
      use mpi
      integer :: ierr, rank
      call MPI_Init(ierr)
      call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
      call MPI_Finalize(ierr)]])],
    [have_mpi_fortran=yes], [have_mpi_fortran=no])
  AC_MSG_RESULT([$have_mpi_fortran])
  FCFLAGS=$dchan_save_FCFLAGS; LIBS=$dchan_save_LIBS
  AC_LANG_POP([Fortran])
  AS_IF([test "x$have_mpi_fortran" = xno],
        [AC_MSG_WARN([MPI's Fortran bindings do not work with $FC (install libopenmpi-dev built for it, or set MPIFC or MPI_FCFLAGS/MPI_FCLIBS): not building jacobi3d_f and the MPI Fortran tests])])])
AS_IF([test "x$have_mpi_fortran" = xno], [MPI_FCFLAGS=; MPI_FCLIBS=])
AC_SUBST([MPI_FCFLAGS])
AC_SUBST([MPI_FCLIBS])

dnl What a Fortran program links besides `pkg-config --libs dchan': the
dnl module's own procedures (the string helpers) live in libdchan_fortran,
dnl so that libdchan itself never depends on a Fortran runtime.
AS_IF([test "x$have_fortran" = xyes],
      [DCHAN_PC_FLIBS='-L${libdir} -ldchan_fortran'], [DCHAN_PC_FLIBS=])
AC_SUBST([DCHAN_PC_FLIBS])

AM_CONDITIONAL([HAVE_FORTRAN], [test "x$have_fortran" = xyes])
AM_CONDITIONAL([HAVE_MPI_FORTRAN], [test "x$have_mpi_fortran" = xyes])
