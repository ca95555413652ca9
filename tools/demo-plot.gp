# SPDX-License-Identifier: BSD-3-Clause
# The demo's plot (tools/demo.sh): dchan/msg against the share of msg's
# iteration spent in the face exchange, one point per row of the table,
# labelled with grid and blocks per rank.
#   gnuplot -e "datafile='demo.dat'; outfile='demo-ratio.png'" tools/demo-plot.gp
set terminal pngcairo size 900,600 noenhanced
set output outfile
set title "jacobi3d on 2 ranks: dchan against MPI messages"
set xlabel "share of the msg iteration spent in the face exchange"
set ylabel "time per iteration, dchan / msg"
set xrange [0:1]
set yrange [0:*]
set offsets 0, 0, 0.15, 0 # room above the level line
set grid
set key top right
set style line 1 lt 1 lw 2 pt 7 ps 1.5
# Columns: grid blocks iters none_us msg_us dchan_us dchan/msg dchan/none msg_comm
plot 1 with lines dt 2 lc rgb "gray" title "level", \
     datafile using 9:7 with points ls 1 title "dchan / msg", \
     datafile using 9:7:(sprintf("%s B=%s", stringcolumn(1), stringcolumn(2))) with labels offset 0,1 font ",9" notitle
