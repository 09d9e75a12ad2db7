#!/usr/bin/env bash
# Builds Kiln and runs every test through CTest: the GoogleTest suites, the CLI tests (exit status
# and output), the multi-process tests under mpirun, the extension build and the network
# integration tests (tests/integration/). Prints how many tests passed, failed and were skipped,
# and each skip with its reason; with CI=true a skip that CI's machine should not need
# (tests/ci_allowed_skips.txt: only the GPU ones) fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
bash tools/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$BUILD_DIR/gtest-xml"
rc=0
ctest --test-dir "$BUILD_DIR" --output-on-failure --parallel "$(nproc)" --timeout 900 \
  --output-junit ctest-junit.xml "$@" || rc=$?
ci=()
[ "${CI:-}" = true ] && ci=(--ci)
python3 tools/test_summary.py "$BUILD_DIR/ctest-junit.xml" "${ci[@]}" || rc=1
[ "$rc" -eq 0 ] || { echo "tools/test.sh: FAILED"; exit 1; }
echo "tools/test.sh: all tests passed"
