#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# Reads the export table of the installed libibverbs.so.1 and writes
#   MAP:   a linker version script with the same public version nodes
#          (IBVERBS_1.0 ... IBVERBS_1.n, same parents) and every public
#          symbol in its node, so binaries built against the real library
#          bind to the simulation unchanged;
#   STUBS: C source with a weak, aborting definition of every public symbol
#          (the simulation's real definitions override them) and one for
#          every compat twin such as ibv_reg_mr@IBVERBS_1.0.
# Generating both from the library on the build machine means a newer
# rdma-core (new nodes, new calls) still links, and a call the simulation
# does not emulate stops the test loudly instead of failing to resolve.
# IBVERBS_PRIVATE_* (the provider-plugin ABI) is exported too, as inert
# stubs: libraries that link a driver directly (libfabric links libefa)
# must still load, and the simulation accepts and ignores the drivers'
# registration (verbs_register_driver_*), so no driver code ever runs.
#
# Usage: gen-exports.sh TOOL LIBRARY MAP STUBS
#   TOOL is objdump or readelf (any path or cross prefix).

set -e
if [ $# -ne 4 ]; then
    echo "usage: $0 objdump|readelf LIBRARY MAP STUBS" >&2
    exit 2
fi
tool=$1 lib=$2 map=$3 stubs=$4

if [ ! -r "$lib" ]; then
    echo "$0: cannot read $lib" >&2
    exit 1
fi

# Normalise either tool's output to two kinds of lines:
#   DEF <node> <parent or ->
#   SYM <node> <name> default|compat
#   OBJ <node> <name> <size in bytes>
tmp="$map.tmp.$$"
trap 'rm -f "$tmp"' EXIT
case $(basename "$tool") in
*objdump*)
    {
        "$tool" -p "$lib" | awk '
            /^Version definitions:/ { on = 1; next }
            on && /^[^ \t]/ && NF == 0 { on = 0 }
            on && /^Version References:/ { on = 0 }
            on && $1 ~ /^[0-9]+$/ && NF >= 4 {
                if (node != "") print "DEF", node, parent
                node = ($2 == "0x01") ? "" : $4; parent = "-"; next
            }
            on && NF == 1 && node != "" { parent = $1 }
            END { if (node != "") print "DEF", node, parent }'
        "$tool" -T "$lib" | awk '
            function hex(s,    v, i) {   # mawk has no strtonum
                v = 0
                for (i = 1; i <= length(s); i++)
                    v = v * 16 + index("0123456789abcdef", tolower(substr(s, i, 1))) - 1
                return v
            }
            $2 ~ /^[gw]$/ && $3 == "DO" && $4 != "*UND*" && $4 != "*ABS*" && NF >= 7 {
                ver = $(NF - 1); gsub(/[()]/, "", ver)
                print "OBJ", ver, $NF, hex($5)
            }
            $2 ~ /^[gw]$/ && $3 == "DF" && $4 != "*UND*" && NF >= 7 {
                ver = $(NF - 1); name = $NF
                if (ver ~ /^\(.*\)$/) {
                    gsub(/[()]/, "", ver); print "SYM", ver, name, "compat"
                } else {
                    print "SYM", ver, name, "default"
                }
            }'
    } > "$tmp"
    ;;
*readelf*)
    {
        "$tool" -V "$lib" | awk '
            /Version definition section/ { on = 1; next }
            /Version needs section|Version symbols section/ { on = 0 }
            on && /Flags:/ {
                if (node != "") print "DEF", node, parent
                node = ($0 ~ /Flags: BASE/) ? "" : $NF; parent = "-"; next
            }
            on && /Parent 1:/ && node != "" { parent = $NF }
            END { if (node != "") print "DEF", node, parent }'
        "$tool" -W --dyn-syms "$lib" | awk '
            $4 == "OBJECT" && ($5 == "GLOBAL" || $5 == "WEAK") && $7 != "UND" && $7 != "ABS" {
                s = $8; sub(/@.*/, "", s); v = $8; sub(/^[^@]*@+/, "", v)
                print "OBJ", v, s, $3 + 0
            }
            $4 == "FUNC" && ($5 == "GLOBAL" || $5 == "WEAK") && $7 != "UND" {
                s = $8
                if (index(s, "@@")) {
                    split(s, p, "@@"); print "SYM", p[2], p[1], "default"
                } else if (index(s, "@")) {
                    split(s, p, "@"); print "SYM", p[2], p[1], "compat"
                }
            }'
    } > "$tmp"
    ;;
*)
    echo "$0: TOOL must be objdump or readelf, not $tool" >&2
    exit 1
    ;;
esac

if ! grep -q '^DEF IBVERBS_1\.' "$tmp" || ! grep -q '^SYM IBVERBS_1\.' "$tmp"; then
    echo "$0: found no IBVERBS_1.x versions in $lib" >&2
    exit 1
fi

awk -v map="$map" -v stubs="$stubs" -v lib="$lib" '
    $1 == "DEF" { order[++n] = $2; parent[$2] = $3; known[$2] = 1 }
    $1 == "OBJ" {
        if (!(($3) in seen)) { obj[++no] = $3; osize[no] = $4; seen[$3] = 1; syms[$2] = syms[$2] "\t\t" $3 ";\n" }
    }
    $1 == "SYM" {
        # Default versions are assigned by this script; compat twins get
        # theirs from .symver in the stubs (name@NODE) and must not be
        # listed, or ld would make the plain definition take that node.
        if ($4 == "default") {
            if (!(($3) in seen)) { def[++nd] = $3; seen[$3] = 1; syms[$2] = syms[$2] "\t\t" $3 ";\n" }
        } else { cname[++nc] = $3; cver[nc] = $2 }
    }
    END {
        print "/* Generated by gen-exports.sh from " lib "; do not edit. */" > map
        for (i = 1; i <= n; i++) {
            v = order[i]
            printf "%s {\n", v > map
            if (syms[v] != "") printf "\tglobal:\n%s", syms[v] > map
            # Not "local: *", which would also drop the compat twins; the
            # library is built with -fvisibility=hidden, and the only other
            # visible names are those of the compat stubs.
            if (i == 1) printf "\tlocal:\n\t\tvsim_*;\n" > map
            if (parent[v] != "-" && (parent[v] in known)) printf "} %s;\n", parent[v] > map
            else printf "};\n" > map
        }
        print "/* SPDX-License-Identifier: BSD-3-Clause */" > stubs
        print "/* Generated by gen-exports.sh from " lib "; do not edit. */" > stubs
        print "#include \"vsim_stubs.h\"" > stubs
        print "" > stubs
        # A driver registering itself (from its constructor) is accepted
        # and ignored, and so are the log lines of a driver library (libefa logs
        # "not an EFA device" when libfabric asks it about a simulated
        # one); every other call aborts loudly if ever made.
        for (i = 1; i <= nd; i++)
            printf "%s(%s)\n", def[i] ~ /^(verbs_register_driver_|__verbs_log$)/ ? "VSIM_NOOP_STUB" : "VSIM_WEAK_STUB",
                def[i] > stubs
        for (i = 1; i <= no; i++) printf "VSIM_DATA(%s, %d)\n", obj[i], osize[i] > stubs
        for (i = 1; i <= nc; i++) printf "VSIM_COMPAT_STUB(%s, %s, %d)\n", cname[i], cver[i], i > stubs
    }' "$tmp"
