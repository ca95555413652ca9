#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# jacobi3d_f against jacobi3d. For each problem below, runs scenario
# jacobi-<p> (C) and jacobi-f-<p> (Fortran) of apps/scenarios through
# tests/mprun, with the same ranks, and requires: the same arguments in both
# scenarios, both verified against their serial run (mode none: both
# unverified, as they must be), and the same RESULT line but for the
# timings, so the same residual to the last printed digit (both do the same
# floating-point operations in the same order, so they compute the same
# doubles). The problems cover msg, dchan (--faces pack: credited channels
# of depth 2) and none, overlap with faces along every axis. Then
# jacobi3d_f --faces subarray must stop with status 2 and say why. Run by
# make check from the build directory.

srcdir=${srcdir:-$(dirname "$0")/../../..}
runner=tests/mprun
scenarios=$srcdir/apps/scenarios
[ -f "$runner" ] || { echo "jacobi-compare: no $runner here: run from the build directory" >&2; exit 99; }
[ -f "$scenarios" ] || { echo "jacobi-compare: cannot read $scenarios" >&2; exit 99; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dchan-jcmp.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
trap 'exit 99' HUP INT TERM
status=0

args_of() {
    grep -E "^$1[[:space:]]" "$scenarios" | head -n 1 | "${AWK:-awk}" '{ $1 = ""; $2 = ""; print }'
}

# The RESULT line of a run, without its timings (iter_time_s, comm_share).
result_of() {
    grep '^RESULT ' "$1" | tail -n 1 | sed 's/ iter_time_s=[^ ]*//; s/ comm_share=[^ ]*//'
}

# problem:ranks, as the C runs of apps/Makefile.include use them.
for pr in 1-msg:1 2-pack:2 4-msg:4 4-pack:4 112-msg:2 112-pack:2 222-pack:8 2-none:2; do
    p=${pr%:*}
    np=${pr#*:}
    # DCHAN_TEST_MAXNP: the largest run wanted (the sanitizer pass of make
    # check-all runs nothing above 2 ranks; see .ci/sanitizer-check).
    if [ -n "${DCHAN_TEST_MAXNP:-}" ] && [ "$np" -gt "$DCHAN_TEST_MAXNP" ]; then
        echo "skip $p on $np ranks: more than DCHAN_TEST_MAXNP=$DCHAN_TEST_MAXNP"
        continue
    fi
    c=jacobi-$p
    f=jacobi-f-$p
    if [ "$(args_of "$c")" != "$(args_of "$f")" ] || [ -z "$(args_of "$c")" ]; then
        echo "FAIL $p: scenarios $c and $f of apps/scenarios differ or are missing" >&2
        status=1
        continue
    fi
    for s in "$c" "$f"; do
        if ! sh "$runner" "$s.auto.auto.mpi.np$np.mprun" > "$tmp/$s.out" 2>&1; then
            echo "FAIL $p: $s failed:" >&2
            cat "$tmp/$s.out" >&2
            status=1
            continue 2
        fi
    done
    rc_line=$(result_of "$tmp/$c.out")
    rf_line=$(result_of "$tmp/$f.out")
    case $rc_line in
    *" mode=none "*" verified=skipped") ;;
    *" mode=none "*) echo "FAIL $p: $c claims a verdict: '$rc_line'" >&2; status=1; continue ;;
    *" verified=yes") ;;
    *) echo "FAIL $p: $c not verified: '$rc_line'" >&2; status=1; continue ;;
    esac
    if [ "$rc_line" != "$rf_line" ]; then
        echo "FAIL $p: the RESULT lines differ:" >&2
        echo "  C:       $rc_line" >&2
        echo "  Fortran: $rf_line" >&2
        status=1
        continue
    fi
    echo "ok   $p on $np ranks: ${rf_line#RESULT }"
done

s=jacobi-f-badfaces
sh "$runner" "$s.auto.auto.mpi.np2.mprun" > "$tmp/$s.out" 2> "$tmp/$s.err"
rc=$?
want="jacobi3d_f: --faces subarray is not in the Fortran driver"
if [ $rc -ne 2 ] || ! grep -qF -- "$want" "$tmp/$s.err" || grep -q '^RESULT ' "$tmp/$s.out"; then
    echo "FAIL $s: expected status 2, '$want' on stderr and no RESULT line; got status $rc:" >&2
    cat "$tmp/$s.out" "$tmp/$s.err" >&2
    status=1
else
    echo "ok   $s: status 2, '$want'"
fi
exit $status
