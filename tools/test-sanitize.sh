#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer (the `sanitize` preset:
# Debug, KILN_CUDA=OFF). The two integration tests that rebuild or re-download everything
# (extension_example, cli.cifar10_flow) run in the normal suite only, to keep CI's time.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset sanitize > /dev/null
cmake --build build-asan --parallel "${JOBS:-$(nproc)}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
ctest --test-dir build-asan --output-on-failure --parallel "$(nproc)" --timeout 900 \
  -E "extension_example|cli.cifar10_flow"
echo "tools/test-sanitize.sh: all tests passed under ASan + UBSan"
