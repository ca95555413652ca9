dnl SPDX-License-Identifier: BSD-3-Clause
dnl The demo applications' configure fragment (placeholder until they land).
have_blas=no
AM_CONDITIONAL([HAVE_BLAS], [false])
