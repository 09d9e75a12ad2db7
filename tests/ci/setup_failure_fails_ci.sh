#!/usr/bin/env bash
# .ci/run must stop, non-zero and at once, when the set-up fails (under `set -e` a failure left of
# `&&` did not stop it: CI then passed on the sanitizer step alone). Stubs on PATH make every
# package look missing and apt-get fail; a stub cmake records whether any build step still ran.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
stubs=$(mktemp -d)
trap 'rm -rf "$stubs"' EXIT
printf '#!/bin/sh\nexit 1\n' > "$stubs/dpkg-query"
printf '#!/bin/sh\necho "E: stub apt-get: Unable to locate package" >&2\nexit 100\n' > "$stubs/apt-get"
printf '#!/bin/sh\necho ran >> "%s/build-ran"\nexit 1\n' "$stubs" > "$stubs/cmake"
printf '#!/bin/sh\nexec "$@"\n' > "$stubs/sudo"
chmod +x "$stubs"/*
start=$(date +%s)
PATH="$stubs:$PATH" timeout 120 bash "$root/.ci/run" > "$stubs/log" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
cat "$stubs/log"
[ "$rc" -ne 0 ] || { echo "FAIL: .ci/run exited 0 after a failed set-up"; exit 1; }
[ "$rc" -ne 124 ] || { echo "FAIL: .ci/run did not stop within 120 s"; exit 1; }
[ ! -e "$stubs/build-ran" ] || { echo "FAIL: a build step ran after the set-up failed"; exit 1; }
[ "$took" -le 60 ] || { echo "FAIL: .ci/run took ${took} s to fail"; exit 1; }
echo "PASS: .ci/run exited $rc within ${took} s of a failed set-up, running nothing after it"
