#!/usr/bin/env bash
# Builds Kiln and runs every test: the GoogleTest suite (CTest), then the tests that need an
# installed Kiln or several processes (see tests/CMakeLists.txt and tests/integration/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure --parallel "$(nproc)" --timeout 900
echo "tools/test.sh: all tests passed"
