dnl SPDX-License-Identifier: BSD-3-Clause
dnl The ofi provider's configure fragment: libfabric through pkg-config, the
dnl default paths, or --with-ofi=DIR. fi_mr_regattr and the mr_mode bits the
dnl provider relies on date from libfabric 1.5 (2017); the version found is
dnl reported in the summary. libdchan does not link libfabric: the provider
dnl loads it at first use (providers/ofi/ofi_dl.c), by the name and symbol
dnl versions that a program linked against these headers gets.

dnl DCHAN_OFI_SYMVER(FUNCTION): the version of FUNCTION among the symbols in
dnl $dchan_ofi_syms (readelf --dyn-syms of a program that imports it), into
dnl DCHAN_OFI_V_FUNCTION ("" where libfabric does not version it).
AC_DEFUN([DCHAN_OFI_SYMVER], [
  AS_IF([printf '%s\n' "$dchan_ofi_syms" | grep ' UND  *$1\(@<:@@ @:>@\|$\)' >/dev/null], [],
        [AC_MSG_ERROR([readelf does not show $1 among the symbols a libfabric program imports])])
  dchan_v=`printf '%s\n' "$dchan_ofi_syms" | sed -n 's/.* UND  *$1@\(@<:@A-Za-z0-9_.@:>@*\).*/\1/p' | sed 1q`
  dchan_ofi_vers="$dchan_ofi_vers $1@$dchan_v"
  AC_DEFINE_UNQUOTED(m4_toupper([DCHAN_OFI_V_$1]), ["$dchan_v"],
                     [libfabric's version of the symbol $1 ("" when unversioned)])
])

dnl DCHAN_OFI_DLOPEN: links a program that calls the six libfabric functions
dnl dchan calls directly and reads with readelf the libfabric it needs (into
dnl DCHAN_OFI_SONAME) and the version of each symbol.
AC_DEFUN([DCHAN_OFI_DLOPEN], [
  dchan_save_LIBS=$LIBS
  AC_SEARCH_LIBS([dlvsym], [dl], [], [AC_MSG_ERROR([the ofi provider needs dlopen and dlvsym])])
  AS_IF([test "x$ac_cv_search_dlvsym" = "xnone required"], [OFI_DL_LIBS=], [OFI_DL_LIBS=$ac_cv_search_dlvsym])
  LIBS=$dchan_save_LIBS
  AC_SUBST([OFI_DL_LIBS])
  AC_CHECK_TOOL([READELF], [readelf], [no])
  AS_IF([test "x$READELF" = xno],
        [AC_MSG_ERROR([the ofi provider needs readelf (binutils) to find libfabric's symbol versions])])
  AC_MSG_CHECKING([libfabric's name and symbol versions])
  dchan_save_CPPFLAGS=$CPPFLAGS; dchan_save_LDFLAGS=$LDFLAGS; dchan_save_LIBS=$LIBS
  CPPFLAGS="$CPPFLAGS $OFI_CPPFLAGS"; LDFLAGS="$LDFLAGS $OFI_LDFLAGS"; LIBS="$OFI_LIBS $LIBS"
  dchan_ofi_syms=; dchan_ofi_needed=
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <rdma/fabric.h>
#include <rdma/fi_errno.h>]], [[
    struct fi_info *i = fi_dupinfo(0), *l = 0;
    struct fid_fabric *f = 0;
    int r = fi_getinfo(fi_version(), 0, 0, 0, i, &l);
    fi_freeinfo(l);
    r += fi_fabric(i->fabric_attr, &f, 0);
    fi_freeinfo(i);
    return r + (fi_strerror(r) != 0);]])],
    [dchan_ofi_syms=`$READELF -W --dyn-syms conftest$EXEEXT 2>/dev/null`
     dchan_ofi_needed=`$READELF -W -d conftest$EXEEXT 2>/dev/null |
                       sed -n 's/.*(NEEDED).*Shared library: .\(libfabric.*\).$/\1/p' | sed 1q`])
  CPPFLAGS=$dchan_save_CPPFLAGS; LDFLAGS=$dchan_save_LDFLAGS; LIBS=$dchan_save_LIBS
  AS_IF([test -z "$dchan_ofi_needed"],
        [AC_MSG_ERROR([a program linked with $OFI_LIBS does not name libfabric among the libraries it needs])])
  dchan_ofi_vers=
  DCHAN_OFI_SYMVER([fi_getinfo])
  DCHAN_OFI_SYMVER([fi_freeinfo])
  DCHAN_OFI_SYMVER([fi_dupinfo])
  DCHAN_OFI_SYMVER([fi_fabric])
  DCHAN_OFI_SYMVER([fi_strerror])
  DCHAN_OFI_SYMVER([fi_version])
  AC_DEFINE_UNQUOTED([DCHAN_OFI_SONAME], ["$dchan_ofi_needed"], [libfabric's name, as dlopen loads it])
  AC_MSG_RESULT([$dchan_ofi_needed:$dchan_ofi_vers])
])

DCHAN_CHECK_PKG([ofi], [libfabric], [rdma/fabric.h], [fi_getinfo], [fabric], [the ofi provider])
AS_IF([test "x$have_ofi" = xyes], [
  dchan_save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $OFI_CPPFLAGS"
  AC_COMPUTE_INT([dchan_ofi_major], [FI_MAJOR_VERSION], [#include <rdma/fabric.h>], [dchan_ofi_major=?])
  AC_COMPUTE_INT([dchan_ofi_minor], [FI_MINOR_VERSION], [#include <rdma/fabric.h>], [dchan_ofi_minor=?])
  CPPFLAGS=$dchan_save_CPPFLAGS
  dchan_ofi_summary="libfabric $dchan_ofi_major.$dchan_ofi_minor"
  DCHAN_OFI_DLOPEN
  dchan_ofi_summary="$dchan_ofi_summary; $dchan_ofi_needed loaded at first use"
], [
  AS_IF([test "x$with_ofi" = xno], [dchan_ofi_summary="--without-ofi"],
        [dchan_ofi_summary="--with-ofi, needs libfabric-dev"])
])
