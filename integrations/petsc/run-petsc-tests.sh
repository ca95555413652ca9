#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# PETSc's own SF tests, run with the dchan SF type. For every example of
# PETSc's src/vec/is/sf/tests (C and Fortran) it reads the /*TEST ... TEST*/
# block the way PETSc's harness does (test:, testset: with nested test:,
# suffix, nsize, args, output_file, filter, requires, diff_args, {{a b}}
# and {{a b}separate output} expansions), compiles the example once, runs
# every case this build can run with
#     -dll_append <build>/integrations/petsc/.libs/libdchan_petsc.so -sf_type dchan
# added, and compares with the expected output PETSc ships. Lines that
# name the SF type differ by design ("type: dchan", and the basic type's
# "MultiSF sort=" line): they are normalised on both sides. Where the
# shipped output does not match PETSc's own basic type on this machine
# either (outputs of another SF type, MPI-dependent text), the case is
# compared with the same case run with -sf_type basic instead. Then the
# C test of our own, and KSP tutorial ex45 on a DMDA with basic and dchan
# on 1, 2 and 4 ranks (same iterations and residual norms).
#
# Environment (set by the generated wrapper, petsc-sf-tests.sh): MPIRUN,
# MPICC, MPIFC, PETSC_CPPFLAGS, PETSC_LIBS, TOP_BUILDDIR, TOP_SRCDIR.
# Optional: PETSC_EXAMPLES (default Debian's), DCHAN_PETSC_MAXNP (largest
# nsize run, default 8: the 7-rank cases oversubscribe small machines but
# take seconds), DCHAN_PETSC_ONLY (a pattern of case names).
# Exit 0 when every case that ran passed, 77 when nothing could run.

: "${PETSC_EXAMPLES:=/usr/share/petsc/3.18/share/petsc/examples}"
: "${DCHAN_PETSC_MAXNP:=8}"
: "${DCHAN_PETSC_ONLY:=}"
: "${MPIRUN:=mpirun}"
: "${MPICC:=mpicc}"
: "${MPIFC:=mpifort}"
sfdir=$PETSC_EXAMPLES/src/vec/is/sf/tests
kspdir=$PETSC_EXAMPLES/src/ksp/ksp/tutorials
lib=$TOP_BUILDDIR/integrations/petsc/.libs/libdchan_petsc.so
work=$TOP_BUILDDIR/integrations/petsc/petsc-tests
conf=$(echo "$PETSC_CPPFLAGS" | tr ' ' '\n' | sed -n 's/^-I//p' | while read -r d; do
    [ -f "$d/petscconf.h" ] && echo "$d/petscconf.h" && break; done)

if [ ! -d "$sfdir" ]; then
    echo "SKIP: PETSc's SF tests are not installed ($sfdir; Debian: libpetsc3.18-dev-examples)"
    exit 77
fi
if [ ! -f "$lib" ]; then
    echo "ERROR: $lib is missing (build first)" >&2
    exit 99
fi
mkdir -p "$work" || exit 99

OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# MPI on shared memory and TCP, as the other multi-process tests.
OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=cma
OMPI_MCA_mtl=^ofi OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMPI_MCA_btl OMPI_MCA_pml
export OMPI_MCA_btl_vader_single_copy_mechanism OMPI_MCA_mtl OMPI_MCA_rmaps_base_oversubscribe
# MPI's plugins stay loaded until exit, so that sanitizer reports name them.
OMPI_MCA_mca_base_component_disable_dlclose=1
export OMPI_MCA_mca_base_component_disable_dlclose

us=$(printf '\037')
ran=0 passed=0 skipped=0 failed=0
failures=
skips=$work/skips.txt
: >"$skips"

skip() { # name reason
    skipped=$((skipped + 1))
    echo "SKIP: $1: $2"
    echo "$2" >>"$skips"
}

# Runs one program under mpirun with a session directory of its own
# (concurrent mpiruns race on a shared one); a timeout keeps a hang from
# stalling make check. It detects hangs, it is no time limit: as generous
# as tests/mprun's, for a loaded 2-core machine.
mprun() { # np exe args...
    np=$1
    shift
    t=$(mktemp -d "${TMPDIR:-/tmp}/dchan-petsc.XXXXXX") || return 99
    TMPDIR=$t timeout -k 10 "${MPRUN_TIMEOUT:-600}" "$MPIRUN" -np "$np" --oversubscribe "$@" </dev/null
    rc=$?
    rm -rf "$t"
    return $rc
}

# requires: tokens this PETSc build does or does not have.
have_conf() {
    [ -n "$conf" ] && grep -q "^#define $1 " "$conf"
}
requires_ok() { # tokens...; sets why
    why=
    for tok in "$@"; do
        neg=
        case $tok in !*) neg=1 tok=${tok#!} ;; esac
        case $tok in
        defined\(*\)) m=${tok#defined(}; m=${m%)}; have_conf "$m" && h=1 || h= ;;
        double) have_conf PETSC_USE_REAL_DOUBLE && h=1 || h= ;;
        single) have_conf PETSC_USE_REAL_SINGLE && h=1 || h= ;;
        complex) have_conf PETSC_USE_COMPLEX && h=1 || h= ;;
        *) u=$(echo "$tok" | tr 'a-z' 'A-Z'); have_conf "PETSC_HAVE_$u" && h=1 || h= ;;
        esac
        if [ -n "$neg" ] && [ -n "$h" ]; then why="requires !$tok"; return 1; fi
        if [ -z "$neg" ] && [ -z "$h" ]; then why="requires $tok (not in this PETSc build)"; return 1; fi
    done
    return 0
}

# The test blocks, flattened to one case per line:
#   name nsize args output filter requires diff_args todo
# separated by the ASCII unit separator (filters contain "|").
# with {{...}} expanded (separate output ones name the output file).
cases() { # file exname
    sed -e 's/^!//' "$1" | awk -v ex="$2" -v US="$us" '
    function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
    function emit(b,    p, suf, args, ns, of, fi, rq, da, todo) {
        p = parent[b]
        suf = key[b, "suffix"]
        if (p != "" && key[p, "suffix"] != "") suf = (suf != "") ? key[p, "suffix"] "_" suf : key[p, "suffix"]
        args = trim(key[p, "args"] " " key[b, "args"])
        ns = key[b, "nsize"]; if (ns == "") ns = key[p, "nsize"]; if (ns == "") ns = 1
        of = key[b, "output_file"]; if (of == "") of = key[p, "output_file"]
        fi = key[b, "filter"]; if (fi == "") fi = key[p, "filter"]
        rq = trim(buildreq " " key[p, "requires"] " " key[b, "requires"])
        da = trim(key[p, "diff_args"] " " key[b, "diff_args"])
        todo = key[b, "TODO"] key[p, "TODO"]
        expand(ex "_" (suf == "" ? "1" : suf), ns, args, of, fi, rq, da, todo, "")
    }
    # Expands the first {{...}} of nsize, then of args, recursively.
    function expand(name, ns, args, of, fi, rq, da, todo, osuf,    s, inner, sep, vals, n, i, pre, post, opt, w, nw) {
        if (match(ns, /\{\{[^}]*\}[^}]*\}/)) {
            s = substr(ns, RSTART, RLENGTH); inner = s; sub(/^\{\{/, "", inner); sep = (inner ~ /\}separate output\}$/)
            sub(/\}.*$/, "", inner); n = split(inner, vals, " ")
            for (i = 1; i <= n; i++)
                expand(name, vals[i], args, of, fi, rq, da, todo, osuf (sep ? "_nsize-" vals[i] : ""))
            return
        }
        if (match(args, /\{\{[^}]*\}[^}]*\}/)) {
            s = substr(args, RSTART, RLENGTH); pre = substr(args, 1, RSTART - 1); post = substr(args, RSTART + RLENGTH)
            inner = s; sub(/^\{\{/, "", inner); sep = (inner ~ /\}separate output\}$/)
            sub(/\}.*$/, "", inner); n = split(inner, vals, " ")
            nw = split(trim(pre), w, " "); opt = w[nw]; sub(/^-+/, "", opt)
            for (i = 1; i <= n; i++)
                expand(name, ns, pre vals[i] post, of, fi, rq, da, todo, osuf (sep ? "_" opt "-" vals[i] : ""))
            return
        }
        if (of == "") of = "output/" name osuf ".out"
        print name osuf US ns US args US of US fi US rq US da US todo
    }
    function close_to(ind,    b) {
        while (depth > 0 && bind[depth] >= ind) {
            b = blk[depth]
            if (kind[b] == "test" || (kind[b] == "testset" && !kids[b])) emit(b)
            depth--
        }
    }
    /\/\*TEST/ { intest = 1; depth = 0; nb = 0; buildreq = ""; next }
    /TEST\*\// { if (intest) close_to(-1); intest = 0; next }
    !intest { next }
    {
        line = $0
        if (line ~ /^[ \t]*#/ || line ~ /^[ \t]*$/) next
        match(line, /^[ \t]*/); ind = RLENGTH
        t = trim(line)
        k = t; sub(/:.*$/, "", k)
        v = t; if (index(v, ":")) v = substr(v, index(v, ":") + 1); else v = ""
        v = trim(v)
        if (k == "test" || k == "testset" || k == "build") {
            close_to(ind)
            nb++; b = nb; kind[b] = k; parent[b] = ""
            if (depth > 0 && kind[blk[depth]] == "testset") { parent[b] = blk[depth]; kids[blk[depth]] = 1 }
            depth++; blk[depth] = b; bind[depth] = ind
            next
        }
        if (depth == 0) next
        b = blk[depth]
        if (kind[b] == "build") { if (k == "requires") buildreq = buildreq " " v; next }
        key[b, k] = v
    }'
}

# Output as compared: the SF type names and the basic type's own view
# line normalised, dchan's view lines dropped.
normalise() {
    sed -e 's/type: dchan/type: basic/' -e 's/type dchan/type basic/' -e '/^ *dchan: /d' -e '/MultiSF sort=/d'
}

# Numbers equal to a relative 1e-6 (PETSc's petscdiff tolerates small
# floating-point differences unless diff_args has -j).
numeq() { # a b
    awk -v A="$1" -v B="$2" 'BEGIN {
        while ((getline la < A) > 0) {
            if ((getline lb < B) <= 0) exit 1
            na = split(la, x, /[ \t,;()=\[\]]+/); nb = split(lb, y, /[ \t,;()=\[\]]+/)
            if (na != nb) exit 1
            for (i = 1; i <= na; i++) {
                if (x[i] == y[i]) continue
                if (x[i] !~ /^[-+]?[0-9.]+([eE][-+]?[0-9]+)?$/ || y[i] !~ /^[-+]?[0-9.]+([eE][-+]?[0-9]+)?$/) exit 1
                d = x[i] - y[i]; if (d < 0) d = -d
                m = x[i] < 0 ? -x[i] : x[i]; if (m < 1e-12) m = 1e-12
                if (d / m > 1e-6 && d > 1e-12) exit 1
            }
        }
        if ((getline lb < B) > 0) exit 1
        exit 0 }'
}

same() { # diff_args a b
    cmp -s "$2" "$3" && return 0
    case " $1 " in *" -j "*) return 1 ;; esac
    numeq "$2" "$3"
}

build_example() { # source exe
    [ -x "$2" ] && [ "$2" -nt "$1" ] && return 0
    case $1 in
    *.F90) "$MPIFC" -cpp -ffree-line-length-0 -O1 -w $PETSC_CPPFLAGS -o "$2" "$1" $PETSC_LIBS -lm ;;
    *) "$MPICC" -O1 -w $PETSC_CPPFLAGS -o "$2" "$1" $PETSC_LIBS -lm ;;
    esac
}

run_case() { # exe np args filter output-file
    out=$1.run
    # shellcheck disable=SC2086
    mprun "$2" "$1" $3 >"$out.raw" 2>&1
    rc=$?
    if [ -n "$4" ]; then
        sh -c "$4" <"$out.raw" >"$out" 2>/dev/null
    else
        cp "$out.raw" "$out"
    fi
    normalise <"$out" >"$5"
    return $rc
}

# A sanitizer build instruments the library; PETSc's examples, compiled
# here without the sanitizer, cannot load it. Then only our own test runs
# (it links the sanitizer runtime), with PETSc's and MPI's lifetime
# allocations left out of the leak report.
sanitized=
if nm -D "$lib" 2>/dev/null | grep -q '__asan_init\|__tsan_init'; then
    sanitized=1
    printf '%s\n' leak:libpetsc leak:libmpi.so leak:mca_ leak:libopen-pal.so leak:libopen-rte.so \
        leak:libpmix.so leak:libhwloc.so leak:libevent leak:libfabric.so leak:libucs.so leak:libucp.so \
        leak:libibverbs.so leak:libnl leak:libgfortran leak:libscalapack leak:libHYPRE >"$work/lsan.supp"
    LSAN_OPTIONS="suppressions=$work/lsan.supp:print_suppressions=0"
    export LSAN_OPTIONS
fi

t0=$(date +%s)
cd "$work" || exit 99
for src in "$sfdir"/ex*.c "$sfdir"/ex*.F90; do
    if [ -n "$sanitized" ]; then
        skip "$(basename "$src")" "sanitizer build: PETSc's examples are not instrumented and cannot load the library"
        continue
    fi
    [ -f "$src" ] || continue
    base=$(basename "$src")
    ex=${base%%.*}
    grep -q '/\*TEST' "$src" || continue
    cases "$src" "$ex" >"$ex.cases"
    built=
    while IFS=$us read -r name np args of filter req diffa todo; do
        if [ -n "$DCHAN_PETSC_ONLY" ]; then
            case $name in $DCHAN_PETSC_ONLY) ;; *) continue ;; esac
        fi
        if [ -n "$todo" ]; then skip "$name" "marked TODO by PETSc"; continue; fi
        # shellcheck disable=SC2086
        if ! requires_ok $req; then skip "$name" "$why"; continue; fi
        if [ "$np" -gt "$DCHAN_PETSC_MAXNP" ]; then skip "$name" "nsize $np > DCHAN_PETSC_MAXNP ($DCHAN_PETSC_MAXNP)"; continue; fi
        exp=$sfdir/$of
        if [ ! -f "$exp" ]; then skip "$name" "no expected output $of"; continue; fi
        if [ -z "$built" ]; then
            if ! build_example "$src" "./$ex" >"$ex.build.log" 2>&1; then
                cat "$ex.build.log"
                failed=$((failed + 1)); failures="$failures $ex(build)"
                break
            fi
            built=1
        fi
        ran=$((ran + 1))
        run_case "./$ex" "$np" "$args -dll_append $lib -sf_type dchan" "$filter" "$name.dchan"
        rc=$?
        ok=
        verdict=
        if [ $rc -eq 0 ]; then
            for e in "$exp" "${exp%.out}"_alt*.out; do
                [ -f "$e" ] || continue
                normalise <"$e" >"$name.expected"
                if same "$diffa" "$name.expected" "$name.dchan"; then ok=1 verdict="matches $(basename "$e")"; break; fi
            done
            if [ -z "$ok" ]; then
                # Does PETSc's own basic type match the shipped output here?
                run_case "./$ex" "$np" "$args -sf_type basic" "$filter" "$name.basic"
                if same "$diffa" "$name.basic" "$name.dchan"; then
                    if same "$diffa" "$name.expected" "$name.basic"; then
                        ok=1 verdict="matches"
                    else
                        ok=1 verdict="matches -sf_type basic (shipped output differs for basic too)"
                    fi
                fi
            fi
        fi
        if [ -z "$ok" ] && grep -q 'VecScatterRemap on SF type dchan is not supported' "./$ex.run.raw"; then
            # PETSc's own check (vscat.c) admits only the basic and
            # neighbor types here; its error path is what must happen.
            ran=$((ran - 1))
            skip "$name" "VecScatterRemap: PETSc 3.18 allows it only on SF types basic and neighbor (its error was raised, as it must)"
            continue
        fi
        if [ -n "$ok" ]; then
            passed=$((passed + 1))
            echo "PASS: $name (np $np) $verdict"
        else
            failed=$((failed + 1))
            failures="$failures $name"
            echo "FAIL: $name (np $np, exit $rc): $args"
            diff "$name.expected" "$name.dchan" | head -n 20
            tail -n 20 "./$ex.run.raw"
        fi
    done <"$ex.cases"
done
t1=$(date +%s)
echo "PETSc SF tests: $ran ran, $passed passed, $failed failed, $skipped skipped ($((t1 - t0)) s)"
if [ -s "$skips" ]; then
    echo "skipped, by reason:"
    sort "$skips" | uniq -c | sed 's/^/  /'
fi

# Our own test: every op and unit, in flight together, sub-communicators,
# PETSC_COMM_SELF, 2000 SFs created and destroyed; on shm (the default
# here, packing into the peer's slot), on the mpi provider (a send buffer
# and a copy), in SENTINEL mode and with depth 1.
own=$TOP_BUILDDIR/integrations/petsc/test_sfdchan
if [ -x "$own" ] && [ -z "$DCHAN_PETSC_ONLY" ]; then
    for variant in "1" "2" "3" "2 -sf_dchan_provider mpi" "2 -sf_dchan_detect sentinel" "3 -sf_dchan_depth 1"; do
        np=${variant%% *}
        opts=
        [ "$variant" = "$np" ] || opts=${variant#* }
        tag=$(echo "np$np$opts" | tr -c 'a-z0-9\n' '_')
        ran=$((ran + 1))
        # shellcheck disable=SC2086
        if mprun "$np" "$own" -sf_type dchan -sf_dchan_summary $opts >"own.$tag.log" 2>&1 &&
            grep -q '^test_sfdchan: OK' "own.$tag.log" &&
            grep -q '^  type: dchan' "own.$tag.log" &&
            { [ "$np" -eq 1 ] || grep -q '^  dchan: \[0\] provider [a-z]' "own.$tag.log"; }; then
            passed=$((passed + 1))
            echo "PASS: test_sfdchan np $np $opts: $(grep '^test_sfdchan: OK' "own.$tag.log")"
            grep '^  dchan: ' "own.$tag.log" | sed 's/^/    view:/'
        else
            failed=$((failed + 1)); failures="$failures test_sfdchan.$tag"
            echo "FAIL: test_sfdchan np $np $opts"
            tail -n 30 "own.$tag.log"
        fi
    done
fi

# KSP ex45 (DMDA, multigrid): the same iterations and residual norms with
# dchan as with basic, on 1, 2 and 4 ranks; at 4 ranks also PETSc's
# shipped output of that case.
if [ -n "$sanitized" ]; then
    skip ex45 "sanitizer build: PETSc's tutorials are not instrumented"
elif [ -f "$kspdir/ex45.c" ] && [ -z "$DCHAN_PETSC_ONLY" ]; then
    if build_example "$kspdir/ex45.c" ./ex45 >ex45.build.log 2>&1; then
        kargs="-ksp_monitor_short -da_grid_x 21 -da_grid_y 21 -da_grid_z 21 -pc_type mg -pc_mg_levels 3 -mg_levels_ksp_type richardson -mg_levels_ksp_max_it 1 -mg_levels_pc_type bjacobi -ksp_converged_reason"
        for np in 1 2 4; do
            ran=$((ran + 1))
            # shellcheck disable=SC2086
            mprun "$np" ./ex45 $kargs -sf_type basic >"ex45.np$np.basic" 2>&1
            rb=$?
            # shellcheck disable=SC2086
            mprun "$np" ./ex45 $kargs -dll_append "$lib" -sf_type dchan -sf_dchan_summary >"ex45.np$np.raw" 2>&1
            rd=$?
            grep -v '^dchan SF summary' "ex45.np$np.raw" >"ex45.np$np.dchan"
            summary=$(grep '^dchan SF summary' "ex45.np$np.raw")
            its=$(grep -c 'KSP Residual norm' "ex45.np$np.dchan")
            ok=
            if [ $rb -eq 0 ] && [ $rd -eq 0 ] && cmp -s "ex45.np$np.basic" "ex45.np$np.dchan" && [ "$its" -gt 0 ]; then
                ok=1
                # On more than one rank the scatters must really have used channels.
                if [ "$np" -gt 1 ] && ! echo "$summary" | grep -q ' [1-9][0-9]* bcasts'; then ok=; fi
                if [ "$np" -eq 4 ] && [ -f "$kspdir/output/ex45_2.out" ]; then
                    grep -v 'CONVERGED' "ex45.np$np.dchan" | cmp -s - "$kspdir/output/ex45_2.out" || ok=
                fi
            fi
            if [ -n "$ok" ]; then
                passed=$((passed + 1))
                echo "PASS: ksp ex45 np $np: $its residual norms identical to basic; $summary"
            else
                failed=$((failed + 1)); failures="$failures ex45.np$np"
                echo "FAIL: ksp ex45 np $np (basic exit $rb, dchan exit $rd)"
                diff "ex45.np$np.basic" "ex45.np$np.dchan" | head -n 20
                tail -n 20 "ex45.np$np.raw"
            fi
        done
    else
        cat ex45.build.log
        failed=$((failed + 1)); failures="$failures ex45(build)"
    fi
fi

t2=$(date +%s)
echo "total: $ran ran, $passed passed, $failed failed, $skipped skipped ($((t2 - t0)) s)"
[ $failed -eq 0 ] || { echo "failed:$failures"; exit 1; }
[ $ran -gt 0 ] || exit 77
exit 0
