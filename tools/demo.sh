#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The quick-start demo: jacobi3d on two local ranks, message baseline against
# dchan, three runs each (alternating), and the ratio of the medians.
#   tools/demo.sh BUILDDIR [GRID] [ITERS]
set -e
b=$1
grid=${2:-128,128,128}
iters=${3:-200}
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
mpirun=${MPIRUN:-mpirun}
run() {
    $mpirun -np 2 --oversubscribe "$b/apps/jacobi3d/jacobi3d" --grid "$grid" --procs 2,1,1 \
        --iters "$iters" --mode "$1" --verify 2>/dev/null | tail -n 1
}
val() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
median3() { printf '%s\n%s\n%s\n' "$1" "$2" "$3" | sort -g | sed -n 2p; }

echo "dchan demo: jacobi3d $grid on 2 ranks, $iters iterations, msg vs dchan (3 runs each)"
for i in 1 2 3; do
    m=$(run msg)
    d=$(run dchan)
    [ "$(val "$m" verified)" = yes ] && [ "$(val "$d" verified)" = yes ] || {
        echo "demo: a run did not verify:"; echo "$m"; echo "$d"; exit 1; }
    eval "m$i=$(val "$m" iter_time_s) d$i=$(val "$d" iter_time_s)"
    echo "  run $i: msg $(val "$m" iter_time_s) s/iter   dchan $(val "$d" iter_time_s) s/iter   (provider $(val "$d" provider))"
done
mm=$(median3 "$m1" "$m2" "$m3")
dm=$(median3 "$d1" "$d2" "$d3")
ratio=$(awk -v d="$dm" -v m="$mm" 'BEGIN { printf "%.3f", d / m }')
echo "median time per iteration: msg $mm s, dchan $dm s"
echo "RESULT demo=jacobi3d grid=$grid ranks=2 msg_s=$mm dchan_s=$dm ratio_dchan_over_msg=$ratio"
