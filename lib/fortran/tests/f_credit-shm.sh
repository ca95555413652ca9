#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# f_credit on the shm provider (DCHAN_PROVIDER=shm) instead of self: the
# credit word in the shared segment, and dchan_put_ptr's slot mapped
# through shm. Run by make check from the build directory; skipped (77)
# when shm is not built or will not open here, which f_credit reports as
# every detection mode skipped.

prog=lib/fortran/tests/f_credit
[ -x "$prog" ] || { echo "f_credit-shm: no $prog here: run from the build directory" >&2; exit 99; }
out=$(DCHAN_PROVIDER=shm "./$prog")
rc=$?
printf '%s\n' "$out"
if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$out" | grep -c 'not offered here, skipped')" -eq 3 ]; then
    echo "f_credit-shm: SKIP: shm is not usable here"
    exit 77
fi
exit $rc
