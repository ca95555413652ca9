dnl SPDX-License-Identifier: BSD-3-Clause
dnl Integrations with other people's software, each built when configure
dnl finds it (Debian: libpetsc-real-dev, libstarpu-dev, libuv1-dev).
dnl PETSc and StarPU-MPI headers include mpi.h, so their checks see MPI's
dnl flags; both need the MPI bootstrap to be useful.
dchan_save_mpi_CPPFLAGS=$CPPFLAGS
CPPFLAGS="$CPPFLAGS $MPI_CFLAGS"
dnl Debian's PETSc sets PETSC_DIR for its users; its pkg-config module is
dnl PETSc (petsc.pc in older releases).
AS_IF([test -n "$PETSC_DIR" && test -d "$PETSC_DIR/lib/pkgconfig"],
      [PKG_CONFIG_PATH="$PETSC_DIR/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
       export PKG_CONFIG_PATH])
DCHAN_CHECK_PKG([petsc], [PETSc], [petscsf.h], [PetscSFRegister], [petsc],
                [PETSc SF type dchan (libdchan_petsc)])
DCHAN_CHECK_PKG([starpu], [starpumpi-1.3], [starpu_mpi.h], [starpu_mpi_init_conf], [starpumpi-1.3],
                [StarPU integration and jacobi3d_starpu])
CPPFLAGS=$dchan_save_mpi_CPPFLAGS
DCHAN_CHECK_PKG([libuv], [libuv], [uv.h], [uv_poll_init], [uv], [libuv integration])
AS_IF([test "x$have_mpi" != xyes], [have_petsc=no; have_starpu=no])
AM_CONDITIONAL([BUILD_PETSC], [test "x$have_petsc" = xyes && test "x$have_mpi" = xyes])
AM_CONDITIONAL([BUILD_STARPU], [test "x$have_starpu" = xyes && test "x$have_mpi" = xyes])
AS_IF([test "x$have_petsc" = xyes],
      [dchan_petsc_summary=`$PKG_CONFIG --modversion PETSc 2>/dev/null`],
      [dchan_petsc_summary="--with-petsc, needs libpetsc-real-dev and MPI"])
AS_IF([test "x$have_starpu" = xyes],
      [dchan_starpu_summary=`$PKG_CONFIG --modversion starpumpi-1.3 2>/dev/null`],
      [dchan_starpu_summary="--with-starpu, needs libstarpu-dev and MPI"])
AS_IF([test "x$have_libuv" = xyes],
      [dchan_libuv_summary=`$PKG_CONFIG --modversion libuv 2>/dev/null`],
      [dchan_libuv_summary="--with-libuv, needs libuv1-dev"])
