#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The shared library exports exactly the calls that include/dchan.h declares
# with DCHAN_API, each with the library's symbol version, and nothing else.
set -e
lib=${top_builddir:-.}/lib/.libs/libdchan.so
hdr=${srcdir:-.}/include/dchan.h
[ -f "$lib" ] || { echo "abi-check: $lib not built" >&2; exit 99; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Declared: the identifier before "(" on each DCHAN_API line.
sed -n 's/^DCHAN_API[^(]*[ *]\([a-z_0-9]*\)(.*/\1/p' "$hdr" | sort -u > "$tmp/declared"
# Exported: defined dynamic symbols with a version.
nm -D --defined-only "$lib" | awk '$2 ~ /^[TtDdBbRr]$/ {print $3}' | grep -v '^DCHAN_' \
    | sed 's/@.*//' | sort -u > "$tmp/exported"
nm -D --defined-only "$lib" | awk '$2 == "T" && $3 !~ /@@DCHAN_0$/ {print "unversioned: " $3}' \
    > "$tmp/unversioned"
status=0
if ! diff -u "$tmp/declared" "$tmp/exported"; then
    echo "abi-check: exported symbols differ from the DCHAN_API declarations (- declared, + exported)" >&2
    status=1
fi
if [ -s "$tmp/unversioned" ]; then
    cat "$tmp/unversioned" >&2
    status=1
fi
n=$(wc -l < "$tmp/declared")
[ "$n" -ge 20 ] || { echo "abi-check: only $n declarations found in $hdr" >&2; status=1; }
[ $status -eq 0 ] && echo "abi-check: $n public calls, all exported with version DCHAN_0, nothing else"
exit $status
