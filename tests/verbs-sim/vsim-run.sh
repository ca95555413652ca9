#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# Runs one verbs-sim test. The stub's name says what to run:
#   <scenario>.<placement>.<device>.vsim
# scenario:  basic (one process) or a scenario of vsim_rdma (fork-based);
# placement: inorder|reverse|torn|delayed (DCHAN_VSIM_PLACEMENT), or "real":
#            the same binary against the installed libibverbs, which has no
#            device here and must say so and exit cleanly (77), or pass on
#            real hardware;
# device:    ib (vsim_ib0), roce (vsim_roce0) or any.
# Usage (from make check): vsim-run.sh BUILDDIR TEST.vsim

builddir=$1
name=$(basename "$2" .vsim)
old_ifs=$IFS
IFS=.
set -- $name
IFS=$old_ifs
if [ $# -ne 3 ]; then
    echo "vsim-run: cannot parse test name '$name'" >&2
    exit 99
fi
scenario=$1 placement=$2 device=$3

case $scenario in
basic) exe="$builddir/vsim_basic"; args= ;;
# dchan_info probes every provider, libfabric too, whose own verbs and efa
# providers load librdmacm and libefa on top of the simulation.
info)  exe="$builddir/../../tools/dchan_info"; args=-p ;;
*)     exe="$builddir/vsim_rdma"; args=$scenario ;;
esac
case $device in
ib)   VSIM_TEST_DEVICE=vsim_ib0 ;;
roce) VSIM_TEST_DEVICE=vsim_roce0 ;;
any)  VSIM_TEST_DEVICE=any ;;
*) echo "vsim-run: unknown device '$device'" >&2; exit 99 ;;
esac
export VSIM_TEST_DEVICE

# What the negative controls must observe under each placement.
case $scenario.$placement in
lastbyte.reverse|lastbyte.torn) args="$args --expect broken" ;;
lastbyte.*)                     args="$args --expect intact" ;;
late.delayed)                   args="$args --expect late" ;;
late.*)                         args="$args --expect ontime" ;;
esac

run() {
    if command -v timeout >/dev/null 2>&1; then
        # A hang detector, not a time limit (as tests/mprun's).
        timeout -k 10 "${MPRUN_TIMEOUT:-600}" "$exe" $args
    else
        "$exe" $args
    fi
}

if [ "$placement" = real ]; then
    VSIM_TEST_EXPECT_SIM=0
    export VSIM_TEST_EXPECT_SIM
    echo "vsim-run: $exe $args against the installed libibverbs"
    run
    rc=$?
    case $rc in
    0)  echo "vsim-run: passed on a real device" ;;
    77) echo "vsim-run: no device, reported cleanly: PASS"; rc=0 ;;
    *)  echo "vsim-run: FAIL (exit $rc)" ;;
    esac
    exit $rc
fi

case $placement in
inorder|reverse|torn|delayed) ;;
*) echo "vsim-run: unknown placement '$placement'" >&2; exit 99 ;;
esac

# A private fabric per run, removed afterwards.
fabric_root=$(mktemp -d "${TMPDIR:-/tmp}/vsim-check.XXXXXX") || exit 99
trap 'rm -rf "$fabric_root"' EXIT
DCHAN_VSIM_DIR=$fabric_root
DCHAN_VSIM_FABRIC=$name
DCHAN_VSIM_PLACEMENT=$placement
LD_LIBRARY_PATH="$builddir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Bind every symbol at start: a missing version node or call fails loudly.
LD_BIND_NOW=1
VSIM_TEST_EXPECT_SIM=1
export DCHAN_VSIM_DIR DCHAN_VSIM_FABRIC DCHAN_VSIM_PLACEMENT LD_LIBRARY_PATH LD_BIND_NOW \
    VSIM_TEST_EXPECT_SIM

echo "vsim-run: $exe $args (placement $placement, device $VSIM_TEST_DEVICE)"
if [ "$scenario" = info ]; then
    out=$fabric_root/info.out
    run > "$out"
    rc=$?
    cat "$out"
    # To its end, with the simulated device as the verbs provider's.
    if [ $rc -eq 0 ] && { ! grep -Eq "^  verbs +usable: .*$VSIM_TEST_DEVICE port 1" "$out" ||
                          ! grep -q '^bootstrap methods:' "$out"; }; then
        echo "vsim-run: FAIL: dchan_info did not list $VSIM_TEST_DEVICE as usable, or stopped early"
        rc=1
    fi
else
    out=$fabric_root/test.out
    run > "$out" 2>&1
    rc=$?
    cat "$out"
fi
# wholeword needs memfd_secret() (before Linux 6.5, only with the boot option
# secretmem.enable=1); without it both sides say so and exit 77.
if [ $rc -eq 77 ] && [ "$scenario" = wholeword ] && grep -q 'SKIP: memfd_secret' "$out"; then
    echo "vsim-run: SKIP: this kernel offers no memfd_secret()"
    exit 77
fi
if [ $rc -eq 77 ]; then
    echo "vsim-run: FAIL: the simulation offered no device"
    rc=1
fi
# Everything a test created must be gone (a killed peer's excepted).
if [ $rc -eq 0 ] && [ "$scenario" != peerdeath ]; then
    left=$(cd "$fabric_root/$name" 2>/dev/null && ls | grep -v '^registry$')
    if [ -n "$left" ]; then
        echo "vsim-run: FAIL: objects left in the fabric: $left"
        rc=1
    fi
fi
exit $rc
