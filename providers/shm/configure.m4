dnl SPDX-License-Identifier: BSD-3-Clause
dnl The shm provider's configure fragment: Linux memfd segments (memfd_create
dnl with sealing, glibc 2.27) and Cross Memory Attach (process_vm_writev).
dnl --enable-shm (default: automatic) / --disable-shm.
AC_ARG_ENABLE([shm],
  [AS_HELP_STRING([--enable-shm], [the intra-node shm provider (default: when memfd_create and process_vm_writev exist)])],
  [], [enable_shm=auto])
have_shm=no
dchan_shm_summary="--enable-shm, needs Linux memfd_create and process_vm_writev"
AS_IF([test "x$enable_shm" != xno], [
  AC_CHECK_FUNCS([memfd_create], [], [], [[#define _GNU_SOURCE
#include <sys/mman.h>]])
  AC_CHECK_DECL([F_SEAL_SHRINK], [dchan_shm_seal=yes], [dchan_shm_seal=no], [[#define _GNU_SOURCE
#include <fcntl.h>]])
  AS_IF([test "x$ac_cv_func_memfd_create" = xyes && test "x$ac_cv_func_process_vm_writev" = xyes &&
         test "x$dchan_shm_seal" = xyes],
        [have_shm=yes; dchan_shm_summary="memfd segments, Cross Memory Attach"],
        [AS_IF([test "x$enable_shm" = xyes],
               [AC_MSG_ERROR([--enable-shm: memfd_create, file sealing or process_vm_writev not found])])])
], [dchan_shm_summary="--disable-shm"])
AS_IF([test "x$have_shm" = xyes], [AC_DEFINE([HAVE_SHM], [1], [Build the shm provider])])
AM_CONDITIONAL([HAVE_SHM], [test "x$have_shm" = xyes])
