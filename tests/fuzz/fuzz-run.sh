#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Runs one libFuzzer target on its corpus (tests/fuzz/corpus-<name>, under
# the build directory) with the options given, keeps its output in
# tests/fuzz/<name>-fuzz.log (a crashing input in tests/fuzz/<name>-crash-*),
# and ends with one line: executions, coverage (libFuzzer's cov: and ft:),
# corpus, time. Fails when the target does.
#   tests/fuzz/fuzz-run.sh TARGET LIBFUZZER-OPTION...
t=$1
shift
name=$(basename "$t")
corpus=tests/fuzz/corpus-$name
log=tests/fuzz/$name-fuzz.log
mkdir -p "$corpus" || exit 1
start=$(date +%s)
# The status through the pipe: POSIX sh has no pipefail.
{ "$t" -print_final_stats=1 -artifact_prefix="tests/fuzz/$name-" "$@" "$corpus" 2>&1
  echo $? >"$log.rc"; } | tee "$log"
rc=$(cat "$log.rc")
rm -f "$log.rc"
secs=$(($(date +%s) - start))
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
ft=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1)
corp=$(grep -o 'corp: [0-9]*/[0-9]*[A-Za-z]*' "$log" | tail -n 1)
echo "fuzz: $name: ${execs:-?} executions in $secs s, ${cov:-cov: ?}, ${ft:-ft: ?}, ${corp:-corp: ?}, exit $rc"
exit "$rc"
