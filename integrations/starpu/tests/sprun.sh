#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# Runs one StarPU integration test: integrations/starpu/tests/<name>.sprun,
# with <name> a line of integrations/starpu/tests/scenarios. Each run gets
# its own TMPDIR (Open MPI's session directory) and STARPU_HOME (StarPU's
# performance-model directory), one CPU worker per rank, and must print
# verified=yes when it is a jacobi run.
srcdir=$(cd "$(dirname "$0")/../../.." && pwd)
: "${MPIRUN:=mpirun}"
: "${SPRUN_TIMEOUT:=600}"
name=$(basename "$1" .sprun)

line=$(grep -E "^$name[[:space:]]" "$srcdir/integrations/starpu/tests/scenarios" | head -n 1)
if [ -z "$line" ]; then
    echo "sprun: unknown scenario '$name'" >&2
    exit 99
fi
set -- $line
np=$2
shift 2
# Settings before the program: VAR=value, exported to the ranks.
while [ $# -gt 0 ]; do
    case $1 in
    *=*) export "$1"; shift ;;
    *) break ;;
    esac
done
prog=$1
shift

TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/dchan-sprun.XXXXXX") || exit 99
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
trap 'exit 99' HUP INT TERM
STARPU_HOME=$TMPDIR/starpu STARPU_NCPU=${STARPU_NCPU:-1} STARPU_SILENT=1
STARPU_NCUDA=0 STARPU_NOPENCL=0 STARPU_WORKERS_NOBIND=1
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=cma
OMPI_MCA_mtl=^ofi
export STARPU_HOME STARPU_NCPU STARPU_SILENT STARPU_NCUDA STARPU_NOPENCL STARPU_WORKERS_NOBIND
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMPI_MCA_btl OMPI_MCA_pml
export OMPI_MCA_btl_vader_single_copy_mechanism OMPI_MCA_mtl

echo "sprun: $MPIRUN -np $np $prog $*"
out=$TMPDIR/out
# One STARPU_HOME per rank: ranks calibrating the bus at once in one
# directory read each other's half-written files.
timeout -k 10 "$SPRUN_TIMEOUT" "$MPIRUN" -np "$np" --oversubscribe \
    sh -c 'STARPU_HOME=$STARPU_HOME/rank${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}; export STARPU_HOME
           exec "$0" "$@"' "./$prog" "$@" >"$out"
rc=$?
cat "$out"
[ $rc -eq 0 ] || { echo "sprun: status $rc" >&2; exit 1; }
case $name in
jacobi-*)
    grep -q '^RESULT .* verified=yes' "$out" || { echo "sprun: not verified" >&2; exit 1; } ;;
budget)
    grep -q '^BUDGET OK' "$out" || { echo "sprun: budget check failed" >&2; exit 1; } ;;
esac
exit 0
