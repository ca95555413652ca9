dnl SPDX-License-Identifier: BSD-3-Clause
dnl The ofi provider's configure fragment (placeholder until the provider lands).
have_ofi=no
dchan_ofi_summary="not yet implemented"
AM_CONDITIONAL([HAVE_OFI], [false])
