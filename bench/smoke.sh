#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# make check's smoke test of the benchmarks: each runs on 2 ranks with tiny
# sizes, few iterations and every byte of every message verified, and the
# RESULT lines it prints are checked for content, not just the exit status.
# It also checks that every provider dchan_info lists is one that --all tries.
# Run from the top build directory (as make check does); srcdir may be set.

builddir=$(pwd)
fail=0

say() { echo "smoke: $*"; }
bad() { echo "smoke: FAIL: $*"; fail=1; }

for p in dchan_pingpong dchan_bw dchan_pollcost dchan_credit dchan_stream dchan_direct; do
    if [ ! -x "$builddir/bench/$p" ]; then
        echo "smoke: bench/$p is not built here ($builddir)"
        exit 99
    fi
done

# The launcher configure found, else the first on PATH.
if [ -z "${MPIRUN:-}" ] && [ -x "$builddir/config.status" ]; then
    MPIRUN=$(echo '@MPIRUN@' | "$builddir/config.status" -q --file=-:- 2>/dev/null)
fi
[ -n "${MPIRUN:-}" ] || MPIRUN=mpirun
if ! command -v "$MPIRUN" >/dev/null 2>&1; then
    echo "smoke: no MPI launcher ($MPIRUN)"
    exit 77
fi

# Open MPI refuses root without these (CI runs as root); keep MPI itself on
# shared memory and TCP, as the multi-process tests do; MPI leaks by design.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_mtl=^ofi
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMPI_MCA_btl OMPI_MCA_pml \
    OMPI_MCA_mtl ASAN_OPTIONS
# Other tests may run beside this one: yield in wait loops. A wait fails
# after 20 s of the waiter's own CPU time with nothing arriving (a hang),
# however long a loaded machine makes it in wall time.
common="--yield --timeout 20 --check full"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dchan-smoke.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
# Open MPI's session directories too: tests running beside this one never
# share them (tests/mprun does the same).
TMPDIR=$tmp
export TMPDIR

run() { # name program args...
    name=$1
    shift
    say "$*"
    # A hang detector, not a time limit: as generous as tests/mprun's.
    timeout -k 10 "${MPRUN_TIMEOUT:-600}" "$MPIRUN" -np 2 --oversubscribe "$@" \
        >"$tmp/$name.out" 2>"$tmp/$name.err"
    rc=$?
    cat "$tmp/$name.out"
    if [ $rc -ne 0 ]; then
        bad "$name exited with status $rc"
        sed 's/^/  stderr: /' "$tmp/$name.err"
    fi
}

# The value of key in a RESULT line.
val() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
# Is $1 a positive decimal number?
# A measurement as the benchmarks print it: decimals, or three significant
# digits (bench_fmt) for a value those decimals would show as 0.
positive() { echo "$1" | awk '{ exit !($0 ~ /^[0-9]+(\.[0-9]+)?(e-[0-9]+)?$/ && $0 + 0 > 0) }'; }

# ---- every provider the library lists is one --all tries ------------------------
listed=$("$builddir/tools/dchan_info" -p | sed -n 's/^  \([a-z0-9_][a-z0-9_]*\)  *\(usable\|not usable\):.*/\1/p')
tried=$("$builddir/bench/dchan_pingpong" --list-providers)
for p in $listed; do
    echo "$tried" | grep -qx "$p" ||
        bad "provider '$p' (dchan_info -p) is not in bench/bench.c provider_names[]"
done
# shm, where usable, is measured twice: buffers from dchan_alloc (shm) and
# from the heap (the shm-heap pseudo provider).
shm=0
"$builddir/tools/dchan_info" -p | grep -Eq '^  shm +usable:' && shm=1
if [ $shm -eq 1 ]; then
    echo "$tried" | grep -qx shm-heap || bad "shm-heap is not in bench/bench.c provider_names[]"
fi

# ---- pingpong ---------------------------------------------------------------------
sizes="8,100,4096,70000"
run pingpong "$builddir/bench/dchan_pingpong" --all --sizes $sizes --iters 20 --warmup 2 \
    --reps 3 $common
grep '^RESULT bench=pingpong' "$tmp/pingpong.out" >"$tmp/pp" || bad "pingpong: no RESULT line"
while read -r line; do
    med=$(val "$line" oneway_us) min=$(val "$line" min_us) max=$(val "$line" max_us)
    if ! positive "$med" || ! positive "$min" || ! positive "$max" ||
        ! awk -v a="$min" -v b="$med" -v c="$max" 'BEGIN { exit !(a <= b && b <= c) }'; then
        bad "pingpong: malformed line: $line"
    fi
done <"$tmp/pp"
for s in $(echo $sizes | tr , ' '); do
    for impl in mpi-sendrecv mpi-put-pscw mpi-put-lock; do
        grep -q "impl=$impl provider=- detect=- size=$s " "$tmp/pp" ||
            bad "pingpong: no $impl result at $s bytes"
    done
    # dchan over mpi (EVENT) is always built with MPI.
    grep -q "impl=dchan provider=mpi detect=event size=$s " "$tmp/pp" ||
        bad "pingpong: no dchan/mpi/event result at $s bytes"
    for p in shm shm-heap; do
        [ $shm -eq 1 ] || break
        grep -q "impl=dchan provider=$p detect=event size=$s " "$tmp/pp" ||
            bad "pingpong: no dchan/$p/event result at $s bytes"
    done
done
grep -q 'impl=cacheline provider=- detect=- size=8 ' "$tmp/pp" || bad "pingpong: no cacheline"
# The raw UCX baseline, where configure found UCX: a result at every size,
# unless UCX could not open here, which it must then have said.
if grep -q '^#define HAVE_UCX 1' "$builddir/config.h" 2>/dev/null; then
    if grep -q 'ucx-put: UCX cannot be used here; skipped' "$tmp/pingpong.err"; then
        say "note: ucx-put built but skipped: UCX cannot be used here"
    else
        for s in $(echo $sizes | tr , ' '); do
            grep -q "impl=ucx-put provider=- detect=- size=$s " "$tmp/pp" ||
                bad "pingpong: no ucx-put result at $s bytes"
        done
    fi
fi
grep -q '^SKIP bench=pingpong provider=self ' "$tmp/pingpong.out" ||
    bad "pingpong: self (unusable on 2 ranks) was not reported as skipped"

# ---- bandwidth --------------------------------------------------------------------
bwprov=mpi
[ $shm -eq 1 ] && bwprov=mpi,shm,shm-heap
run bw "$builddir/bench/dchan_bw" --provider $bwprov --sizes 4096,65536 --window 4 --iters 4 \
    --warmup 1 --reps 2 $common
for s in 4096 65536; do
    set -- "dchan provider=mpi detect=event" "mpi-sendrecv provider=- detect=-" \
        "memcpy provider=- detect=-"
    [ $shm -eq 1 ] && set -- "$@" "dchan provider=shm detect=event" \
        "dchan provider=shm-heap detect=event"
    for impl in "$@"; do
        line=$(grep "^RESULT bench=bw impl=$impl size=$s window=4 " "$tmp/bw.out")
        positive "$(val "$line" mbps)" || bad "bw: no valid $impl result at $s bytes: $line"
    done
done

# ---- poll cost and allocations -------------------------------------------------------
run pollcost "$builddir/bench/dchan_pollcost" --provider mpi,self --armed 0,1,10 --iters 30 \
    --warmup 3 --reps 3 $common
for pd in "mpi event" "self event"; do
    set -- $pd
    for n in 0 1 10; do
        line=$(grep "^RESULT bench=pollcost provider=$1 detect=$2 armed=$n " "$tmp/pollcost.out")
        positive "$(val "$line" progress_ns)" || bad "pollcost: $1/$2 armed=$n: '$line'"
        d=$(val "$line" detect_ns)
        if [ $n -eq 0 ]; then
            [ "$d" = "-" ] || bad "pollcost: detect_ns at armed=0 should be '-': $line"
        else
            positive "$d" || bad "pollcost: $1/$2 armed=$n detect_ns: '$line'"
        fi
    done
    line=$(grep "^RESULT bench=alloc provider=$1 detect=$2 " "$tmp/pollcost.out")
    a=$(val "$line" allocs_per_put) b=$(val "$line" allocs_per_progress)
    # Zero is the target, reported by run-all; here only the form is checked.
    for x in "$a" "$b"; do
        echo "$x" | grep -Eq '^([0-9]+\.[0-9]+|-)$' || bad "alloc: malformed line: '$line'"
    done
    [ "$a$b" = "0.0000.000" ] || say "note: $1/$2 allocates in steady state: $line"
done

# ---- credited channels: credit cost, depth streaming, direct store ------------------
# A provider whose credit support has not landed answers DCHAN_ERR_UNSUPPORTED
# at dchan_create_handle_attr (a SKIP line with a size, said here); shm, where
# usable, must measure. Any other SKIP or FAIL line fails.
skips_ok() { # file bench
    grep -E "^(SKIP|FAIL) bench=$2 " "$1" | while read -r line; do
        case "$line" in
        SKIP*size=*reason=DCHAN_ERR_UNSUPPORTED*) # the handle: no credit in this provider yet
            say "note: $2: $(val "$line" provider)/$(val "$line" detect): no credit support yet" >&2 ;;
        SKIP*reason=DCHAN_ERR_UNSUPPORTED*) ;; # dchan_init: not usable here, as in the pingpong
        *) echo "$line" ;;
        esac
    done | grep . && bad "$2: unexpected SKIP/FAIL lines (above)"
    return 0
}

run credit "$builddir/bench/dchan_credit" --all --iters 40 --warmup 4 --reps 3 $common
skips_ok "$tmp/credit.out" credit
grep '^RESULT bench=credit ' "$tmp/credit.out" >"$tmp/cr"
while read -r line; do
    for k in plain_us credit_us ratio plain_min_us credit_max_us; do
        positive "$(val "$line" $k)" || bad "credit: bad $k: $line"
    done
    echo "$(val "$line" stalls_per_put)" | grep -Eq '^[0-9]+\.[0-9]+$' || bad "credit: bad stalls: $line"
done <"$tmp/cr"
if [ $shm -eq 1 ]; then
    for d in sentinel flag event; do
        grep -q "provider=shm detect=$d size=8 " "$tmp/cr" || bad "credit: no shm/$d result"
    done
fi

stprov=mpi
[ $shm -eq 1 ] && stprov=mpi,shm,shm-heap
run stream "$builddir/bench/dchan_stream" --provider $stprov --sizes 8,4096,65536 --depth 4 \
    --iters 64 --warmup 8 --reps 2 $common
skips_ok "$tmp/stream.out" stream
for s in 8 4096 65536; do
    for p in shm shm-heap; do
        [ $shm -eq 1 ] || break
        line=$(grep "^RESULT bench=stream provider=$p detect=[a-z]* size=$s depth=4 window=4 " \
            "$tmp/stream.out")
        for k in dchan_mmsgs mpi_window_mmsgs mpi_stream_mmsgs dchan_mbps ratio_window \
            ratio_stream ratio_best; do
            positive "$(val "$line" $k)" || bad "stream: $p at $s bytes: bad $k: '$line'"
        done
    done
    grep -q "^RESULT bench=stream .* size=$s " "$tmp/stream.out" ||
        bad "stream: no result at $s bytes"
done

if [ $shm -eq 1 ]; then
    run direct "$builddir/bench/dchan_direct" --provider shm,shm-heap --detect sentinel,event \
        --sizes 4096,65536 --depth 2 --iters 32 --warmup 4 --reps 2 $common
    skips_ok "$tmp/direct.out" direct
    for s in 4096 65536; do
        # Where the slot is mapped (shm segment, not SENTINEL), dchan_put_ptr
        # gives it and the library copies nothing; else it gives the send buffer.
        for pdm in "shm event 1.00 0" "shm sentinel 0.00 $s" "shm-heap event 0.00 $s"; do
            set -- $pdm
            line=$(grep "^RESULT bench=direct provider=$1 detect=$2 size=$s " "$tmp/direct.out")
            for k in direct_us copy_us fill_us ratio; do
                positive "$(val "$line" $k)" || bad "direct: $1/$2 at $s: bad $k: '$line'"
            done
            [ "$(val "$line" mapped)" = "$3" ] && [ "$(val "$line" copied_direct)" = "$4" ] &&
                [ "$(val "$line" copied_copy)" = "$s" ] ||
                bad "direct: $1/$2 at $s: want mapped=$3 copied_direct=$4 copied_copy=$s: '$line'"
        done
    done
fi

[ $fail -eq 0 ] && say "all benchmark RESULT lines present and well formed"
exit $fail
