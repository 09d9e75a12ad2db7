#!/usr/bin/env bash
# Configures and builds Kiln into build/ (CUDA on when nvcc is found). Arguments starting with '-'
# go to cmake's configure step; the others name targets to build (default: everything), e.g.
#   bash tools/build.sh kiln_cli          # the `kiln` command and the library only
# The same build/ serves both: a later plain `bash tools/build.sh` adds the tests and benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
BUILD_DIR=${BUILD_DIR:-build}
cmake_args=()
targets=()
for arg in "$@"; do
  case "$arg" in
    -*) cmake_args+=("$arg") ;;
    *) targets+=(--target "$arg") ;;
  esac
done
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "${cmake_args[@]}"
cmake --build "$BUILD_DIR" --parallel "${JOBS:-$(nproc)}" "${targets[@]}"
