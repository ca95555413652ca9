#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# jacobi3d runs whose outcome is more than a zero exit status: bad --blocks,
# --faces, --modes and --rounds values must end the job with status 2 and say
# why on stderr; --mode none must run, exchange nothing and report itself
# unverified; --modes must run each mode on its own grid, alternated, with one
# RESULT line per mode in its order, msg and dchan both verified. The
# runs are scenarios of apps/scenarios, started through tests/mprun. Run by
# make check from the build directory.

runner=tests/mprun
[ -f "$runner" ] || { echo "jacobi-checks: no $runner here: run from the build directory" >&2; exit 99; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dchan-jchk.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
trap 'exit 99' HUP INT TERM
status=0

# run SCENARIO: output in $tmp/SCENARIO.out and .err, status in $rc.
run() {
    sh "$runner" "$1.auto.auto.mpi.np2.mprun" > "$tmp/$1.out" 2> "$tmp/$1.err"
    rc=$?
}

# must_fail SCENARIO TEXT: status 2 and TEXT on stderr, no RESULT line.
must_fail() {
    run "$1"
    if [ $rc -ne 2 ]; then
        echo "FAIL $1: expected status 2, got $rc" >&2
        cat "$tmp/$1.out" "$tmp/$1.err" >&2
        status=1
    elif ! grep -qF -- "$2" "$tmp/$1.err"; then
        echo "FAIL $1: stderr lacks '$2':" >&2
        cat "$tmp/$1.err" >&2
        status=1
    elif grep -q '^RESULT ' "$tmp/$1.out"; then
        echo "FAIL $1: a RESULT line after bad arguments" >&2
        status=1
    else
        echo "ok   $1: status 2, '$2'"
    fi
}

must_fail jacobi-badblocks "jacobi3d: --blocks wants a positive integer"
must_fail jacobi-nofit "jacobi3d: --blocks 13: no split of each rank's part"
must_fail jacobi-badfaces "jacobi3d: --faces wants subarray or pack"
must_fail jacobi-badmodes "jacobi3d: --modes wants a comma list of msg, dchan and none, each at most once"
must_fail jacobi-badrounds "jacobi3d: --rounds goes with --modes"
must_fail jacobi-manyrounds "jacobi3d: --rounds: more rounds than timed iterations"

run jacobi-none
line=$(grep '^RESULT ' "$tmp/jacobi-none.out" | tail -n 1)
case $rc:$line in
"0:RESULT app=jacobi3d provider=none mode=none ranks=2 grid=18,12,11 procs=2,1,1 blocks=8 iters=10 "*" comm_share=0.000 residual="*" verified=skipped")
    if grep -q "exchanges no faces: not verified" "$tmp/jacobi-none.err"; then
        echo "ok   jacobi-none: ${line#RESULT }"
    else
        echo "FAIL jacobi-none: stderr does not say why it is not verified" >&2
        status=1
    fi ;;
*)
    echo "FAIL jacobi-none: status $rc, RESULT line '$line'" >&2
    cat "$tmp/jacobi-none.out" "$tmp/jacobi-none.err" >&2
    status=1 ;;
esac
# --modes none,msg,dchan --rounds 3 --verify: three lines in that order; msg
# and dchan verified against the serial run, so their residuals agree to the
# last digit; none skipped. The times are not checked: they are measurements.
run jacobi-modes
grep '^RESULT ' "$tmp/jacobi-modes.out" > "$tmp/modes.lines"
common="ranks=2 grid=18,12,11 procs=2,1,1 blocks=8 iters=10"
pat() { echo "RESULT app=jacobi3d provider=$1 mode=$2 $common iter_time_s=* comm_share=* residual=$3 verified=$4 rounds=3"; }
res_msg=$(sed -n 2p "$tmp/modes.lines" | tr ' ' '\n' | sed -n 's/^residual=//p')
ok=1
[ $rc -eq 0 ] && [ "$(wc -l < "$tmp/modes.lines")" -eq 3 ] && [ -n "$res_msg" ] || ok=0
n=0
while [ $ok -eq 1 ] && IFS= read -r line; do
    n=$((n + 1))
    case $n in
    1) want=$(pat none none "*" skipped) ;;
    2) want=$(pat mpi msg "$res_msg" yes) ;;
    3) want=$(pat "*" dchan "$res_msg" yes) ;;
    esac
    # shellcheck disable=SC2254 # want is a pattern
    case $line in $want) ;; *) ok=0 ;; esac
done < "$tmp/modes.lines"
if [ $ok -eq 1 ] && grep -q "^jacobi3d: dchan: largest difference from the serial run: .* (verified)" "$tmp/jacobi-modes.err" &&
   grep -q "^jacobi3d: msg: largest difference from the serial run: .* (verified)" "$tmp/jacobi-modes.err"; then
    echo "ok   jacobi-modes: none, msg and dchan side by side, msg and dchan verified (residual $res_msg)"
else
    echo "FAIL jacobi-modes: status $rc, lines:" >&2
    cat "$tmp/jacobi-modes.out" "$tmp/jacobi-modes.err" >&2
    status=1
fi
exit $status
