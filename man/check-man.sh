#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# Checks the man pages: every page renders with groff without a single
# warning (and passes `mandoc -T lint` at warning level where mandoc is
# installed), every alias page (.so) points at a page that names it, and
# every public call of include/dchan.h has a page. Run by `make check`;
# pages are found through $srcdir, so it works in VPATH builds and in
# `make distcheck`. Exit 77 (skipped) when neither groff nor mandoc exists.

srcdir=${srcdir:-${0%/*}/..}
mandir=$srcdir/man
header=$srcdir/include/dchan.h
status=0

fail() {
    echo "FAIL: $*" >&2
    status=1
}

have() {
    command -v "$1" >/dev/null 2>&1
}

if ! have groff && ! have mandoc; then
    echo "SKIP: neither groff nor mandoc is installed" >&2
    exit 77
fi
if ! ls "$mandir"/*.[1-9] >/dev/null 2>&1; then
    fail "no pages in $mandir"
    exit 1
fi

# Pages are rendered from a scratch folder in which man1, man3 and man7
# point at the source folder, so that `.so man3/page.3` resolves as it
# does once installed.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dchan-man.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
trap 'exit 99' HUP INT TERM
abs_mandir=$(cd "$mandir" && pwd) || exit 99
for s in 1 3 7; do
    ln -s "$abs_mandir" "$tmp/man$s" || exit 99
done

for page in "$mandir"/*.[1-9]; do
    name=$(basename "$page")
    sec=${name##*.}
    first=$(sed -n 1p "$page")
    case $first in
    .so\ *)
        target=${first#.so }
        base=$(basename "$target")
        if [ ! -f "$mandir/$base" ]; then
            fail "$name: .so target $target does not exist"
            continue
        fi
        # The alias must be listed in the NAME section of its target.
        if ! sed -n '/^\.SH NAME/,/^\.SH/p' "$mandir/$base" |
            grep -Eq "(^|[ ,])${name%.*}([ ,]|\$)"; then
            fail "$name: not named in the NAME section of $base"
        fi
        ;;
    *)
        if ! grep -q "^\\.TH [A-Z0-9_]* $sec " "$page"; then
            fail "$name: .TH missing or not for section $sec"
        fi
        # Section 3 pages carry the sections of STYLE.md point 18.
        if [ "$sec" = 3 ]; then
            for sh in NAME SYNOPSIS DESCRIPTION 'RETURN VALUE' ERRORS \
                ENVIRONMENT 'SEE ALSO'; do
                grep -Eq "^\\.SH \"?$sh\"?\$" "$page" ||
                    fail "$name: no $sh section"
            done
        fi
        if have mandoc; then
            out=$(mandoc -T lint -W warning "$page" 2>&1)
            if [ $? -ne 0 ] || [ -n "$out" ]; then
                fail "$name: mandoc -T lint:"
                printf '%s\n' "$out" >&2
            fi
        fi
        ;;
    esac
    if have groff; then
        out=$(cd "$tmp" && groff -man -t -ww -z -Tutf8 "man$sec/$name" 2>&1)
        if [ $? -ne 0 ] || [ -n "$out" ]; then
            fail "$name: groff warnings:"
            printf '%s\n' "$out" >&2
        fi
    fi
done

# Every public call has a page (STYLE.md point 18).
if [ -f "$header" ]; then
    for fn in $(sed -n 's/^DCHAN_API [^(]*[ *]\(dchan_[a-z0-9_]*\)(.*/\1/p' "$header"); do
        [ -f "$mandir/$fn.3" ] || fail "$fn (include/dchan.h) has no page man/$fn.3"
    done
else
    fail "cannot read $header"
fi

[ $status -eq 0 ] && echo "man pages: all clean"
exit $status
