#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The quick-start demo: jacobi3d on two local ranks over a sweep from
# communication-bound (a thin slab, many small blocks) to compute-bound
# (128^3), each point run without any exchange (none: the compute floor),
# with MPI messages (msg) and with dchan channels (dchan). The three run
# side by side in one jacobi3d job (--modes none,msg,dchan), each on its
# own copy of the grid, taking turns in DEMO_ROUNDS rounds (default 5), so
# that a slow spell of the machine falls on all three alike; DEMO_REPS
# such jobs per point (default 3), medians of the time per iteration.
# Every row of the sweep is printed, level or not.
#   tools/demo.sh BUILDDIR [OUTDIR]
# writes OUTDIR/demo.dat (the table) and OUTDIR/demo-ratio.png (dchan/msg
# against the share of msg's iteration spent in the exchange, with gnuplot)
# (OUTDIR defaults to BUILDDIR/demo). The last line is a RESULT line whose
# ratio_dchan_over_msg is that of the most communication-bound row (the
# largest msg comm share), next to worst_ratio, the table's largest.
# DEMO_ROWS overrides the sweep: "GRID:BLOCKS:ITERS ...". The dchan mode
# sends faces with --faces pack (DEMO_FACES=subarray for jacobi3d's
# default): its sweep then packs each face as msg's does, into the
# neighbour's slot instead of a pack buffer, so that the two modes run the
# same code but for the transport.
set -e
b=${1:?usage: tools/demo.sh BUILDDIR [OUTDIR]}
out=${2:-$b/demo}
reps=${DEMO_REPS:-3}
rounds=${DEMO_ROUNDS:-5}
here=$(cd "$(dirname "$0")" && pwd)
# Iterations per point: about 0.1 s of timed work per mode, so that 3 jobs
# of every row fit the budget of the whole demo (under a minute on 2 cores;
# about 30 s here).
rows=${DEMO_ROWS:-"4,128,128:1:3000 32,32,32:1:6000 64,64,64:1:1000 128,128,128:1:100
4,128,128:64:1000 32,32,32:8:3000 32,32,32:64:1000 64,64,64:8:800 64,64,64:64:500"}
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
mpirun=${MPIRUN:-mpirun}
# One rank per core where there are two; a smaller machine time-shares.
bind="--bind-to core"
[ "$(nproc 2>/dev/null || echo 1)" -ge 2 ] || bind="--oversubscribe"
mkdir -p "$out"
dat=$out/demo.dat
raw=$out/demo-runs.txt
: > "$raw"

# run GRID BLOCKS ITERS [--verify]: the job's three RESULT lines (none,
# msg, dchan). A private TMPDIR per mpirun: Open MPI's session directories
# would race otherwise.
run() {
    t=$(mktemp -d "${TMPDIR:-/tmp}/dchan-demo.XXXXXX")
    faces="--faces ${DEMO_FACES:-pack}"
    TMPDIR=$t $mpirun -np 2 $bind "$b/apps/jacobi3d/jacobi3d" --grid "$1" --procs 2,1,1 \
        --blocks "$2" --iters "$3" --modes none,msg,dchan --rounds "$rounds" $faces $4 \
        >"$t/out" 2>"$t/err" || true
    if [ "$(grep -c '^RESULT ' "$t/out")" -ne 3 ]; then
        echo "demo: jacobi3d --grid $1 --blocks $2 failed:" >&2; cat "$t/out" "$t/err" >&2
        rm -rf "$t"; exit 1
    fi
    grep '^RESULT ' "$t/out" | tee -a "$raw"
    rm -rf "$t"
}
mode_line() { echo "$1" | grep " mode=$2 "; }
val() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 }
    END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "dchan demo: jacobi3d on 2 ranks (procs 2,1,1), modes none (compute floor), msg, dchan (faces ${DEMO_FACES:-pack})"
echo "side by side in one job, turns in $rounds rounds, $reps jobs per row, medians; the first job's msg and dchan are verified"
printf '# %s\n' "jacobi3d on 2 ranks (procs 2,1,1), dchan --faces ${DEMO_FACES:-pack}, medians of $reps jobs of the three modes side by side ($rounds rounds); $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), $(nproc 2>/dev/null) CPUs" > "$dat"
printf '# %-12s %6s %6s %10s %10s %10s %9s %10s %10s\n' grid blocks iters none_us msg_us dchan_us \
    dchan/msg dchan/none msg_comm >> "$dat"
start=$(date +%s)
for row in $rows; do
    grid=${row%%:*}
    rest=${row#*:}
    blocks=${rest%%:*}
    iters=${rest#*:}
    tn= tm= td= cm=
    for i in $(seq 1 "$reps"); do
        v=
        [ "$i" -eq 1 ] && v=--verify
        lines=$(run "$grid" "$blocks" "$iters" $v)
        n=$(mode_line "$lines" none) m=$(mode_line "$lines" msg) d=$(mode_line "$lines" dchan)
        if [ "$i" -eq 1 ] && { [ "$(val "$m" verified)" != yes ] || [ "$(val "$d" verified)" != yes ]; }; then
            echo "demo: a run did not verify:"; echo "$m"; echo "$d"; exit 1
        fi
        tn="$tn $(val "$n" iter_time_s)" tm="$tm $(val "$m" iter_time_s)"
        td="$td $(val "$d" iter_time_s)" cm="$cm $(val "$m" comm_share)"
    done
    echo "$grid $blocks $iters $(echo $tn | median) $(echo $tm | median) $(echo $td | median) $(echo $cm | median)" |
        awk '{ printf "  %-12s %6d %6d %10.2f %10.2f %10.2f %9.3f %10.3f %10.3f\n",
                      $1, $2, $3, $4 * 1e6, $5 * 1e6, $6 * 1e6, $6 / $5, $6 / $4, $7 }' >> "$dat"
    echo "  row $grid blocks $blocks done ($(( $(date +%s) - start )) s)"
done

echo
echo "time per iteration (us), medians; msg_comm: share of msg's iteration in the face exchange"
printf '  %-12s %6s %6s %10s %10s %10s %9s %10s %10s\n' grid blocks iters none msg dchan \
    dchan/msg dchan/none msg_comm
grep -v '^#' "$dat"
echo "(table: $dat; every run's RESULT line: $raw; $(( $(date +%s) - start )) s in all)"

if command -v gnuplot >/dev/null 2>&1; then
    gnuplot -e "datafile='$dat'; outfile='$out/demo-ratio.png'" "$here/demo-plot.gp" &&
        echo "plot: $out/demo-ratio.png (dchan/msg against msg's comm share)"
else
    echo "demo: gnuplot not found (Debian package gnuplot-nox): no plot drawn; the table is in $dat"
fi

# The headline: the row where communication weighs most for msg, which is
# where a transport can matter; worst_ratio keeps the other rows honest.
grep -v '^#' "$dat" | sort -g -k9 | tail -n 1 | awk -v worst="$(grep -v '^#' "$dat" | sort -g -k7 | tail -n 1 | awk '{ print $7 }')" \
    '{ printf "RESULT demo=jacobi3d grid=%s blocks=%s ranks=2 none_s=%.3e msg_s=%.3e dchan_s=%.3e msg_comm_share=%s ratio_dchan_over_msg=%s worst_ratio=%s\n",
              $1, $2, $4 / 1e6, $5 / 1e6, $6 / 1e6, $9, $7, worst }'
