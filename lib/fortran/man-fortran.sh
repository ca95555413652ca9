#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# Keeps the Fortran parts of the man pages in step with the module:
#   - the ".SS Fortran" part of the SYNOPSIS of every man/*.3 page (not the
#     .so aliases) is what lib/fortran/gen-fortran.awk prints for the calls,
#     callback types and structures of the page's C synopsis, in that order,
#     followed by the build line below;
#   - the Fortran example of dchan.7 is lib/fortran/tests/f_pingpong.f90
#     (less its SPDX line), which make check builds and runs.
#
#   man-fortran.sh            check, as make check runs it (exit 1, with a
#                             diff, if a page is out of step)
#   man-fortran.sh --update   rewrite those parts of the pages in
#                             $srcdir/man (after a change to dchan.h)
#
# Pages and sources are found through $srcdir (set by make check), so the
# check works in VPATH builds and in make distcheck.

srcdir=${srcdir:-$(dirname "$0")/../..}
AWK=${AWK:-awk}
mode=check
case $1 in
'') ;;
--update) mode=update ;;
*) echo "usage: $0 [--update]" >&2; exit 99 ;;
esac

mandir=$srcdir/man
header=$srcdir/include/dchan.h
gen=$srcdir/lib/fortran/gen-fortran.awk
example=$srcdir/lib/fortran/tests/f_pingpong.f90
for f in "$header" "$gen" "$example" "$mandir/dchan.7"; do
    [ -f "$f" ] || { echo "man-fortran: cannot read $f" >&2; exit 99; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dchan-manf.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
trap 'exit 99' HUP INT TERM
status=0

# The names a page's C synopsis declares, in order: calls "dchan_x(",
# callback types "(*dchan_x)", structures "} dchan_x_t;".
c_names() {
    sed -n '/^\.SH SYNOPSIS/,/^\.S[HS] /p' "$1" | sed '1d;$d' | "$AWK" '
    {
        line = $0
        while (match(line, /\(\*dchan_[a-z0-9_]+\)|dchan_[a-z0-9_]+\(|} dchan_[a-z0-9_]+_t;/)) {
            tok = substr(line, RSTART, RLENGTH)
            line = substr(line, RSTART + RLENGTH)
            gsub(/[(*)};]/, "", tok)
            sub(/^ /, "", tok)
            if (!(tok in seen))
                printf "%s%s", (n++ ? " " : ""), tok
            seen[tok] = 1
        }
    }'
}

# What the Fortran part of a page must be.
expected() {
    echo ".SS Fortran"
    "$AWK" -f "$gen" -v mode=man -v names="$1" "$header" || return 1
    cat <<'EOF'
.PP
Compile with
.I "$(pkg\-config \-\-variable=fflags dchan)"
and link with
.IR "$(pkg\-config \-\-libs dchan) $(pkg\-config \-\-variable=flibs dchan)" ;
see
.B Fortran
in
.BR dchan (7).
EOF
}

# The Fortran part of a page: from ".SS Fortran" to the next .SH.
actual() {
    "$AWK" '/^\.SS Fortran$/ { on = 1 } on && /^\.SH / { exit } on { print }' "$1"
}

# The page with its Fortran part replaced by the file $2, or inserted at the
# end of the SYNOPSIS.
replace() {
    "$AWK" -v part="$2" '
    function put(   l) {
        while ((getline l < part) > 0)
            print l
        done = 1
    }
    /^\.SH SYNOPSIS/ { syn = 1 }
    /^\.SS Fortran$/ && syn { skip = 1; put(); next }
    /^\.SH / && !/^\.SH SYNOPSIS/ {
        if (syn && !done)
            put()
        syn = 0
        skip = 0
    }
    !skip { print }' "$1"
}

for page in "$mandir"/*.3; do
    name=$(basename "$page")
    case $(sed -n 1p "$page") in .so\ *) continue ;; esac
    names=$(c_names "$page")
    if [ -z "$names" ]; then
        echo "man-fortran: $name: no call in the C synopsis" >&2
        status=1
        continue
    fi
    expected "$names" > "$tmp/want" || { status=1; continue; }
    if [ $mode = update ]; then
        replace "$page" "$tmp/want" > "$tmp/page" && cat "$tmp/page" > "$page" || status=1
    else
        actual "$page" > "$tmp/have"
        if ! cmp -s "$tmp/want" "$tmp/have"; then
            echo "man-fortran: $name: the Fortran synopsis differs from the module (lib/fortran/man-fortran.sh --update):" >&2
            diff -u "$tmp/have" "$tmp/want" >&2
            status=1
        fi
    fi
done

# dchan.7: the .EX block after the marker comment is the example, escaped
# for roff (\e for backslash, \- for minus, \(aq for the apostrophe). The
# marker reaches awk through the environment, which keeps its backslash.
marker='.\" Fortran example: lib/fortran/tests/f_pingpong.f90 (man-fortran.sh --update)'
sed 1d "$example" | sed -e 's/\\/\\e/g' -e 's/-/\\-/g' -e "s/'/\\\\(aq/g" > "$tmp/ex-want"
if ! grep -qxF "$marker" "$mandir/dchan.7"; then
    echo "man-fortran: dchan.7: no line '$marker' before the Fortran example" >&2
    status=1
elif [ $mode = update ]; then
    MARKER=$marker "$AWK" -v ex="$tmp/ex-want" '
    $0 == ENVIRON["MARKER"] { print; mark = 1; next }
    mark && /^\.EX$/ { print; while ((getline l < ex) > 0) print l; skip = 1; next }
    skip && /^\.EE$/ { skip = 0; mark = 0 }
    !skip { print }' "$mandir/dchan.7" > "$tmp/page" && cat "$tmp/page" > "$mandir/dchan.7" || status=1
else
    MARKER=$marker "$AWK" '
    $0 == ENVIRON["MARKER"] { mark = 1; next }
    mark && /^\.EX$/ { on = 1; next }
    on && /^\.EE$/ { exit }
    on { print }' "$mandir/dchan.7" > "$tmp/ex-have"
    if ! cmp -s "$tmp/ex-want" "$tmp/ex-have"; then
        echo "man-fortran: dchan.7: the Fortran example differs from $example (man-fortran.sh --update):" >&2
        diff -u "$tmp/ex-have" "$tmp/ex-want" >&2
        status=1
    fi
fi

[ $status -eq 0 ] && echo "man-fortran: the Fortran synopses and example match the module"
exit $status
