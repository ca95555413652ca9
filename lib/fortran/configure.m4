dnl SPDX-License-Identifier: BSD-3-Clause
dnl The Fortran module's configure fragment (placeholder until it lands).
have_fortran=no
AM_CONDITIONAL([HAVE_FORTRAN], [false])
