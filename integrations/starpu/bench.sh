#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# jacobi3d_starpu, dchan against StarPU-MPI: 2 ranks, one CPU worker each,
# BLOCKS blocks per rank, over a sweep of grids from thin slabs (little
# compute per face) to thick ones. Runs the two modes alternately RUNS
# times per grid and prints the medians of iter_time_s and task_time_s,
# the ratio dchan / StarPU-MPI, and the share of StarPU-MPI's iteration
# spent outside tasks (communication and waiting).
#   bench.sh BUILDDIR [RUNS]     (GRIDS, BLOCKS, ITERS, MPIRUN_OPTS in the environment)
builddir=${1:?usage: bench.sh BUILDDIR [RUNS]}
runs=${2:-5}
: "${GRIDS:=8,128,128 16,128,128 32,128,128 64,128,128 128,128,128}"
: "${BLOCKS:=4}"
: "${ITERS:=200}"
: "${MPIRUN:=mpirun}"
: "${MPIRUN_OPTS:=--oversubscribe}"
exe=$builddir/apps/jacobi3d_starpu/jacobi3d_starpu

TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/dchan-spbench.XXXXXX") || exit 1
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
STARPU_HOME=$TMPDIR/starpu STARPU_NCPU=${STARPU_NCPU:-1} STARPU_SILENT=1 STARPU_NCUDA=0
STARPU_NOPENCL=0
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=cma
export STARPU_HOME STARPU_NCPU STARPU_SILENT STARPU_NCUDA STARPU_NOPENCL
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMPI_MCA_btl OMPI_MCA_pml
export OMPI_MCA_btl_vader_single_copy_mechanism

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }

echo "# $(uptime)"
echo "# blocks per rank $BLOCKS (1,$BLOCKS,1), iters $ITERS, $runs alternated runs per mode, medians"
printf '%-12s %12s %12s %12s %12s %7s %10s\n' grid dchan_s smpi_s dchan_task_s smpi_task_s ratio smpi_comm
for g in $GRIDS; do
    : > "$TMPDIR/d" && : > "$TMPDIR/s" && : > "$TMPDIR/dt" && : > "$TMPDIR/st"
    for r in $(seq "$runs"); do
        for m in dchan starpu-mpi; do
            # One STARPU_HOME per rank (see tests/sprun.sh).
            line=$("$MPIRUN" -np 2 $MPIRUN_OPTS sh -c \
                'STARPU_HOME=$STARPU_HOME/rank${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}; export STARPU_HOME
                 exec "$0" "$@"' "$exe" --grid "$g" --procs 2,1,1 --blocks "$BLOCKS" \
                --iters "$ITERS" --mode $m 2>/dev/null | grep '^RESULT')
            [ -n "$line" ] || { echo "bench: run failed: $g $m" >&2; exit 1; }
            f=$([ $m = dchan ] && echo d || echo s)
            echo "$line" | field iter_time_s >> "$TMPDIR/$f"
            echo "$line" | field task_time_s >> "$TMPDIR/${f}t"
        done
    done
    d=$(median < "$TMPDIR/d") s=$(median < "$TMPDIR/s")
    dt=$(median < "$TMPDIR/dt") st=$(median < "$TMPDIR/st")
    awk -v g="$g" -v d="$d" -v s="$s" -v dt="$dt" -v st="$st" 'BEGIN {
        printf "%-12s %12.4e %12.4e %12.4e %12.4e %7.3f %9.1f%%\n", g, d, s, dt, st, d / s,
               100 * (1 - st / s) }'
done
echo "# $(uptime)"
