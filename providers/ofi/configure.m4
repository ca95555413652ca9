dnl SPDX-License-Identifier: BSD-3-Clause
dnl The ofi provider's configure fragment: libfabric through pkg-config, the
dnl default paths, or --with-ofi=DIR. fi_mr_regattr and the mr_mode bits the
dnl provider relies on date from libfabric 1.5 (2017); the version found is
dnl reported in the summary.
DCHAN_CHECK_PKG([ofi], [libfabric], [rdma/fabric.h], [fi_getinfo], [fabric], [the ofi provider])
AS_IF([test "x$have_ofi" = xyes], [
  dchan_save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $OFI_CPPFLAGS"
  AC_COMPUTE_INT([dchan_ofi_major], [FI_MAJOR_VERSION], [#include <rdma/fabric.h>], [dchan_ofi_major=?])
  AC_COMPUTE_INT([dchan_ofi_minor], [FI_MINOR_VERSION], [#include <rdma/fabric.h>], [dchan_ofi_minor=?])
  CPPFLAGS=$dchan_save_CPPFLAGS
  dchan_ofi_summary="libfabric $dchan_ofi_major.$dchan_ofi_minor"
], [
  AS_IF([test "x$with_ofi" = xno], [dchan_ofi_summary="--without-ofi"],
        [dchan_ofi_summary="--with-ofi, needs libfabric-dev"])
])
