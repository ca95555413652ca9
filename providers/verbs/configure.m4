dnl SPDX-License-Identifier: BSD-3-Clause
dnl The verbs provider's configure fragment: rdma-core's libibverbs through
dnl pkg-config, the default paths, or --with-verbs=DIR. The provider uses only
dnl the public <infiniband/verbs.h> API (no rdma_cm, no mlx5dv), so the same
dnl build runs on InfiniBand, RoCE, rxe and the test simulation.
DCHAN_CHECK_PKG([verbs], [libibverbs], [infiniband/verbs.h], [ibv_get_device_list], [ibverbs],
                [the verbs provider])
AS_IF([test "x$have_verbs" = xyes], [
  dnl Later additions to libibverbs, used when present: typed GID entries
  dnl (rdma-core 32) pick a RoCE v2 GID; ibv_query_qp_data_in_order (rdma-core
  dnl 41) allows single-write SENTINEL puts where the device promises it.
  dchan_save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $VERBS_CPPFLAGS"
  dchan_save_LDFLAGS=$LDFLAGS; LDFLAGS="$LDFLAGS $VERBS_LDFLAGS"
  dchan_save_LIBS=$LIBS; LIBS="$VERBS_LIBS $LIBS"
  AC_CHECK_DECLS([ibv_query_gid_ex, IBV_GID_TYPE_ROCE_V2], [], [],
                 [[#include <infiniband/verbs.h>]])
  AC_CHECK_FUNCS([ibv_query_qp_data_in_order])
  CPPFLAGS=$dchan_save_CPPFLAGS; LDFLAGS=$dchan_save_LDFLAGS; LIBS=$dchan_save_LIBS
  dchan_verbs_summary="rdma-core libibverbs"
  AS_IF([test "x$ac_cv_func_ibv_query_qp_data_in_order" = xyes],
        [dchan_verbs_summary="$dchan_verbs_summary, data-in-order query"])
], [
  AS_IF([test "x$with_verbs" = xno], [dchan_verbs_summary="--without-verbs"],
        [dchan_verbs_summary="--with-verbs, needs libibverbs-dev (rdma-core)"])
])

dnl The verbs simulation (tests/verbs-sim/): a test-only libibverbs.so.1 that
dnl the tests select with LD_LIBRARY_PATH. It is built from the real verbs
dnl header, mirrors the export table of the installed libibverbs.so.1 (read
dnl with objdump or readelf) and moves data with process_vm_writev.
AC_CHECK_HEADER([infiniband/verbs.h], [have_ibverbs_headers=yes], [have_ibverbs_headers=no])
AC_PATH_PROG([VSIM_OBJDUMP], [objdump])
AS_IF([test -z "$VSIM_OBJDUMP"], [AC_PATH_PROG([VSIM_READELF], [readelf])])
VSIM_EXPORT_TOOL=${VSIM_OBJDUMP:-$VSIM_READELF}
AC_SUBST([VSIM_EXPORT_TOOL])
AC_ARG_VAR([VSIM_REAL_LIBIBVERBS], [the installed libibverbs.so.1 whose exports the verbs simulation mirrors])
AC_MSG_CHECKING([for the installed libibverbs.so.1])
AS_IF([test -z "$VSIM_REAL_LIBIBVERBS"],
      [VSIM_REAL_LIBIBVERBS=`$CC -print-file-name=libibverbs.so.1 2>/dev/null`])
AS_CASE([$VSIM_REAL_LIBIBVERBS], [/*], [], [VSIM_REAL_LIBIBVERBS=])
AS_IF([test -n "$VSIM_REAL_LIBIBVERBS" && test ! -r "$VSIM_REAL_LIBIBVERBS"], [VSIM_REAL_LIBIBVERBS=])
AC_MSG_RESULT([${VSIM_REAL_LIBIBVERBS:-no}])
AM_CONDITIONAL([HAVE_VERBS_SIM],
  [test "x$have_ibverbs_headers" = xyes && test -n "$VSIM_EXPORT_TOOL" &&
   test -n "$VSIM_REAL_LIBIBVERBS" && test "x$ac_cv_func_process_vm_writev" = xyes])
