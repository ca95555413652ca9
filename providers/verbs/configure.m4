dnl SPDX-License-Identifier: BSD-3-Clause
dnl The verbs provider's configure fragment (placeholder until the provider lands).
have_verbs=no
dchan_verbs_summary="not yet implemented"
AM_CONDITIONAL([HAVE_VERBS], [false])
