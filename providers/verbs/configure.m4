dnl SPDX-License-Identifier: BSD-3-Clause
dnl The verbs provider's configure fragment (placeholder until the provider lands).
have_verbs=no
dchan_verbs_summary="not yet implemented"
AM_CONDITIONAL([HAVE_VERBS], [false])

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
