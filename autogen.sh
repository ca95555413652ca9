#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Regenerate the build system from a git checkout (release tarballs do not need this).
set -e
cd "$(dirname "$0")"
mkdir -p m4 build-aux
autoreconf --force --install --warnings=all,no-portability
